"""Where every agent slot of an actor host lives: workers x env groups x envs x agents, computed once.

Agent slot ids are host-wide: worker ``w``'s group ``g`` holds the ``slots_per_group`` slots from
``first_slot(w, g)`` on, env by env and agent by agent within an env. The workers' shared memory, the
stepper (agent ids, recurrent states, rows), the assembler and the worker pool all read this one value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from configs.plan import BatchPlan, PlanError
from envs.base import StepBuffers


@dataclass(frozen=True, kw_only=True)
class GroupView:
    """One env group of one worker, as the host acts on it."""

    worker: int
    """Index of the worker process on this host."""
    group: int
    """Index of the group within its worker."""
    slots: StepBuffers
    """Every slot of the host (host-wide slot order; in shared memory on a running host): the inference step reads
    and writes a batch of groups there by slot id."""
    buffers: StepBuffers
    """The group's own slots: ``slots`` restricted to ``slot_ids`` (views)."""
    slot_ids: np.ndarray
    """[slots_per_group] int64 host-wide agent slot ids of the group's slots, in buffer order."""
    first_slot: int
    """The host-wide id of the group's first slot (``slot_ids[0]``; the rest follow it)."""


@dataclass(frozen=True, kw_only=True)
class SlotLayout:
    """The geometry of one host's agent slots."""

    workers: int
    """Env worker processes on the host."""
    groups: int
    """Env groups per worker (trainer.async_factor): a worker steps one group while the host decides another."""
    envs_per_group: int
    """Envs stepped together as one group."""
    agents_per_env: int
    """Agent slots per env (the env spec's num_agents)."""
    slots_per_group: int = field(init=False)
    """Agent slots of one group: envs_per_group * agents_per_env."""
    slots_per_worker: int = field(init=False)
    """Agent slots of one worker (the length of its shared StepBuffers): groups * slots_per_group."""
    total_slots: int = field(init=False)
    """Agent slots of the whole host (the assembler's and the recurrent states' length)."""
    total_envs: int = field(init=False)
    """Envs of the whole host."""

    def __post_init__(self) -> None:
        for name in ("workers", "groups", "envs_per_group", "agents_per_env"):
            if getattr(self, name) < 1:
                raise ValueError(f"SlotLayout.{name} must be at least 1, got {getattr(self, name)}")
        slots_per_group = self.envs_per_group * self.agents_per_env
        object.__setattr__(self, "slots_per_group", slots_per_group)
        object.__setattr__(self, "slots_per_worker", slots_per_group * self.groups)
        object.__setattr__(self, "total_slots", slots_per_group * self.groups * self.workers)
        object.__setattr__(self, "total_envs", self.envs_per_group * self.groups * self.workers)

    @classmethod
    def from_plan(cls, plan: BatchPlan, *, groups: int, agents_per_env: int) -> "SlotLayout":
        """The layout of a host that runs ``plan``'s workers in ``groups`` groups each (PlanError if uneven)."""
        if plan.envs_per_worker % groups:
            raise PlanError(f"envs_per_worker ({plan.envs_per_worker}) must be divisible by "
                            f"async_factor ({groups})")
        return cls(workers=plan.num_workers, groups=groups, envs_per_group=plan.envs_per_worker // groups,
                   agents_per_env=agents_per_env)

    @property
    def envs_per_worker(self) -> int:
        """Envs of one worker."""
        return self.envs_per_group * self.groups

    def group_slots(self, group: int) -> slice:
        """The slots of ``group`` within its worker's buffers."""
        return slice(group * self.slots_per_group, (group + 1) * self.slots_per_group)

    def first_slot(self, worker: int, group: int) -> int:
        """Host-wide id of the first slot of ``worker``'s ``group``."""
        return worker * self.slots_per_worker + group * self.slots_per_group

    def worker_slots(self, worker: int) -> np.ndarray:
        """[slots_per_worker] int64 host-wide ids of ``worker``'s slots."""
        start = worker * self.slots_per_worker
        return np.arange(start, start + self.slots_per_worker, dtype=np.int64)

    def group_view(self, worker: int, group: int, slots: StepBuffers) -> GroupView:
        """``worker``'s ``group`` within ``slots`` (StepBuffers over all ``total_slots`` slots of the host)."""
        if len(slots.obs) != self.total_slots:
            raise ValueError(f"group_view takes the StepBuffers of all {self.total_slots} slots of the host, "
                             f"got {len(slots.obs)}")
        start = self.first_slot(worker, group)
        return GroupView(worker=worker, group=group, slots=slots,
                         buffers=slots.part(slice(start, start + self.slots_per_group)),
                         slot_ids=np.arange(start, start + self.slots_per_group, dtype=np.int64), first_slot=start)

    def group_views(self, slots: StepBuffers) -> tuple[GroupView, ...]:
        """Every group of the host within ``slots``, worker by worker."""
        return tuple(self.group_view(w, g, slots) for w in range(self.workers) for g in range(self.groups))
