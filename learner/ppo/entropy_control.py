"""Adaptive entropy coefficient (``trainer.entropy_floor``): keep the policy's entropy above a floor.

A multiplier ``m`` (starting at 1) scales the scheduled coefficient: ``ent_coef_effective = m * ent_coef_scheduled``,
so it composes with ``ent_coef_schedule`` (a schedule that reaches 0 takes the bonus to 0 whatever ``m`` is; keep
``min_ent_coef > 0`` for the floor to act late in a run). After each update the measured mean entropy ``H`` moves
it, like SAC's temperature but by fixed multiplicative steps instead of a gradient:

    m <- min(MAX_MULTIPLIER, m * STEP)   if H < entropy_floor
    m <- max(1, m / STEP)                otherwise (relax back to the schedule)

A NaN entropy leaves ``m`` as it is, and so do value warm-up updates (the entropy bonus is not optimised there).
The multiplier is a float64 buffer of an ``nn.Module``, saved in checkpoints as ``entropy_control.safetensors``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

STEP = 1.5
"""Factor by which the multiplier rises (entropy below the floor) or relaxes (above it) after one update."""
MAX_MULTIPLIER = 10.0
"""The effective coefficient is at most this many times the scheduled one."""


def next_multiplier(multiplier: float, entropy: float, entropy_floor: float) -> float:
    """The multiplier for the next update, given this update's mean entropy."""
    if math.isnan(entropy):
        return multiplier
    if entropy < entropy_floor:
        return min(MAX_MULTIPLIER, multiplier * STEP)
    return max(1.0, multiplier / STEP)


class EntropyControl(nn.Module):
    """The entropy coefficient's multiplier and the floor it steers the entropy toward."""

    multiplier: torch.Tensor

    def __init__(self, entropy_floor: float) -> None:
        super().__init__()
        self.entropy_floor = entropy_floor
        self.register_buffer("multiplier", torch.ones((), dtype=torch.float64))

    def coefficient(self, scheduled: float) -> float:
        """The entropy coefficient in force: the scheduled one times the multiplier."""
        return scheduled * float(self.multiplier)

    def adapt(self, entropy: float) -> None:
        """Move the multiplier after an update whose mean policy entropy was ``entropy``."""
        self.multiplier.fill_(next_multiplier(float(self.multiplier), entropy, self.entropy_floor))
