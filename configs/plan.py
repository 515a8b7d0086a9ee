"""The batch plan of seeds/000: environment/worker, experience-buffer and training-loop arithmetic.

Pure arithmetic on the config (no env is built). Actor hosts size their env workers from it and the
learner sizes its experience buffer and minibatches from it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from configs.schema import ComaSection, RunConfig, TrainerSection


class PlanError(ValueError):
    """The config violates one of the seed's batch constraints; the message shows the numbers."""


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """Every derived quantity of seeds/000, named as there."""

    num_agents: int
    """Agents per environment."""
    num_workers: int
    """Env worker processes."""
    target_batch_size: int
    """Environments per forward pass wanted: forward_pass_minibatch_target_size // num_agents (>= num_workers)."""
    batch_size_envs: int
    """Environments per forward pass, rounded down to a multiple of num_workers."""
    num_envs: int
    """Environments in total: batch_size_envs * async_factor."""
    envs_per_worker: int
    """Environments per worker process."""
    total_agents: int
    """Agent slots in total: num_envs * num_agents."""
    segments: int
    """Rows in the experience buffer: batch_size // bptt_horizon."""
    minibatch_segments: int
    """Rows per minibatch: minibatch_size // bptt_horizon."""
    num_minibatches: int
    """Minibatches per epoch: segments // minibatch_segments."""
    steps_per_env: int
    """Env steps each environment contributes per batch: batch_size // num_envs."""
    agent_steps_per_batch: int
    """batch_size * num_agents, as seeds/000 writes it. Sluice's batch holds batch_size AGENT steps (segments
    rows of bptt_horizon, one agent each), so this figure over-counts by num_agents; kept for comparison."""
    gradient_updates_per_batch: int
    """num_minibatches * update_epochs."""
    experiences_per_gradient: int
    """agent_steps_per_batch // gradient_updates_per_batch."""
    total_epochs: int
    """Updates in the whole run: total_timesteps // batch_size (at least 1; both count agent steps)."""

    def as_dict(self) -> dict[str, int]:
        """The plan as a flat JSON-friendly dict."""
        return dataclasses.asdict(self)


def make_plan(trainer: TrainerSection, *, num_agents: int, num_workers: int | None = None) -> BatchPlan:
    """Compute the plan; ``num_workers`` overrides trainer.num_workers (an actor host's --n). With
    ``trainer.algorithm: coma`` a row holds one env's agents together (team rows), so rows are written per env."""
    workers = trainer.num_workers if num_workers is None else num_workers
    target_batch_size = trainer.forward_pass_minibatch_target_size // num_agents
    if target_batch_size < max(2, workers):
        target_batch_size = workers
    batch_size_envs = (target_batch_size // workers) * workers
    num_envs = batch_size_envs * trainer.async_factor
    envs_per_worker = num_envs // workers
    segments = trainer.batch_size // trainer.bptt_horizon
    minibatch_segments = trainer.minibatch_size // trainer.bptt_horizon
    total_agents = num_envs * num_agents
    agents_per_row = num_agents if trainer.algorithm == "coma" else 1
    _check_constraints(trainer, segments=segments, minibatch_segments=minibatch_segments,
                       total_agents=total_agents // agents_per_row, num_envs=num_envs,
                       num_agents=num_agents // agents_per_row)
    num_minibatches = segments // minibatch_segments
    agent_steps = trainer.batch_size * num_agents
    gradient_updates = num_minibatches * trainer.update_epochs
    return BatchPlan(
        num_agents=num_agents,
        num_workers=workers,
        target_batch_size=target_batch_size,
        batch_size_envs=batch_size_envs,
        num_envs=num_envs,
        envs_per_worker=envs_per_worker,
        total_agents=total_agents,
        segments=segments,
        minibatch_segments=minibatch_segments,
        num_minibatches=num_minibatches,
        steps_per_env=trainer.batch_size // num_envs,
        agent_steps_per_batch=agent_steps,
        gradient_updates_per_batch=gradient_updates,
        experiences_per_gradient=agent_steps // gradient_updates,
        total_epochs=max(1, trainer.total_timesteps // trainer.batch_size),
    )


def _check_constraints(trainer: TrainerSection, *, segments: int, minibatch_segments: int,
                       total_agents: int, num_envs: int, num_agents: int) -> None:
    if trainer.minibatch_size % trainer.bptt_horizon != 0:
        raise PlanError(
            f"trainer.minibatch_size ({trainer.minibatch_size}) must be divisible by trainer.bptt_horizon "
            f"({trainer.bptt_horizon}): remainder {trainer.minibatch_size % trainer.bptt_horizon}")
    if minibatch_segments < 1:
        raise PlanError(f"trainer.minibatch_size ({trainer.minibatch_size}) is smaller than "
                        f"trainer.bptt_horizon ({trainer.bptt_horizon})")
    if segments < total_agents:
        raise PlanError(
            f"segments ({segments} = batch_size {trainer.batch_size} // bptt_horizon {trainer.bptt_horizon}) "
            f"must be >= total agents ({total_agents} = {num_envs} envs x "
            f"{'1 team row (coma)' if trainer.algorithm == 'coma' else f'{num_agents} agents'}); "
            f"raise trainer.batch_size or lower the env count")
    if segments % minibatch_segments != 0:
        raise PlanError(
            f"segments ({segments} = batch_size {trainer.batch_size} // bptt_horizon {trainer.bptt_horizon}) "
            f"must be divisible by minibatch_segments ({minibatch_segments} = minibatch_size "
            f"{trainer.minibatch_size} // bptt_horizon {trainer.bptt_horizon}): remainder "
            f"{segments % minibatch_segments}")
    num_minibatches = segments // minibatch_segments
    if num_minibatches % trainer.gradient_accumulation != 0:
        raise PlanError(
            f"trainer.gradient_accumulation ({trainer.gradient_accumulation}) must divide the minibatches per "
            f"epoch ({num_minibatches} = segments {segments} // minibatch_segments {minibatch_segments})")


PPO_ONLY = ("minibatch_segments", "num_minibatches", "gradient_updates_per_batch", "experiences_per_gradient")
"""Plan quantities that describe PPO's minibatches, which a COMA update does not use."""


def coma_gradient_steps(section: ComaSection, transitions: int) -> int:
    """Gradient steps of one COMA update that adds ``transitions`` joint transitions: coma.epochs passes of
    ceil(transitions / coma.batch_size) uniform minibatches from the replay buffer."""
    return section.epochs * math.ceil(transitions / section.batch_size)


def plan_rows(plan: BatchPlan, config: RunConfig) -> dict[str, int]:
    """What ``--plan`` shows: the batch plan, with COMA's update arithmetic in place of PPO's minibatches when
    trainer.algorithm is coma (a COMA row is one env's steps, so segments counts env rows and batch_size env steps)."""
    rows = plan.as_dict()
    if config.trainer.algorithm != "coma":
        return rows
    section = config.coma
    rows = {key: value for key, value in rows.items() if key not in PPO_ONLY}
    steps = coma_gradient_steps(section, config.trainer.batch_size)
    rows.update(coma_env_steps_per_update=config.trainer.batch_size,
                coma_gradient_steps_per_update=steps,
                coma_transitions_per_gradient_step=section.batch_size,
                coma_replay_capacity=section.buffer_size,
                coma_replays_per_transition=math.ceil(steps * section.batch_size / config.trainer.batch_size))
    return rows


def format_plan(rows: dict[str, int]) -> str:
    """The plan's rows (``plan_rows``) as an aligned two-column table."""
    width = max(len(k) for k in rows)
    lines = [f"{'quantity':<{width}}  value", f"{'-' * width}  {'-' * 12}"]
    lines += [f"{key:<{width}}  {value:>12,}" for key, value in rows.items()]
    return "\n".join(lines)
