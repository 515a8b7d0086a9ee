"""The encoder of a structured observation (``EnvSpec.obs_leaves``): one encoder per leaf, features concatenated.

The observation arrives flat ([..., N], uint8 or float32, ``envs.obs_layout``); ``DictEncoder`` slices each leaf's
values out of it (nothing else of the flat row is read, so bytes between leaves never reach the features),
reshapes them to the leaf's shape and hands them to the leaf's encoder:

- a Box leaf gets what ``model.encoder: auto`` picks for it alone (``policies.encoders``): ``CNNEncoder`` for an
  image (rank 3, chw or hwc, H, W >= 3), ``TokenEncoder`` for a declared token list, else the flatten
  (``ObsInput``); each scales by the leaf's own dtype (a uint8 leaf by 1/255, also inside a float32 flat row);
- a Discrete or MultiDiscrete leaf: an ``nn.Embedding`` of ``EMBEDDING_WIDTH`` per component (one table, offsets
  per component); indices are clamped into each component's range, so a damaged row cannot index out of it;
- a MultiBinary leaf: its 0/1 values as floats.

``model.obs_norm`` normalises the Box leaves that are not token lists (per feature when flattened, per channel for
an image, as for a flat observation); Discrete, MultiDiscrete, MultiBinary and token leaves are never normalised,
and a spec with no such Box leaf refuses obs_norm with a ConfigError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from configs.loader import ConfigError
from configs.schema import ModelSection
from envs.base import EnvSpec, ObsLeaf
from policies.obs_normalization import ObsNormalizer

EMBEDDING_WIDTH = 16
"""Features of one Discrete value (one MultiDiscrete component) out of its embedding."""

BOX_KINDS = {"CNNEncoder": "cnn", "TokenEncoder": "tokens", "ObsInput": "mlp"}
"""The ``model.encoder`` name of each encoder class a Box leaf may get, for ``DictEncoder.kinds``."""
BoxEncoderFactory = Callable[[EnvSpec, ModelSection], nn.Module]
"""Builds the encoder ``model.encoder: auto`` picks for a Box leaf's own spec (``policies.encoders.make_encoder``)."""


def leaf_spec(spec: EnvSpec, leaf: ObsLeaf) -> EnvSpec:
    """A Box leaf as an observation of its own (its shape, dtype, token and image layouts)."""
    return EnvSpec(num_agents=spec.num_agents, obs_shape=leaf.shape, obs_dtype=leaf.dtype, action=spec.action,
                   tokens=leaf.tokens, image_layout=leaf.image_layout)


class EmbeddingLeaf(nn.Module):
    """A Discrete / MultiDiscrete leaf's values [..., size] -> concatenated embeddings [..., size * EMBEDDING_WIDTH]."""

    def __init__(self, leaf: ObsLeaf) -> None:
        super().__init__()
        nvec = torch.tensor(leaf.nvec, dtype=torch.int64)
        self.register_buffer("offsets", torch.cumsum(nvec, 0) - nvec, persistent=False)
        self.register_buffer("largest", nvec - 1, persistent=False)
        self.embedding = nn.Embedding(int(nvec.sum()), EMBEDDING_WIDTH)
        self.obs_norm = None
        """Embedded ids are not normalised."""
        self.out_features = leaf.size * EMBEDDING_WIDTH
        """Features per observation."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        """values [..., size] (value - start, any numeric dtype) -> [..., size * EMBEDDING_WIDTH]."""
        index = torch.minimum(values.to(torch.int64).clamp(min=0), self.largest) + self.offsets
        embedded = self.embedding(index)
        return embedded.reshape(*values.shape[:-1], self.out_features)


class BinaryLeaf(nn.Module):
    """A MultiBinary leaf's 0/1 values [..., size] -> float32 features [..., size]."""

    def __init__(self, leaf: ObsLeaf) -> None:
        super().__init__()
        self.obs_norm = None
        """0/1 flags are not normalised."""
        self.out_features = leaf.size
        """Features per observation."""

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        """values [..., size] -> (values != 0) as float32."""
        return (values != 0).to(torch.float32)


class LeafObsNorm:
    """``DictEncoder.obs_norm``: the running normalisers of its Box leaves' encoders, updated together.

    Not a module (the normalisers are already registered inside the leaf encoders, so the state dict holds them
    once); ``policies.obs_normalization.update_obs_normalizer`` calls ``update`` with ``input_features(obs)``.
    """

    def __init__(self, normalizers: list[ObsNormalizer]) -> None:
        self.normalizers = normalizers

    def update(self, features: list[torch.Tensor],
               gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Merge each normalised leaf's float inputs into its statistics (in leaf order on every rank)."""
        for normalizer, leaf_features in zip(self.normalizers, features):
            normalizer.update(leaf_features, gather)


class DictEncoder(nn.Module):
    """Flat structured observations [..., N] -> the leaves' features, concatenated [..., out_features]."""

    def __init__(self, spec: EnvSpec, model: ModelSection, box_encoder: BoxEncoderFactory) -> None:
        super().__init__()
        if not spec.obs_leaves:
            raise ValueError("DictEncoder needs an EnvSpec with observation leaves (EnvSpec.obs_leaves)")
        self.leaves = spec.obs_leaves
        self.kinds: list[str] = []
        """Each leaf's encoder kind: cnn, tokens, mlp (Box), embedding or binary."""
        encoders: list[nn.Module] = []
        for leaf in self.leaves:
            if leaf.kind in ("discrete", "multi_discrete"):
                encoders.append(EmbeddingLeaf(leaf))
                self.kinds.append("embedding")
            elif leaf.kind == "multi_binary":
                encoders.append(BinaryLeaf(leaf))
                self.kinds.append("binary")
            else:
                own = leaf_spec(spec, leaf)
                encoders.append(box_encoder(own, dataclasses.replace(
                    model, encoder="auto", obs_norm=model.obs_norm and leaf.tokens is None)))
                self.kinds.append(BOX_KINDS.get(type(encoders[-1]).__name__, type(encoders[-1]).__name__))
        self.encoders = nn.ModuleList(encoders)
        normalizers = [encoder.obs_norm for encoder in encoders if encoder.obs_norm is not None]
        if model.obs_norm and not normalizers:
            raise ConfigError("model.obs_norm: true normalises an env's Box leaves (not token lists), and this env's "
                              "structured observation has none (leaves "
                              f"{', '.join(f'{leaf.name} ({leaf.kind})' for leaf in self.leaves)}); allowed: false")
        self.obs_norm = LeafObsNorm(normalizers) if normalizers else None
        """The Box leaves' running observation normalisation (model.obs_norm; None when off)."""
        self.out_features = sum(encoder.out_features for encoder in encoders)
        """Features per observation (the leaves' features side by side, in leaf order)."""

    def leaf_input(self, obs: torch.Tensor, leaf: ObsLeaf) -> torch.Tensor:
        """One leaf's values out of flat observations [..., N]: [..., *shape] for Box leaves, [..., size] else."""
        part = obs[..., leaf.offset:leaf.offset + leaf.size]
        return part.reshape((*obs.shape[:-1], *leaf.shape)) if leaf.kind == "box" else part

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., N] (the flat dtype) -> features [..., out_features]."""
        features = [encoder(self.leaf_input(obs, leaf)) for leaf, encoder in zip(self.leaves, self.encoders)]
        return torch.cat(features, dim=-1)

    def input_features(self, obs: torch.Tensor) -> list[torch.Tensor]:
        """What the normalised leaves' statistics are of, one tensor per normalised leaf (``LeafObsNorm.update``)."""
        return [encoder.input_features(self.leaf_input(obs, leaf))
                for leaf, encoder in zip(self.leaves, self.encoders) if encoder.obs_norm is not None]

    def describe(self) -> list[str]:
        """One line per leaf: its name, kind, shape and dtype, its encoder and how many features it gives."""
        lines = []
        for leaf, kind, encoder in zip(self.leaves, self.kinds, self.encoders):
            values = f" of {list(leaf.nvec)} values" if leaf.nvec else ""
            layout = f" {leaf.image_layout}" if leaf.image_layout else ""
            lines.append(f"leaf {leaf.name or '(whole)'}: {leaf.kind} {list(leaf.shape)} {leaf.dtype}{layout}{values} "
                         f"-> {kind} ({encoder.out_features} features)")
        return lines
