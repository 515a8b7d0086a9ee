"""Building blocks shared by the policies: orthogonal linear layers, the tanh torso, and the observation input."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from configs.schema import ModelSection
from envs.base import EnvSpec
from policies.obs_normalization import ObsNormalizer


def layer(inputs: int, outputs: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights of the given gain and zero bias."""
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def torso(inputs: int, model: ModelSection) -> nn.Sequential:
    """``model.num_layers`` tanh layers of ``model.hidden_size`` (empty, the identity, for 0 layers)."""
    layers: list[nn.Module] = []
    width = inputs
    for _ in range(model.num_layers):
        layers += [layer(width, model.hidden_size, math.sqrt(2)), nn.Tanh()]
        width = model.hidden_size
    return nn.Sequential(*layers)


def relu_mlp(inputs: int, hidden: tuple[int, ...] | list[int], outputs: int, output_gain: float) -> nn.Sequential:
    """Linear + ReLU layers of the ``hidden`` widths (orthogonal, gain sqrt 2), then a linear output layer."""
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        layers += [layer(width, size, math.sqrt(2)), nn.ReLU()]
        width = size
    layers.append(layer(width, outputs, output_gain))
    return nn.Sequential(*layers)


def torso_width(inputs: int, model: ModelSection) -> int:
    """Features out of ``torso(inputs, model)``."""
    return model.hidden_size if model.num_layers else inputs


def obs_scale(obs_dtype: str) -> float:
    """Factor that turns an observation value into a float feature: 1/255 for uint8 (bytes as [0, 1]), else 1."""
    return 1.0 / 255.0 if np.dtype(obs_dtype) == np.uint8 else 1.0


class ObsInput(nn.Module):
    """Observations in their env dtype [..., *obs_shape] -> float32 features [..., obs_size] (uint8 / 255).

    The mlp encoder (``policies.encoders``): it has no parameters, so flat-observation policies keep their names.
    With ``obs_norm`` the features are then normalised per feature (``policies.obs_normalization``; buffers only).
    """

    def __init__(self, spec: EnvSpec, *, obs_norm: bool = False) -> None:
        super().__init__()
        self.obs_size = int(np.prod(spec.obs_shape))
        self.obs_ndim = len(spec.obs_shape)
        self.obs_scale = obs_scale(spec.obs_dtype)
        self.obs_norm = ObsNormalizer(self.obs_size) if obs_norm else None
        """Running observation normalisation (model.obs_norm; every encoder has this attribute, None when off)."""
        self.out_features = self.obs_size
        """Features per observation (every encoder has this attribute)."""

    def input_features(self, obs: torch.Tensor) -> torch.Tensor:
        """Flatten the observation dims and convert to float32 (what obs_norm's statistics are of)."""
        lead = obs.shape[: obs.dim() - self.obs_ndim]
        return obs.reshape(*lead, self.obs_size).to(torch.float32) * self.obs_scale

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Flatten the observation dims, convert to float32 and, with obs_norm, normalise."""
        features = self.input_features(obs)
        return features if self.obs_norm is None else self.obs_norm(features)
