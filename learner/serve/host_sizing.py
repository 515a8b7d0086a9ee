"""How many envs and agent slots a registering actor host runs, from the learner's config and the host's worker
count, computed as the host itself computes them (``configs.plan.make_plan``)."""

from __future__ import annotations

from dataclasses import dataclass

from configs.plan import PlanError, make_plan
from configs.schema import TrainerSection
from protocol import ProtocolError

MAX_WORKERS = 4096
"""Most env worker processes one registration may claim."""


@dataclass(frozen=True, kw_only=True)
class HostSize:
    """What one actor host runs."""

    num_workers: int
    """Env worker processes."""
    num_envs: int
    """Environments over all its workers."""
    agent_slots: int
    """Agents it steps at once: num_envs times agents per env."""


@dataclass(frozen=True, kw_only=True)
class HostSizing:
    """The learner's side of the batch plan that fixes a host's size."""

    trainer: TrainerSection
    """The run's trainer section (num_workers default, forward-pass target, async_factor, batch sizes)."""
    num_agents: int
    """Agents per env (env.num_agents)."""

    def for_workers(self, num_workers: int) -> HostSize:
        """The size of a host that registered with ``num_workers`` (0: the run's trainer.num_workers);
        ProtocolError("bad_field") for a count out of range or one the batch plan cannot take."""
        if not 0 <= num_workers <= MAX_WORKERS:
            raise ProtocolError("bad_field", f"register field 'num_workers' must be 0 (the run's trainer.num_workers) "
                                             f"or 1..{MAX_WORKERS}, got {num_workers}")
        workers = num_workers or self.trainer.num_workers
        try:
            plan = make_plan(self.trainer, num_agents=self.num_agents, num_workers=workers)
        except PlanError as err:
            raise ProtocolError("bad_field", f"register field 'num_workers' {workers} does not fit the run's "
                                             f"batch plan: {err}") from None
        return HostSize(num_workers=workers, num_envs=plan.num_envs, agent_slots=plan.num_envs * self.num_agents)
