"""Running mean and (population) variance merged batch by batch (Chan et al. 1979), per element of a fixed shape.

One class for every running statistic in Sluice: the learner's return statistics (``trainer.norm_value_targets``,
``learner/ppo/value_normalization.py``, shape ``()``) and the observation statistics the policy carries
(``model.obs_norm``, ``policies/obs_normalization.py``, one per feature or channel). The statistics are float64
buffers of an ``nn.Module``, so they travel with ``state_dict`` (checkpoints, and the weights the actors get).
"""

from __future__ import annotations

from collections.abc import Callable

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
    def update(self, values: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Merge ``values`` [..., *shape] (every leading index one sample) into the statistics (Chan et al. 1979).

        ``gather`` (a data-parallel learner's all-gather over its ranks, ``learner.update.reducer.Reducer.gather``): merge
        every rank's ``values`` instead, exactly, from each rank's count, mean and variance; every rank then holds the
        same statistics. Every rank must call it, even with no values."""
        if values.dim() < len(self.shape) or tuple(values.shape[values.dim() - len(self.shape):]) != self.shape:
            raise ValueError(f"RunningMeanStd of shape {self.shape} got values of shape {tuple(values.shape)}")
        batch = values.detach().to(torch.float64).reshape(-1, *self.shape)
        batch_count = torch.tensor(float(batch.shape[0]), dtype=torch.float64, device=batch.device)
        if batch.shape[0] == 0:
            batch_mean = batch_var = torch.zeros(self.shape, dtype=torch.float64, device=batch.device)
        else:
            batch_mean, batch_var = batch.mean(dim=0), batch.var(dim=0, correction=0)
        if gather is not None:
            batch_count, batch_mean, batch_var = merged_moments(gather(batch_count.reshape(1)),
                                                                gather(batch_mean.unsqueeze(0)),
                                                                gather(batch_var.unsqueeze(0)))
        if float(batch_count) == 0:
            return
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


def merged_moments(counts: torch.Tensor, means: torch.Tensor,
                   variances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count, mean and population variance of the union of K sample sets given each one's ([K], [K, *shape],
    [K, *shape]); a set with count 0 adds nothing."""
    total = counts.sum()
    if float(total) == 0:
        return total, means[0] * 0, variances[0] * 0
    weights = (counts / total).reshape(-1, *([1] * (means.dim() - 1)))
    mean = (weights * means).sum(dim=0)
    variance = (weights * (variances + (means - mean) ** 2)).sum(dim=0)
    return total, mean, variance
