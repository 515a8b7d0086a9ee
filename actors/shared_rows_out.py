"""The host's side of rows through shared memory (protocol/shared_rows.py): one segment of slots per registration
(and per change of learner ranks), a slot per ROWS message in flight, and what to do when none is free.

No free slot is back-pressure, as a full data socket is: the host waits, and the rows in flight stay within the
slots (twice the data socket's high-water mark, what its two queues held before). A learner busy with an update reads
no rows meanwhile and keeps its slots (the messages on the socket are small, so the socket does not fill first); the
host waits for it. Only when the oldest slot has been out for ``reclaim_s``, several peer timeouts (a message lost on
the way never hands its slot back), does a message go with its payload in it, as to a learner on another machine: a
lost slot costs speed, never a stall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from configs.schema import NetworkSection
from protocol.framing import PackedLayout
from protocol.shared_rows import RowSlots, SharedRef


@dataclass(frozen=True, slots=True)
class Slot:
    """A slot taken for one message: fill ``buffer``, then send ``ref``."""

    slots: RowSlots
    index: int
    seq: int

    @property
    def buffer(self) -> np.ndarray:
        """The slot's bytes, to lay the packed payload out in."""
        return self.slots.payload_buffer(self.index)

    def ref(self, layout: PackedLayout) -> dict:
        """The ROWS message's ``shared`` field for a payload of ``layout`` here."""
        return SharedRef(segment=self.slots.name, slot=self.index, seq=self.seq, nbytes=layout.total,
                         layout=layout.key).to_field()


RECLAIM_PEER_TIMEOUTS = 6
"""A slot out for this many network.peer_timeout_s is taken as lost (60 s by default): longer than a learner's update
keeps its ingest from reading rows (grid 3's took ~11 s on a 2-core machine, and a learner answers heartbeats
meanwhile), so a learner busy training is waited for, as a full socket is."""
WAIT = "wait"
"""``SharedRowsOut.take``: every slot is out and the oldest not for long; wait as for a full socket."""


class SharedRowsOut:
    """The slots of the current registration (used by the host's main thread only)."""

    def __init__(self, *, slots: int, slot_bytes: int, reclaim_s: float) -> None:
        self.slot_bytes, self.reclaim_s = slot_bytes, reclaim_s
        self.segment: RowSlots | None = None
        self.retired: RowSlots | None = None
        """The previous registration's segment, kept until the next one: a message built for it may still go."""
        self.token: str | None = None
        """The registration the segment is for (a new registration gets a new segment)."""
        self.taken_at = np.zeros(slots)
        """Monotonic time each slot was last taken (one per slot of a segment)."""
        self.failed = False
        """The segment could not be made (said once): every message carries its payload."""
        self.said_lost = False
        """Slots were out for ``reclaim_s`` and that was said (once per segment)."""
        self.renew_due = False
        """The next message gets a new segment (``renew``)."""

    @classmethod
    def for_messages(cls, network: NetworkSection, *, hwm: int, message_bytes: int) -> SharedRowsOut | None:
        """The slots of a host whose data socket has high-water mark ``hwm`` and whose full messages hold
        ``message_bytes`` (None: smaller than network.shared_rows_min_bytes, the rows go in the messages)."""
        if message_bytes < network.shared_rows_min_bytes:
            return None
        return cls(slots=2 * hwm, slot_bytes=message_bytes, reclaim_s=RECLAIM_PEER_TIMEOUTS * network.peer_timeout_s)

    def take(self, token: str | None, now: float) -> Slot | str | None:
        """A slot for the next message, WAIT, or None: send the payload in the message."""
        segment = self._segment(token)
        if segment is None:
            return None
        taken = segment.take()
        if taken is not None:
            self.taken_at[taken[0]] = now
            return Slot(segment, *taken)
        if now - self.taken_at.min() < self.reclaim_s:
            return WAIT
        if not self.said_lost:
            self.said_lost = True
            print(f"actors: no shared-memory rows slot came back from the learner for {self.reclaim_s:g} s (it read no "
                  f"rows, or messages were lost on the way): rows go to it inside the messages until slots come back",
                  flush=True)
        return None

    def renew(self) -> None:
        """The data socket was routed to other learner ranks, which drops the messages queued for a rank it left
        (their slots never come back): the next message takes a slot of a new segment, the current one is kept
        until the one after, as at a new registration."""
        self.renew_due = True

    def close(self) -> None:
        """Unlink the segments (a learner still reading one keeps its mapping until it lets go)."""
        for segment in (self.segment, self.retired):
            if segment is not None:
                segment.close()
        self.segment, self.retired, self.token = None, None, None

    def _segment(self, token: str | None) -> RowSlots | None:
        if self.failed:
            return None
        if self.segment is not None and token == self.token and not self.renew_due:
            return self.segment
        self.renew_due = False
        if self.retired is not None:
            self.retired.close()
        self.retired, self.segment = self.segment, None  # a message built before may still name it
        try:
            self.segment = RowSlots.create(len(self.taken_at), self.slot_bytes)
        except OSError as err:
            self.failed = True
            print(f"actors: cannot make a shared-memory rows segment of {len(self.taken_at)} x {self.slot_bytes} "
                  f"bytes in /dev/shm ({err.strerror}): rows go to the learner inside the messages", flush=True)
            return None
        self.token = token
        self.taken_at[:] = 0.0
        self.said_lost = False
        return self.segment
