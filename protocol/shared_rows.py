"""Rows through shared memory to a learner on the host's machine: the host writes each ROWS message's packed payload
(protocol/framing.py) into a slot of its own /dev/shm segment, and the message on the data socket carries only the
header and, in its ``shared`` field, where the payload lies. The learner reads the payload there, copies the rows into
its batch, and hands the slot back by writing its sequence number into the segment. No payload byte crosses the
socket: the host's ZeroMQ IO thread and the learner's receive no longer copy it.

A segment (``sluice_<pid>_rows_<16 hex>``: the owner's pid for the stale-segment sweep, a random part that another
machine cannot guess) holds a header, two arrays of int64 sequence numbers and the slots::

    0       b"sluiceR1", slots, slot_bytes, data_offset   (uint64 each after the magic)
    64      sent[slots]   written by the host only: the sequence number of the payload the slot holds
    ...     done[slots]   written by a learner only: the sequence number of the payload it read (own cache lines)
    data    slot i at data_offset + i * slot_stride (page-aligned)

A slot is the host's to fill when ``done == sent``; the host sets ``sent`` before it writes and sends, the learner sets
``done`` after it copied the rows out. One writer per word, so no atomics are needed; a full fence stands before the
learner's ``done`` store and after the host's look at it (protocol/memory_fence.py), so on ARM too no read of a slot
passes its handback; a reference whose ``seq`` the slot no longer holds is refused. A host makes a new segment for
every registration, so a learner that died or forgot the host never hands back a slot of the segment in use. A host
that finds no free slot waits, as for a full socket; only when none came back for several peer timeouts (a message
lost on the way) does it send payloads on the socket as before (actors/shared_rows_out.py): a slot that is never
handed back costs speed, never a stall.

Only a learner on the same machine, under the same user, reads a segment (``RowSlots.open`` checks the owner); such a
process can read the host's memory anyway, so the payload is validated in place, as a socket's would be, and copied.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .framing import ALLOWED_DTYPES, PackedLayout, checked_layout
from .memory_fence import full_fence
from .messages import ProtocolError

SHM_DIR = Path("/dev/shm")
"""Where the segments live (the same tmpfs as the hosts' slot segments)."""
SEGMENT_NAME = re.compile(r"^sluice_(\d+)_rows_[0-9a-f]{16}$")
"""A rows segment's name: the owner's pid and a random part."""
MAGIC = b"sluiceR1"
"""A rows segment's first bytes (R1: the layout of this module)."""
MAX_SLOTS = 1024
"""Most slots a segment may declare."""
MAX_SLOT_BYTES = 1 << 31
"""Most bytes a slot may declare (a ROWS message is smaller: network.max_message_bytes)."""
PAGE = mmap.PAGESIZE
MAX_LAYOUT_ARRAYS = 64
"""Most arrays a ``shared.layout`` may list (ROWS messages carry 14)."""
REF_KEYS: dict[str, type] = {"segment": str, "slot": int, "seq": int, "nbytes": int, "layout": str}
"""A ROWS message's ``shared`` field: the segment, the slot and its sequence number, the payload's length and its
arrays in one string (``PackedLayout.key``: a header's list of descriptor maps costs each side ~100 us a message to
check, one string nothing, and a learner reads each distinct one once)."""


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class SlotsGeometry:
    """Where a segment of ``slots`` slots of ``slot_bytes`` each puts everything."""

    slots: int
    slot_bytes: int

    @property
    def done_offset(self) -> int:
        return 64 + _round_up(8 * self.slots, 64)

    @property
    def data_offset(self) -> int:
        return _round_up(self.done_offset + 8 * self.slots, PAGE)

    @property
    def slot_stride(self) -> int:
        return _round_up(self.slot_bytes, PAGE)

    @property
    def total(self) -> int:
        return self.data_offset + self.slots * self.slot_stride


@dataclass(frozen=True, slots=True)
class SharedRef:
    """A ROWS message's ``shared`` field, read and checked for form."""

    segment: str
    slot: int
    seq: int
    nbytes: int
    layout: str

    def to_field(self) -> dict[str, Any]:
        return {"segment": self.segment, "slot": self.slot, "seq": self.seq, "nbytes": self.nbytes,
                "layout": self.layout}


def read_layout_key(key: str) -> PackedLayout:
    """The layout whose ``PackedLayout.key`` is ``key``, checked as a header's array descriptors are; ProtocolError
    (``bad_shared``) otherwise."""
    parts = key.split(";") if key else []
    if len(parts) > MAX_LAYOUT_ARRAYS:
        raise ProtocolError("bad_shared", f"shared.layout lists {len(parts)} arrays, at most {MAX_LAYOUT_ARRAYS}")
    specs = []
    for i, part in enumerate(parts):
        fields = part.split(":")
        if len(fields) != 3:
            raise ProtocolError("bad_shared", f"shared.layout part {i} {part!r:.60} is not name:dtype:shape")
        name, dtype, dims = fields
        try:
            shape = [int(dim) for dim in dims.split(",")] if dims else []
        except ValueError:
            raise ProtocolError("bad_shared", f"shared.layout part {i}: shape {dims!r:.40} is not integers") from None
        itemsize = np.dtype(dtype).itemsize if dtype in ALLOWED_DTYPES else 0
        specs.append({"name": name, "dtype": dtype, "shape": shape, "nbytes": math.prod(shape) * itemsize})
    try:
        return checked_layout(specs)
    except ProtocolError as err:
        raise ProtocolError("bad_shared", f"shared.layout: {err.message}") from None


def payload_arrays(layout: PackedLayout, payload: memoryview) -> dict[str, np.ndarray]:
    """The arrays of a payload of ``layout`` (exactly ``layout.total`` bytes), as views of it."""
    return {name: np.ndarray(shape, dtype=dtype, buffer=payload, offset=offset)
            for name, dtype, shape, offset in zip(layout.names, layout.dtypes, layout.shapes, layout.offsets)}


def read_ref(value: Any) -> SharedRef:
    """A ``shared`` field as a SharedRef; ProtocolError (``bad_shared``) naming what is wrong with its form."""
    if not isinstance(value, dict) or set(value) != set(REF_KEYS):
        raise ProtocolError("bad_shared", f"field 'shared' must be a map of {sorted(REF_KEYS)}")
    for key, kind in REF_KEYS.items():
        if type(value[key]) is not kind:
            raise ProtocolError("bad_shared", f"shared.{key} must be {kind.__name__}, got {type(value[key]).__name__}")
    if not SEGMENT_NAME.match(value["segment"]):
        raise ProtocolError("bad_shared", f"shared.segment {value['segment']!r:.80} is not a rows segment's name")
    if value["slot"] < 0 or value["seq"] < 1 or value["nbytes"] < 0:
        raise ProtocolError("bad_shared", "shared.slot, shared.seq and shared.nbytes must be >= 0, >= 1 and >= 0")
    return SharedRef(**value)


class RowSlots:
    """One mapped rows segment: ``create`` (the host, which owns and unlinks it) or ``open`` (a learner)."""

    def __init__(self, path: Path, fd: int, geometry: SlotsGeometry, *, owner: bool) -> None:
        self.path, self.name, self.geometry, self.owner = path, path.name, geometry, owner
        try:
            self._map: mmap.mmap | None = mmap.mmap(fd, geometry.total)
        finally:
            os.close(fd)
        self.sent = np.ndarray(geometry.slots, dtype=np.int64, buffer=self._map, offset=64)
        """The sequence number each slot's payload carries (the host writes it)."""
        self.done = np.ndarray(geometry.slots, dtype=np.int64, buffer=self._map, offset=geometry.done_offset)
        """The sequence number of the payload a learner last read from each slot (the learner writes it)."""
        self._next_seq = 1

    @classmethod
    def create(cls, slots: int, slot_bytes: int, directory: Path = SHM_DIR) -> RowSlots:
        """A new segment of ``slots`` free slots of ``slot_bytes``, its memory reserved now: a full /dev/shm is an
        OSError here, not a SIGBUS at the first write."""
        if not 1 <= slots <= MAX_SLOTS or not 1 <= slot_bytes <= MAX_SLOT_BYTES:
            raise ValueError(f"slots 1..{MAX_SLOTS} and slot_bytes 1..{MAX_SLOT_BYTES}, got {slots}, {slot_bytes}")
        geometry = SlotsGeometry(slots, slot_bytes)
        name = f"sluice_{os.getpid()}_rows_{secrets.token_hex(8)}"
        path = directory / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, geometry.total)
            header = MAGIC + np.array([slots, slot_bytes, geometry.data_offset], dtype="<u8").tobytes()
            os.pwrite(fd, header, 0)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, fd, geometry, owner=True)

    @classmethod
    def open(cls, name: str, directory: Path = SHM_DIR) -> RowSlots:
        """A host's segment, mapped for reading; ProtocolError (``bad_shared``) when it is not a rows segment of
        this user's that this process can map."""
        if not SEGMENT_NAME.match(name):
            raise ProtocolError("bad_shared", f"{name!r:.80} is not a rows segment's name")
        try:
            fd = os.open(directory / name, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as err:
            raise ProtocolError("bad_shared", f"cannot open rows segment {name}: {err.strerror} (a learner reads "
                                              f"rows through shared memory only on the host's machine)") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise ProtocolError("bad_shared", f"rows segment {name} is not a file of this user's")
            head = os.pread(fd, 32, 0)
            if len(head) < 32 or head[:8] != MAGIC:
                raise ProtocolError("bad_shared", f"rows segment {name} does not start as one ({MAGIC!r})")
            slots, slot_bytes, data_offset = (int(v) for v in np.frombuffer(head[8:], dtype="<u8"))
            if not 1 <= slots <= MAX_SLOTS or not 1 <= slot_bytes <= MAX_SLOT_BYTES:
                raise ProtocolError("bad_shared", f"rows segment {name} declares {slots} slots of {slot_bytes} bytes")
            geometry = SlotsGeometry(slots, slot_bytes)
            if data_offset != geometry.data_offset or info.st_size != geometry.total:
                raise ProtocolError("bad_shared", f"rows segment {name} has {info.st_size} bytes, its header "
                                                  f"says {geometry.total}")
        except BaseException:
            os.close(fd)
            raise
        return cls(directory / name, fd, geometry, owner=False)

    def payload_buffer(self, slot: int) -> np.ndarray:
        """Slot ``slot``'s bytes, writable (the host fills it)."""
        start = self.geometry.data_offset + slot * self.geometry.slot_stride
        return np.ndarray(self.geometry.slot_bytes, dtype=np.uint8, buffer=self._map, offset=start)

    def take(self) -> tuple[int, int] | None:
        """A free slot and the sequence number its payload gets, marked sent (the host's side); None when every
        slot still waits for a learner."""
        free = np.flatnonzero(self.sent == self.done)
        if len(free) == 0:
            return None
        slot, seq = int(free[0]), self._next_seq
        self._next_seq += 1
        self.sent[slot] = seq
        full_fence()  # the learner's reads of this slot, before its ``done``, end before the host writes it again
        return slot, seq

    def free_slots(self) -> int:
        """Slots the host may fill now."""
        return int(np.count_nonzero(self.sent == self.done))

    def payload(self, ref: SharedRef) -> memoryview:
        """The payload ``ref`` names, read-only (a learner's side); ProtocolError when the segment does not hold it."""
        if ref.slot >= self.geometry.slots or ref.nbytes > self.geometry.slot_bytes:
            raise ProtocolError("bad_shared", f"slot {ref.slot} of {ref.nbytes} bytes is outside rows segment "
                                              f"{self.name} ({self.geometry.slots} slots of "
                                              f"{self.geometry.slot_bytes} bytes)")
        if self.sent[ref.slot] != ref.seq or self.done[ref.slot] == ref.seq:
            raise ProtocolError("bad_shared", f"slot {ref.slot} of rows segment {self.name} does not hold payload "
                                              f"{ref.seq} (it holds {int(self.sent[ref.slot])})")
        assert self._map is not None
        start = self.geometry.data_offset + ref.slot * self.geometry.slot_stride
        return memoryview(self._map)[start:start + ref.nbytes].toreadonly()

    def release(self, ref: SharedRef) -> None:
        """Hand ``ref``'s slot back to the host (a learner's side, once the rows are copied out)."""
        if self.sent[ref.slot] == ref.seq:
            full_fence()  # the rows are read out before the host may see the slot free (ARM may reorder otherwise)
            self.done[ref.slot] = ref.seq

    def close(self) -> None:
        """Unlink the segment (the owner) and drop this mapping; the memory goes when the last view of it does."""
        if self.owner:
            self.path.unlink(missing_ok=True)
            self.owner = False
        self._map = None
        self.sent = self.done = np.zeros(0, dtype=np.int64)  # no slot is free any more
