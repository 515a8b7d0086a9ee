"""Named shared-memory segments under /dev/shm with a 'sluice_' prefix, and typed array views into them.

Plain files in /dev/shm mapped with mmap: no resource tracker, no pickling. The creating process owns
and unlinks a segment; ``remove_stale_segments`` deletes segments whose owner PID is dead, so a crashed
host's leftovers are cleaned at the next start.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protocol.same_machine import owner_alive

SHM_DIR = Path("/dev/shm")
PREFIX = "sluice_"
ALIGN = 64


class SharedMemoryFull(OSError):
    """A segment's memory could not be reserved (a full /dev/shm): said at the start, not a SIGBUS at a first write."""


@dataclass(frozen=True, kw_only=True)
class FieldLayout:
    """One array inside a segment."""

    name: str
    """Field name."""
    shape: tuple[int, ...]
    """Array shape."""
    dtype: str
    """NumPy dtype name."""
    offset: int
    """Byte offset in the segment (64-byte aligned)."""


def plan_layout(fields: list[tuple[str, tuple[int, ...], str]]) -> tuple[list[FieldLayout], int]:
    """Aligned offsets for (name, shape, dtype) fields; returns the layout and the total size."""
    layout, offset = [], 0
    for name, shape, dtype in fields:
        layout.append(FieldLayout(name=name, shape=tuple(shape), dtype=dtype, offset=offset))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return layout, max(offset, ALIGN)


class ShmSegment:
    """A mapped /dev/shm file; ``views`` returns NumPy arrays backed by it."""

    def __init__(self, name: str, size: int, *, create: bool) -> None:
        if not name.startswith(PREFIX):
            raise ValueError(f"shared memory name {name!r} must start with {PREFIX!r}")
        self.name, self.size, self.owner = name, size, create
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                _reserve(fd, path, size)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    @classmethod
    def create(cls, name: str, size: int) -> "ShmSegment":
        """Create (and own) a new segment."""
        return cls(name, size, create=True)

    @classmethod
    def attach(cls, name: str, size: int) -> "ShmSegment":
        """Map an existing segment."""
        return cls(name, size, create=False)

    def views(self, layout: list[FieldLayout]) -> dict[str, np.ndarray]:
        """Arrays over the segment, one per field."""
        return {f.name: np.ndarray(f.shape, dtype=f.dtype, buffer=self._mmap, offset=f.offset) for f in layout}

    def close(self) -> None:
        """Unmap; the owner also unlinks the file. Views must be dropped first."""
        try:
            self._mmap.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes away with the process
        if self.owner:
            unlink(self.name)


def _reserve(fd: int, path: Path, size: int) -> None:
    """Give a new segment file its ``size`` bytes of memory now (``ftruncate`` would leave them to the first write of
    each page, which a full /dev/shm answers with SIGBUS); SharedMemoryFull, the file removed, when they are not
    there."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        path.unlink(missing_ok=True)
        raise SharedMemoryFull(err.errno, f"cannot reserve {size / 1e6:.1f} MB of shared memory for {path}: "
                                          f"{err.strerror} (free some, or give {path.parent} more room, e.g. "
                                          f"docker run --shm-size)") from None


def unlink(name: str) -> None:
    """Remove a segment file if it exists."""
    try:
        (SHM_DIR / name).unlink()
    except FileNotFoundError:
        pass


def segment_name(owner_pid: int, purpose: str) -> str:
    """sluice_<pid>_<purpose>: the owner PID in the name makes stale segments findable."""
    return f"{PREFIX}{owner_pid}_{purpose}"


def remove_stale_segments() -> list[str]:
    """Unlink sluice segments whose owner process no longer exists; returns their names."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        pid_text = path.name[len(PREFIX):].split("_", 1)[0]
        if pid_text.isdigit() and not owner_alive(int(pid_text)):
            unlink(path.name)
            removed.append(path.name)
    return removed
