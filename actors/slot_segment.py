"""The actor host's shared memory: the StepBuffers of every agent slot of the host, each worker's clock, and the
handoff counters (``actors/handoff.py``).

One segment per host, its arrays in host-wide slot order (``SlotLayout``): worker ``w``'s group ``g`` is the slot
range from ``layout.first_slot(w, g)``. The host creates (and owns) it; each worker maps it and steps its own groups
into their ranges. So actions and step results cross between the processes without copies or pickling, and the
host's inference step reads any batch of groups by slot id from one array per field (``GroupStepper``).
"""

from __future__ import annotations

import numpy as np

from actors.shm import FieldLayout, ShmSegment, plan_layout
from actors.slot_layout import SlotLayout
from envs.base import EnvSpec, StepBuffers, step_buffer_fields

CLOCKS = "worker_clocks"
"""Field [workers, 2]: per worker, [seconds waiting for actions, seconds stepping envs], written by that worker."""
COMMANDS = "handoff_commands"
"""Field [workers, groups] int64: the host's wakes of each group, counted (``actors/handoff.py``)."""
ANSWERS = "handoff_answers"
"""Field [workers, groups] int64: the wake each group's worker answered last with a step."""
SLEEPING = "handoff_sleeping"
"""Field [workers + 1] int64: whether each worker, then the host, is about to sleep on its pipe or poll."""


def segment_size(env_spec: EnvSpec, layout: SlotLayout) -> int:
    """Bytes of the host's segment."""
    return _fields(env_spec, layout)[1]


def _fields(env_spec: EnvSpec, layout: SlotLayout) -> tuple[list[FieldLayout], int]:
    handoff = (layout.workers, layout.groups)
    return plan_layout(step_buffer_fields(env_spec, layout.total_slots)
                       + [(CLOCKS, (layout.workers, 2), "float64"), (COMMANDS, handoff, "int64"),
                          (ANSWERS, handoff, "int64"), (SLEEPING, (layout.workers + 1,), "int64")])


class SlotSegment:
    """The host's segment seen as one StepBuffers over every slot plus the workers' clocks and handoff counters."""

    def __init__(self, segment: ShmSegment, env_spec: EnvSpec, layout: SlotLayout) -> None:
        views = segment.views(_fields(env_spec, layout)[0])
        self.segment = segment
        self.name = segment.name
        self.layout = layout
        self.clocks: np.ndarray | None = views.pop(CLOCKS)
        """[workers, 2] float64 seconds each worker waited for actions and stepped its envs, accumulated."""
        self.commands: np.ndarray | None = views.pop(COMMANDS)
        """[workers, groups] int64 wakes of each group (``actors/handoff.py``)."""
        self.answers: np.ndarray | None = views.pop(ANSWERS)
        """[workers, groups] int64 the wake each group answered last."""
        self.sleeping: np.ndarray | None = views.pop(SLEEPING)
        """[workers + 1] int64 whether each worker, then the host, is about to sleep."""
        self.slots: StepBuffers | None = StepBuffers(**views)
        """Every slot of the host, in host-wide slot order."""

    @classmethod
    def create(cls, name: str, env_spec: EnvSpec, layout: SlotLayout) -> "SlotSegment":
        """Create (and own) the host's segment."""
        return cls(ShmSegment.create(name, segment_size(env_spec, layout)), env_spec, layout)

    @classmethod
    def attach(cls, name: str, env_spec: EnvSpec, layout: SlotLayout) -> "SlotSegment":
        """Map the segment the host created (a worker does this)."""
        return cls(ShmSegment.attach(name, segment_size(env_spec, layout)), env_spec, layout)

    def worker_groups(self, worker: int) -> tuple[StepBuffers, ...]:
        """The StepBuffers of each of ``worker``'s groups (views of its slot ranges)."""
        assert self.slots is not None
        return tuple(self.slots.part(slice(self.layout.first_slot(worker, g),
                                           self.layout.first_slot(worker, g) + self.layout.slots_per_group))
                     for g in range(self.layout.groups))

    def close(self) -> None:
        """Drop the views and unmap (the owner also unlinks); other views of it must be dropped first."""
        self.slots = None
        self.clocks = self.commands = self.answers = self.sleeping = None
        self.segment.close()
