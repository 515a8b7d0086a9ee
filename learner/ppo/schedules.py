"""Hyperparameter schedules of seeds/000 (and the linear LR annealing of seeds/003).

Every schedule is a function of training progress ``epoch / total_epochs`` (epoch = updates done before
this one, total_epochs = max(1, total_timesteps // batch_size)). Progress is clamped to [0, 1], so a run
that goes on past total_timesteps holds the final values instead of extrapolating (cosine would rise
again, linear would go negative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from configs.schema import TrainerSection


def cosine(initial: float, minimum: float, progress: float) -> float:
    """min + 0.5 * (initial - min) * (1 + cos(pi * progress))."""
    return minimum + 0.5 * (initial - minimum) * (1.0 + math.cos(math.pi * progress))


def linear(initial: float, minimum: float, progress: float) -> float:
    """initial - (initial - min) * progress."""
    return initial - (initial - minimum) * progress


def logarithmic(initial: float, minimum: float, progress: float, decay_rate: float) -> float:
    """max(min, initial * exp(-decay_rate * progress))."""
    return max(minimum, initial * math.exp(-decay_rate * progress))


def scheduled(kind: str, initial: float, minimum: float, progress: float, *, decay_rate: float) -> float:
    """The value of a ``kind`` schedule (constant, cosine, linear, logarithmic) at ``progress``."""
    progress = min(1.0, max(0.0, progress))
    if kind == "constant":
        return initial
    if kind == "cosine":
        return cosine(initial, minimum, progress)
    if kind == "linear":
        return linear(initial, minimum, progress)
    if kind == "logarithmic":
        return logarithmic(initial, minimum, progress, decay_rate)
    raise ValueError(f"unknown schedule {kind!r}; allowed: constant, cosine, linear, logarithmic")


def learning_rate(schedule: str, initial: float, minimum: float, epoch: int, total_epochs: int,
                  decay_rate: float = 0.1) -> float:
    """The learning rate at ``epoch`` under the named schedule."""
    return scheduled(schedule, initial, minimum, epoch / max(1, total_epochs), decay_rate=decay_rate)


def anneal_beta(trainer: TrainerSection, epoch: int, total_epochs: int) -> float:
    """beta0 + (1 - beta0) * prio_alpha * epoch / total_epochs, as seeds/000 writes it (prio_alpha factor
    included), with the progress clamped like every other schedule."""
    progress = min(1.0, epoch / max(1, total_epochs))
    return trainer.prio_beta0 + (1 - trainer.prio_beta0) * trainer.prio_alpha * progress


@dataclass(frozen=True, kw_only=True)
class UpdateSchedule:
    """Every scheduled value in force for one update."""

    learning_rate: float
    """Optimiser learning rate."""
    ent_coef: float
    """Entropy bonus coefficient."""
    clip_coef: float
    """PPO ratio clip."""
    anneal_beta: float
    """Importance-sampling exponent."""
    kl_coef: float
    """Coefficient of the KL penalty to the reference policy (kl_divergence_coef_rho * coef_rho_decay**epoch)."""
    vf_warmup: bool
    """Only the value loss (and KL penalty) is optimised in this update."""

    def as_metrics(self) -> dict[str, float]:
        """The values as a metrics record."""
        return {"learning_rate": self.learning_rate, "ent_coef": self.ent_coef, "clip_coef": self.clip_coef,
                "anneal_beta": self.anneal_beta, "kl_coef": self.kl_coef, "vf_warmup": float(self.vf_warmup)}


def schedule_for(trainer: TrainerSection, epoch: int, total_epochs: int) -> UpdateSchedule:
    """All scheduled values for the update that follows ``epoch`` updates."""
    progress = epoch / max(1, total_epochs)
    decay = trainer.log_schedule_decay
    return UpdateSchedule(
        learning_rate=scheduled(trainer.lr_schedule, trainer.learning_rate, trainer.min_learning_rate, progress,
                                decay_rate=decay),
        ent_coef=scheduled(trainer.ent_coef_schedule, trainer.ent_coef, trainer.min_ent_coef, progress,
                           decay_rate=decay),
        clip_coef=scheduled(trainer.clip_coef_schedule, trainer.clip_coef, trainer.min_clip_coef, progress,
                            decay_rate=decay),
        anneal_beta=anneal_beta(trainer, epoch, total_epochs),
        kl_coef=trainer.kl_divergence_coef_rho * trainer.coef_rho_decay ** epoch,
        vf_warmup=epoch < trainer.vf_warmup,
    )
