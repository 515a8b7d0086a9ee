"""The ingest's side of rows through shared memory (protocol/shared_rows.py): the hosts' segments it has mapped, each
bound to the registration that first named it, and the slot of the message in hand, handed back once its rows are
copied out (or the message is dropped).

A segment is mapped at the first message that names it and dropped once its registration is gone (the host said BYE,
was forgotten or registered anew: a new registration comes with a new segment), or once a third segment of its
registration is mapped (the host makes a new one when its learner ranks change, and keeps only the one before). A
segment named by another registration than the one it is bound to is refused while that one is registered, so a host
cannot hand back, or read, another host's slots; once it is gone, the segment goes to the registration that names it
(a message its host built before registering again).
"""

from __future__ import annotations

import time

import numpy as np

from learner.serve.senders import Sender, SenderRegistry
from protocol import Message, PackedLayout, ProtocolError
from protocol.memory_fence import full_fence
from protocol.shared_rows import RowSlots, SharedRef, payload_arrays, read_layout_key, read_ref

MAX_SEGMENTS = 4096
"""Most segments mapped at once (one per registered host; those of hosts that left are dropped first)."""
SWEEP_S = 5.0
"""How often segments of registrations that are gone are dropped."""
MAX_LAYOUTS = 256
"""Layouts kept read (one per row count a host sends; more, from hosts of other configs, start the cache over)."""
PER_REGISTRATION = 2
"""Segments mapped for one registration at most: a host keeps its current one and the one before (it makes a new one
when its learner ranks change); mapping another drops the one mapped first, which its host has let go."""


class SharedRowsReader:
    """Used by the ingest thread only."""

    def __init__(self, registry: SenderRegistry) -> None:
        self.registry = registry
        self.segments: dict[str, tuple[str, RowSlots]] = {}
        """Mapped segments by name: the token of the registration that named it first, and its mapping."""
        self.held: tuple[RowSlots, SharedRef] | None = None
        """The slot of the message in hand, until ``release``."""
        self.next_sweep = 0.0
        self.layouts: dict[str, PackedLayout] = {}
        """Each ``shared.layout`` met, read and checked once."""
        full_fence()  # compiled (or loaded from numba's cache) now, not at the first slot handed back

    def arrays(self, field: object, sender: Sender) -> dict[str, np.ndarray]:
        """The arrays of the payload a ROWS message's ``shared`` field names, as read-only views of the slot (held
        until ``release``); ProtocolError (``bad_shared``) when the field, the segment or the slot is not right."""
        ref = read_ref(field)
        slots = self._segment(ref.segment, sender)
        payload = slots.payload(ref)
        self.held = slots, ref
        layout = self._layout(ref.layout)
        if layout.total != ref.nbytes:
            raise ProtocolError("bad_shared", f"shared.nbytes is {ref.nbytes}, its layout's arrays need {layout.total}")
        return payload_arrays(layout, payload)

    def release(self) -> None:
        """Hand the slot of the message in hand back to its host (its rows are copied out, or dropped)."""
        if self.held is not None:
            slots, ref = self.held
            self.held = None
            slots.release(ref)

    def sweep(self, now: float) -> None:
        """Drop the segments of registrations that are gone (every SWEEP_S)."""
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_S
        for name, (token, slots) in list(self.segments.items()):
            if self.registry.get(token) is None:
                del self.segments[name]
                slots.close()

    def close(self) -> None:
        """Drop every mapping."""
        self.held = None
        for _, slots in self.segments.values():
            slots.close()
        self.segments.clear()

    def _layout(self, key: str) -> PackedLayout:
        layout = self.layouts.get(key)
        if layout is None:
            if len(self.layouts) >= MAX_LAYOUTS:
                self.layouts.clear()
            layout = self.layouts[key] = read_layout_key(key)
        return layout

    def _segment(self, name: str, sender: Sender) -> RowSlots:
        entry = self.segments.get(name)
        if entry is not None:
            if entry[0] != sender.token:
                if self.registry.get(entry[0]) is not None:
                    raise ProtocolError("bad_shared", f"rows segment {name} belongs to another registration")
                self.segments[name] = sender.token, entry[1]  # its host registered again (the old token is gone)
            return entry[1]
        if len(self.segments) >= MAX_SEGMENTS:
            self.next_sweep = 0.0
            self.sweep(time.monotonic())
            if len(self.segments) >= MAX_SEGMENTS:
                raise ProtocolError("bad_shared", f"{MAX_SEGMENTS} rows segments are mapped already")
        slots = RowSlots.open(name)
        own = [other for other, (token, _) in self.segments.items() if token == sender.token]
        for other in own[:len(own) - PER_REGISTRATION + 1]:
            self.segments.pop(other)[1].close()
        self.segments[name] = sender.token, slots
        return slots


def message_arrays(message: Message, sender: Sender | None, reader: SharedRowsReader | None) -> dict[str, np.ndarray]:
    """A ROWS message's arrays: those of its frames, or (its ``shared`` field names them) those in its host's shared
    memory, read by ``reader`` (held until ``reader.release``; None: this socket reads rows from the messages only)
    for ``sender``, the registration the message's token names; ProtocolError (``bad_shared``) otherwise."""
    if "shared" not in message.fields:
        return message.arrays
    if reader is None or sender is None:
        raise ProtocolError("bad_shared", "rows through shared memory go to a learner on the host's machine that "
                                          "announced shared_rows; this data socket reads them from the message")
    if message.arrays:
        raise ProtocolError("bad_shared", "a message whose payload is in shared memory has no array frame")
    return reader.arrays(message.fields["shared"], sender)
