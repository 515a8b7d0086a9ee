"""protocol.message_memory: the allocator tuning takes on glibc (this project's Linux machines) and is harmless."""

from __future__ import annotations

import platform

import numpy as np

from protocol.message_memory import keep_freed_memory


def test_keep_freed_memory_takes_on_glibc_and_large_arrays_still_work():
    assert keep_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    for size in (1 << 20, 8 << 20, 100 << 20):  # below and above the mmap threshold
        block = np.ones(size, dtype=np.uint8)
        assert int(block.sum()) == size
