"""The batch plan of one data-parallel learner rank (issue 15): each of K ranks holds segments / K rows of the batch
and draws minibatch_segments / K of them per minibatch, so the K ranks' minibatches together are the plan's.

Pure arithmetic on top of ``configs.plan.make_plan`` (which stays the whole run's plan, unchanged for K = 1). The
seeds/000 constraints must hold per rank; a violation raises ``configs.plan.PlanError`` with the numbers. Given
``make_plan``'s ``segments % minibatch_segments == 0``, the two checks here (segments and minibatch_segments divisible
by K) are all it takes: the per-rank ``segments / K % (minibatch_segments / K)`` then holds, which is the issue's
``segments % (K * per-rank minibatch_segments)``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from configs.plan import BatchPlan, PlanError, make_plan
from configs.schema import ComaSection, TrainerSection

@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """The whole run's plan and one rank's share of it."""

    world_size: int
    """Learner ranks K (torchrun's WORLD_SIZE)."""
    horizon: int
    """Steps per row (trainer.bptt_horizon): rows times this is transitions."""
    run: BatchPlan
    """The plan of the whole batch, as one learner process would run it."""
    rank: BatchPlan
    """The plan one rank's update runs: ``run`` with segments / K rows and minibatch_segments / K rows per
    minibatch (same number of minibatches, so every rank takes the same optimizer steps)."""

    def as_dict(self) -> dict[str, int]:
        """The per-rank quantities ``--plan --ranks K`` shows after the run's: rows and transitions of one rank's
        batch and of its share of each minibatch."""
        return {"ranks": self.world_size, "rank_segments": self.rank.segments,
                "rank_batch_size": self.rank.segments * self.horizon,
                "rank_minibatch_segments": self.rank.minibatch_segments,
                "rank_minibatch_size": self.rank.minibatch_segments * self.horizon}


def make_rank_plan(trainer: TrainerSection, *, num_agents: int, world_size: int,
                   num_workers: int | None = None, coma: ComaSection | None = None) -> RankPlan:
    """The run's plan (``make_plan``) and the share of one of ``world_size`` ranks; PlanError with the numbers when
    the batch or its minibatches do not split evenly over the ranks (with trainer.algorithm coma and ``coma`` given:
    also coma.batch_size, the transitions of one gradient step, which the ranks draw in equal shares)."""
    if world_size < 1:
        raise PlanError(f"the learner world size (ranks) must be >= 1, got {world_size}")
    run = make_plan(trainer, num_agents=num_agents, num_workers=num_workers)
    _check_rank_constraints(run, world_size=world_size, minibatches=trainer.algorithm != "coma")
    if trainer.algorithm == "coma" and coma is not None and coma.batch_size % world_size != 0:
        raise PlanError(
            f"coma.batch_size ({coma.batch_size}) must be divisible by the learner ranks ({world_size}) so every rank "
            f"draws the same share of a gradient step's transitions: remainder {coma.batch_size % world_size}; change "
            f"coma.batch_size or the rank count")
    rank = dataclasses.replace(run, segments=run.segments // world_size,
                               minibatch_segments=run.minibatch_segments // world_size)
    return RankPlan(world_size=world_size, horizon=trainer.bptt_horizon, run=run, rank=rank)


def _check_rank_constraints(run: BatchPlan, *, world_size: int, minibatches: bool) -> None:
    """Rows split evenly over the ranks, and (``minibatches``: PPO's) each minibatch's rows too."""
    segments, minibatch = run.segments, run.minibatch_segments
    if segments % world_size != 0:
        raise PlanError(
            f"segments ({segments}) must be divisible by the learner ranks ({world_size}) so every rank holds "
            f"the same share: remainder {segments % world_size}; change trainer.batch_size or the rank count")
    if minibatches and minibatch % world_size != 0:
        raise PlanError(
            f"minibatch_segments ({minibatch}) must be divisible by the learner ranks ({world_size}) so every "
            f"rank draws the same share of a minibatch: remainder {minibatch % world_size}; change "
            f"trainer.minibatch_size or the rank count")


def torchrun_world_size() -> int:
    """The learner ranks torchrun started (its WORLD_SIZE; 1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))
