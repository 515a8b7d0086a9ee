"""What PPO's update needs from the other learner ranks: sums, averages and gathers of tensors, and averaged gradients.

``ppo_update`` (learner/ppo/update.py) takes a ``Reducer``. A single learner process uses ``SINGLE_PROCESS``, whose methods
return their input unchanged, so the update is exactly the one-process update. The data-parallel learner passes a
``learner.ranks.distributed.ProcessGroupReducer``, whose methods all-reduce over the ranks (issue 15).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


class Reducer(Protocol):
    """Collectives over the learner ranks; every rank must call the same methods in the same order."""

    world_size: int
    """Learner ranks K (1 for a single process)."""
    rank: int
    """This process's rank (0 for a single process)."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over the ranks (same shape on every rank)."""
        ...

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise mean of ``tensor`` over the ranks."""
        ...

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dim 0 in rank order (same shape on every rank)."""
        ...

    def average_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Replace every ``.grad`` by its mean over the ranks (parameters without a gradient are skipped)."""
        ...


@dataclass(frozen=True, kw_only=True)
class SingleProcessReducer:
    """The reducer of one learner process: every collective is the identity."""

    world_size: int = 1
    """Always 1."""
    rank: int = 0
    """Always 0."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` itself."""
        return tensor

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` itself."""
        return tensor

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` itself."""
        return tensor

    def average_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Nothing to average."""


SINGLE_PROCESS = SingleProcessReducer()
"""The (immutable) reducer ``ppo_update`` uses unless it is given another."""
