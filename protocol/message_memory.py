"""Keeping freed memory for the next message: glibc's allocator tuned once per process that moves ROWS messages.

An actor host gathers each ROWS message into fresh multi-MB arrays and the learner's ingest decodes each into
others. By default glibc serves such sizes from their own ``mmap`` (or trims them off the heap top when freed),
so every message's pages are faulted in anew. ``keep_freed_memory`` raises the mmap threshold to
``MMAP_THRESHOLD_BYTES`` and the trim threshold to ``TRIM_THRESHOLD_BYTES``: freed message buffers stay in the heap
and the next message reuses their pages. Measured with ``python -m ops.bench.pipeline --envs grid3
--async-factor 2 --pipeline-only`` (2-core Intel Xeon VM, the same settings given as MALLOC_*_ environment
variables, two interleaved pairs): host CPU 1.50 / 1.50 -> 1.28 / 1.31 us per agent step. The cost is up to
``TRIM_THRESHOLD_BYTES`` of freed heap a process keeps instead of returning it. Elsewhere than glibc: nothing.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
"""glibc's mallopt parameter numbers (malloc.h)."""
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 64 << 20
"""Allocations below this come from the heap (a ROWS message's arrays are a few MB)."""
TRIM_THRESHOLD_BYTES = 256 << 20
"""Freed memory at the heap's top kept for reuse, up to this much."""


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says; False where the C library is not glibc (nothing done)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the process's own symbols: glibc's mallopt among them
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
