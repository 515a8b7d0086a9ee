"""Hyperparameter schedules of seeds/000 as functions of training progress (epoch / total_epochs)."""

from __future__ import annotations

import math


def cosine(initial: float, minimum: float, progress: float) -> float:
    """min + 0.5 * (initial - min) * (1 + cos(pi * progress))."""
    return minimum + 0.5 * (initial - minimum) * (1.0 + math.cos(math.pi * progress))


def learning_rate(schedule: str, initial: float, minimum: float, epoch: int, total_epochs: int) -> float:
    """The learning rate at ``epoch`` under the named schedule (cosine or constant)."""
    progress = min(1.0, epoch / max(1, total_epochs))
    if schedule == "cosine":
        return cosine(initial, minimum, progress)
    if schedule == "constant":
        return initial
    raise ValueError(f"unknown lr_schedule {schedule!r}; allowed: cosine, constant")
