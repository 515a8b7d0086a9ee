"""The learner's batch buffers and who holds each one.

Two host-side buffers of ``segments`` rows each: the ingest thread fills one while the update loop trains on the
other. Ownership passes as a buffer index (TorchBeast's way: indices, not data), free -> filling -> full ->
training -> free, and only through these methods: the ingest thread takes a free slot (``next_free``) and hands it
over full (``mark_full``); the update loop takes a full one (``next_full``) and gives it back (``release``). When both
are full or in training the ingest stops reading, its socket's high-water mark fills and actor hosts stop sending:
back-pressure, never an unbounded queue.
"""

from __future__ import annotations

import queue

from learner.update.batch import BatchBuffers
from protocol.rows import RowLayout

SLOTS = 2
"""Buffers per learner: one filling while the other trains."""


class BatchSlots:
    """``SLOTS`` batch buffers and the two queues their indices move through."""

    def __init__(self, layout: RowLayout, segments: int, *, pinned: bool = False) -> None:
        """``pinned``: buffers in page-locked host memory (needs CUDA), for a learner that trains on a GPU."""
        self.segments = segments
        self.buffers = tuple(BatchBuffers.allocate(layout, segments, pinned=pinned) for _ in range(SLOTS))
        self._free: queue.Queue[int] = queue.Queue()
        self._full: queue.Queue[int] = queue.Queue()
        for index in range(SLOTS):
            self._free.put(index)

    def next_full(self, timeout: float) -> int | None:
        """The update loop: the index of a filled buffer, now the caller's until ``release``; None after ``timeout``
        seconds without one."""
        try:
            return self._full.get(timeout=timeout)
        except queue.Empty:
            return None

    def release(self, index: int) -> None:
        """The update loop is done with buffer ``index``: the ingest may fill it again."""
        self._free.put(index)

    def next_free(self, timeout: float) -> int | None:
        """The ingest thread: the index of a buffer to fill, now its own until ``mark_full``; None after
        ``timeout`` seconds without one."""
        try:
            return self._free.get(timeout=timeout)
        except queue.Empty:
            return None

    def mark_full(self, index: int) -> None:
        """The ingest thread filled buffer ``index``: the update loop may take it."""
        self._full.put(index)

    def full_count(self) -> int:
        """Filled buffers waiting for the update loop (safe from any thread)."""
        return self._full.qsize()
