"""Observation encoders: an observation in its env dtype [..., *obs_shape] -> a feature vector [..., out_features].

``make_encoder`` is the one place that picks one (``model.encoder``); ``MLPPolicy`` and ``LSTMPolicy`` both call
it and put the existing tanh torso (``policies.layers.torso``) after it. Three kinds:

- ``mlp``: ``policies.layers.ObsInput``, the flatten the seeds' policies always had (uint8 scaled by 1/255). It
  has no parameters, so flat-observation policies keep exactly their parameter names and initialisation.
- ``cnn``: ``CNNEncoder``, 3x3 convolutions over an image or grid whose layout the env spec declares
  (``EnvSpec.image_layout``: chw [C, H, W], or hwc [H, W, C], permuted to chw inside ``forward``), then a linear layer.
- ``tokens``: ``TokenEncoder``, for an observation that is a padded list of sparse entries (``envs.base.TokenLayout``):
  each real row is embedded, the rows are mean-pooled with padding masked out (a DeepSets encoder).

``auto`` picks ``tokens`` for an env spec with a token layout, ``cnn`` for a spec that declares an image layout with
H, W >= 3 (the built-in gridworld and Connect Four declare chw, the Gymnasium and PettingZoo adapters hwc or chw by
the image convention), ``leaves`` (``policies.leaf_encoder.DictEncoder``: one encoder per leaf, features
concatenated) for a structured observation (``EnvSpec.obs_leaves``), else ``mlp`` (which, forced on a structured
observation, flattens the whole flat row). The encoder is shared by the actor and critic torsos (``model.shared_torso``
only decides the torsos after it). ``model.obs_norm`` adds running observation normalisation to the mlp and cnn
encoders (``policies.obs_normalization``); every encoder has ``obs_norm`` (None when off) and ``out_features``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from configs.loader import ConfigError
from configs.schema import MODEL_ENCODERS, ModelSection
from envs.base import EnvSpec
from policies.layers import ObsInput, layer, obs_scale
from policies.leaf_encoder import DictEncoder
from policies.obs_normalization import ObsNormalizer

KERNEL = 3
"""Side of every conv kernel of the cnn encoder."""
STRIDE_ABOVE_SIDE = 32
"""A conv layer whose input is larger than this on both sides steps 2 pixels at a time: large images (Atari's 84 x 84,
a rendered screen) are downsampled instead of carried at full size into a huge flatten and linear layer; boards and
egocentric windows up to this size keep every pixel."""


def image_shape(spec: EnvSpec) -> tuple[int, int, int] | None:
    """(C, H, W) of an observation whose spec declares an image layout (chw or hwc); None when it declares none."""
    if spec.image_layout == "chw":
        channels, height, width = spec.obs_shape
        return channels, height, width
    if spec.image_layout == "hwc":
        height, width, channels = spec.obs_shape
        return channels, height, width
    return None


def is_grid(spec: EnvSpec) -> bool:
    """Whether the spec declares an image layout with H, W >= 3 (what the cnn encoder reads)."""
    shape = image_shape(spec)
    return shape is not None and shape[1] >= KERNEL and shape[2] >= KERNEL


def encoder_kind(spec: EnvSpec, model: ModelSection) -> str:
    """``model.encoder`` resolved for this env: mlp, cnn, tokens or leaves (a structured observation's per-leaf
    encoders); ConfigError when the env cannot take it."""
    choice = model.encoder
    if choice not in MODEL_ENCODERS:
        raise ConfigError(f"model.encoder: {choice!r} is not allowed; allowed: {', '.join(MODEL_ENCODERS)}")
    if spec.obs_leaves and choice in ("cnn", "tokens"):
        raise ConfigError(f"model.encoder: {choice!r} reads one image or token list, but the env's observation is "
                          f"structured (leaves {', '.join(leaf.name for leaf in spec.obs_leaves)}); allowed here: "
                          f"auto (one encoder per leaf: cnn for image leaves, tokens for declared token leaves), mlp "
                          f"(flatten everything)")
    if choice == "auto":
        if spec.obs_leaves:
            return "leaves"
        if spec.tokens is not None:
            return "tokens"
        return "cnn" if is_grid(spec) else "mlp"
    if choice == "cnn" and not is_grid(spec):
        raise ConfigError(f"model.encoder: 'cnn' needs an image or grid observation with H, W >= {KERNEL} whose env "
                          f"spec declares its layout (EnvSpec.image_layout 'chw' or 'hwc'); the env's obs_shape is "
                          f"{list(spec.obs_shape)} with image_layout {spec.image_layout!r} (declare image_layout in "
                          f"the env's spec if it is an image); allowed here: auto, mlp"
                          f"{', tokens' if spec.tokens is not None else ''}")
    if choice == "tokens" and spec.tokens is None:
        raise ConfigError(f"model.encoder: 'tokens' needs an env whose spec declares a token layout (EnvSpec.tokens); "
                          f"the env's obs_shape is {list(spec.obs_shape)} with no token layout; allowed here: auto, "
                          f"mlp{', cnn' if is_grid(spec) else ''}")
    return choice


def check_obs_norm(kind: str, model: ModelSection) -> None:
    """ConfigError when ``model.obs_norm`` is on for the tokens encoder (its inputs are ids, not features)."""
    if model.obs_norm and kind == "tokens":
        raise ConfigError("model.obs_norm: true does not apply to the tokens encoder (token rows are ids and values, "
                          "not features to normalise); allowed with tokens: false (or model.encoder: mlp)")


def make_encoder(spec: EnvSpec, model: ModelSection) -> ObsInput | CNNEncoder | TokenEncoder | DictEncoder:
    """The encoder ``model.encoder`` names for this env (auto resolved from the spec)."""
    kind = encoder_kind(spec, model)
    check_obs_norm(kind, model)
    if kind == "leaves":
        return DictEncoder(spec, model, box_encoder=make_encoder)
    if kind == "cnn":
        return CNNEncoder(spec, model)
    if kind == "tokens":
        return TokenEncoder(spec, model)
    return ObsInput(spec, obs_norm=model.obs_norm)


def conv_padding(height: int, width: int) -> int:
    """Zero padding of the next 3x3 conv: 0 (the map shrinks by 2) while both sides are >= 3, else 1 (it keeps)."""
    return 0 if min(height, width) >= KERNEL else 1


def conv_stride(height: int, width: int) -> int:
    """Stride of the next 3x3 conv: 2 while both sides exceed STRIDE_ABOVE_SIDE, else 1."""
    return 2 if min(height, width) > STRIDE_ABOVE_SIDE else 1


def conv_output_side(side: int, padding: int, stride: int = 1) -> int:
    """Side of a 3x3 conv's output: (side + 2 * padding - kernel) // stride + 1."""
    return (side + 2 * padding - KERNEL) // stride + 1


class CNNEncoder(nn.Module):
    """[..., C, H, W] (or [..., H, W, C]) -> ``model.cnn_channels`` 3x3 conv + ReLU layers -> flatten -> linear + ReLU
    [..., hidden_size]. A layer steps 2 pixels at a time where its input exceeds STRIDE_ABOVE_SIDE on both sides.

    hwc observations are permuted to chw first, so both layouts share one conv stack; uint8 observations are scaled
    by 1/255; with ``model.obs_norm`` the images are normalised per channel. Weights orthogonal with gain sqrt 2 and
    zero biases (like ``policies.layers.layer``).
    """

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        shape = image_shape(spec)
        if shape is None:
            raise ValueError("CNNEncoder needs an EnvSpec that declares an image layout (EnvSpec.image_layout)")
        self.obs_shape = tuple(spec.obs_shape)
        self.channels_last = spec.image_layout == "hwc"
        """Observations are [H, W, C] (permuted to [C, H, W] before the convolutions)."""
        self.obs_scale = obs_scale(spec.obs_dtype)
        channels, height, width = shape
        self.obs_norm = ObsNormalizer(channels, spatial_dims=2) if model.obs_norm else None
        """Running per-channel observation normalisation (model.obs_norm; None when off)."""
        layers: list[nn.Module] = []
        for out_channels in model.cnn_channels:
            padding, stride = conv_padding(height, width), conv_stride(height, width)
            conv = nn.Conv2d(channels, out_channels, KERNEL, stride=stride, padding=padding)
            nn.init.orthogonal_(conv.weight, math.sqrt(2))
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            channels = out_channels
            height, width = conv_output_side(height, padding, stride), conv_output_side(width, padding, stride)
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.conv_output_shape = (channels, height, width)
        """Shape of the last conv layer's output for one observation."""
        self.linear = layer(channels * height * width, model.hidden_size, math.sqrt(2))
        self.out_features = model.hidden_size
        """Features per observation."""

    def input_features(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., *obs_shape] in its env dtype -> float32 images [N, C, H, W] (what obs_norm's statistics are of)."""
        images = obs.reshape(-1, *self.obs_shape)
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return images.to(torch.float32) * self.obs_scale

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., *obs_shape] in its env dtype -> features [..., hidden_size]."""
        lead = obs.shape[: obs.dim() - 3]
        images = self.input_features(obs)
        if self.obs_norm is not None:
            images = self.obs_norm(images)
        features = torch.relu(self.linear(self.conv(images)))
        return features.reshape(*lead, self.out_features)


def masked_mean(entries: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mean of ``entries`` [..., L, W] over the rows where ``real`` [..., L] is True; zeros where none is."""
    kept = torch.where(real.unsqueeze(-1), entries, torch.zeros((), dtype=entries.dtype, device=entries.device))
    count = real.sum(dim=-1, keepdim=True).clamp(min=1).to(entries.dtype)
    return kept.sum(dim=-2) / count


class TokenEncoder(nn.Module):
    """[..., L, 3] rows of (location, feature id, value) -> [..., hidden_size], padding rows masked out.

    A row is padding when its location is ``spec.tokens.pad_value`` (its other columns are never read). Each real
    row becomes ``e = E_loc[location] + E_feat[feature] + value * E_val[feature]`` (value scaled like any
    observation: uint8 by 1/255), then ``relu(W_entry e)``; the rows' masked mean goes through
    ``relu(W_out .)``. An observation with no real row pools to zeros, so its features are zeros.
    Embeddings are N(0, 1/hidden_size) (each vector has norm about 1); linear layers as ``policies.layers.layer``.
    """

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        if spec.tokens is None:
            raise ValueError("TokenEncoder needs an EnvSpec with a token layout (EnvSpec.tokens)")
        width = model.hidden_size
        self.pad_value = spec.tokens.pad_value
        self.value_scale = obs_scale(spec.obs_dtype)
        self.location = nn.Embedding(spec.tokens.num_locations, width)
        self.feature = nn.Embedding(spec.tokens.num_features, width)
        self.feature_value = nn.Embedding(spec.tokens.num_features, width)
        for embedding in (self.location, self.feature, self.feature_value):
            nn.init.normal_(embedding.weight, std=1.0 / math.sqrt(width))
        self.entry = layer(width, width, math.sqrt(2))
        self.output = layer(width, width, math.sqrt(2))
        self.obs_norm = None
        """Observation normalisation does not apply to token rows (model.obs_norm must be off)."""
        self.out_features = width
        """Features per observation."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., L, 3] in its (integer) env dtype -> features [..., hidden_size]."""
        rows = obs.to(torch.int64)
        location, feature, value = rows.unbind(dim=-1)
        real = location != self.pad_value
        zero = torch.zeros((), dtype=torch.int64, device=obs.device)
        location, feature = torch.where(real, location, zero), torch.where(real, feature, zero)
        value = torch.where(real, value, zero).to(torch.float32) * self.value_scale
        embedded = (self.location(location) + self.feature(feature)
                    + value.unsqueeze(-1) * self.feature_value(feature))
        entries = torch.relu(self.entry(embedded))
        return torch.relu(self.output(masked_mean(entries, real)))
