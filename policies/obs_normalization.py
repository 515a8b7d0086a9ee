"""Running observation normalisation (``model.obs_norm``): ``clip((x - mean) / sqrt(var + eps), -5, 5)`` per feature.

``x`` is what the encoder reads as floats (the observation flattened and uint8 scaled by 1/255 for mlp; for cnn the
image [C, H, W], one statistic per channel shared by every pixel). The statistics (``policies.running_stats``) are
buffers of the policy module, so they travel with its ``state_dict``: in the checkpoint's ``model`` file and in the
weights every actor host loads, which therefore normalises exactly as the learner does. Only the learner changes
them, by calling ``update_obs_normalizer`` on the observations of each update before its forward passes
(learner/ppo/algorithm.py); a forward pass only reads them, so evaluation and the arena see them frozen.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from policies.running_stats import RunningMeanStd

OBS_CLIP = 5.0
"""Normalised observations are clipped to [-OBS_CLIP, OBS_CLIP]."""


class ObsNormalizer(nn.Module):
    """Per-feature running statistics of an encoder's float input and the clipped normalisation with them.

    The feature axis is at ``-(1 + spatial_dims)`` of the input (mlp: the last; cnn: C of [..., C, H, W]); the
    ``spatial_dims`` axes after it share its statistics.
    """

    def __init__(self, num_features: int, *, spatial_dims: int = 0) -> None:
        super().__init__()
        self.stats = RunningMeanStd((num_features,))
        self.spatial_dims = spatial_dims
        """Axes after the feature axis that share its statistics (cnn: 2, height and width)."""

    def _broadcast(self, stat: torch.Tensor) -> torch.Tensor:
        """A [F] statistic shaped to broadcast over the input's feature and spatial axes, float32."""
        return stat.to(torch.float32).reshape(-1, *([1] * self.spatial_dims))

    @torch.no_grad()
    def update(self, features: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Merge float inputs [..., F, *spatial] into the statistics (every leading and spatial index one sample);
        ``gather``: every learner rank's inputs (``RunningMeanStd.update``)."""
        per_feature = features.movedim(features.dim() - 1 - self.spatial_dims, -1)
        self.stats.update(per_feature, gather)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., F, *spatial] float32 -> clip((x - mean) / std, -OBS_CLIP, OBS_CLIP), float32."""
        normalized = (features - self._broadcast(self.stats.mean)) / self._broadcast(self.stats.std())
        return normalized.clamp(-OBS_CLIP, OBS_CLIP)


def update_obs_normalizer(policy: nn.Module, obs: torch.Tensor,
                          gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Merge observations [..., *obs_shape] (env dtype) into ``policy``'s statistics; nothing when obs_norm is off.
    ``gather``: a data-parallel learner's all-gather, so every rank merges all ranks' observations."""
    encoder = policy.encoder
    if encoder.obs_norm is not None:
        encoder.obs_norm.update(encoder.input_features(obs), gather)
