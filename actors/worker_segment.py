"""One env worker's shared memory: the StepBuffers of each of its groups, and the worker's clock.

The host creates (and owns) the segment; the worker attaches to it. Both see the same arrays, so actions
and step results cross between the processes without copies or pickling.
"""

from __future__ import annotations

import numpy as np

from actors.shm import FieldLayout, ShmSegment, plan_layout
from actors.slot_layout import SlotLayout
from envs.base import EnvSpec, StepBuffers, step_buffer_fields

CLOCK = "worker_clock"
"""Field [seconds waiting for actions, seconds stepping envs], written by the worker only."""


def segment_fields(env_spec: EnvSpec, layout: SlotLayout) -> tuple[list[FieldLayout], int]:
    """The fields of one worker's segment (StepBuffers over all its slots, then its clock) and its size."""
    return plan_layout(step_buffer_fields(env_spec, layout.slots_per_worker) + [(CLOCK, (2,), "float64")])


class WorkerSegment:
    """A worker's segment seen as one StepBuffers per group plus the clock."""

    def __init__(self, segment: ShmSegment, env_spec: EnvSpec, layout: SlotLayout) -> None:
        fields, _ = segment_fields(env_spec, layout)
        views = segment.views(fields)
        self.segment = segment
        self.name = segment.name
        self.groups: tuple[StepBuffers, ...] = tuple(
            StepBuffers(**{name: array[layout.group_slots(g)] for name, array in views.items() if name != CLOCK})
            for g in range(layout.groups))
        """The StepBuffers of each group: slices of the worker's arrays."""
        self.clock: np.ndarray | None = views[CLOCK]
        """[2] float64 seconds the worker waited for actions and stepped its envs, accumulated."""

    @classmethod
    def create(cls, name: str, env_spec: EnvSpec, layout: SlotLayout) -> "WorkerSegment":
        """Create (and own) the segment of one worker (the host does this)."""
        return cls(ShmSegment.create(name, segment_fields(env_spec, layout)[1]), env_spec, layout)

    @classmethod
    def attach(cls, name: str, env_spec: EnvSpec, layout: SlotLayout) -> "WorkerSegment":
        """Map the segment the host created (the worker does this)."""
        return cls(ShmSegment.attach(name, segment_fields(env_spec, layout)[1]), env_spec, layout)

    def close(self) -> None:
        """Drop the views and unmap (the owner also unlinks); other views of it must be dropped first."""
        self.groups = ()
        self.clock = None
        self.segment.close()
