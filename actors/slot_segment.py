"""The actor host's shared memory: the StepBuffers of every agent slot of the host, and each worker's clock.

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


def segment_size(env_spec: EnvSpec, layout: SlotLayout) -> int:
    """Bytes of the host's segment."""
    return _fields(env_spec, layout)[1]


def _fields(env_spec: EnvSpec, layout: SlotLayout) -> tuple[list[FieldLayout], int]:
    return plan_layout(step_buffer_fields(env_spec, layout.total_slots) + [(CLOCKS, (layout.workers, 2), "float64")])


class SlotSegment:
    """The host's segment seen as one StepBuffers over every slot plus the workers' clocks."""

    def __init__(self, segment: ShmSegment, env_spec: EnvSpec, layout: SlotLayout) -> None:
        views = segment.views(_fields(env_spec, layout)[0])
        self.segment = segment
        self.name = segment.name
        self.layout = layout
        self.slots: StepBuffers | None = StepBuffers(**{name: array for name, array in views.items()
                                                         if name != CLOCKS})
        """Every slot of the host, in host-wide slot order."""
        self.clocks: np.ndarray | None = views[CLOCKS]
        """[workers, 2] float64 seconds each worker waited for actions and stepped its envs, accumulated."""

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
        self.clocks = None
        self.segment.close()
