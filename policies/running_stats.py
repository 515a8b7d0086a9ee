"""Running mean and (population) variance merged batch by batch (Chan et al. 1979), per element of a fixed shape.

One class for every running statistic in Sluice: the learner's return statistics (``trainer.norm_value_targets``,
``learner/value_normalization.py``, shape ``()``) and the observation statistics the policy carries
(``model.obs_norm``, ``policies/obs_normalization.py``, one per feature or channel). The statistics are float64
buffers of an ``nn.Module``, so they travel with ``state_dict`` (checkpoints, and the weights the actors get).
"""

from __future__ import annotations

import torch
from torch import nn

VARIANCE_EPSILON = 1e-8
"""Added to the variance before its square root (as gym's RunningMeanStd): constant inputs do not divide by 0."""


class RunningMeanStd(nn.Module):
    """Mean and (population) variance of every sample seen so far, per element of ``shape`` (``()``: one scalar)."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.shape = tuple(shape)
        """Shape of one sample (the statistics' shape)."""
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, values: torch.Tensor) -> None:
        """Merge ``values`` [..., *shape] (every leading index one sample) into the statistics (Chan et al. 1979)."""
        if values.dim() < len(self.shape) or tuple(values.shape[values.dim() - len(self.shape):]) != self.shape:
            raise ValueError(f"RunningMeanStd of shape {self.shape} got values of shape {tuple(values.shape)}")
        batch = values.detach().to(torch.float64).reshape(-1, *self.shape)
        batch_count = float(batch.shape[0])
        if batch_count == 0:
            return
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, correction=0)
        total = self.count + batch_count
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * batch_count + delta ** 2 * self.count * batch_count / total
        self.mean.copy_(self.mean + delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def std(self) -> torch.Tensor:
        """sqrt(var + VARIANCE_EPSILON), float64."""
        return torch.sqrt(self.var + VARIANCE_EPSILON)

    @torch.no_grad()
    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """(values - mean) / std, computed in float64, returned in ``values``' dtype."""
        return ((values.to(torch.float64) - self.mean) / self.std()).to(values.dtype)

    @torch.no_grad()
    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """values * std + mean, computed in float64, returned in ``values``' dtype."""
        return (values.to(torch.float64) * self.std() + self.mean).to(values.dtype)
