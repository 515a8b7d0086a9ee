"""The threads of a process's numeric libraries: torch's intra-op pool and the BLAS under NumPy's matrix products.

``run.torch_threads`` sizes both, in the learner and on every actor host (``use_threads``). Left alone, NumPy's
OpenBLAS runs one thread per core for any product above its size threshold (about 262k multiply-adds), and its idle
threads spin before they sleep: on an actor host, whose cores belong to its env workers, the NumPy twin of a small
policy (``actors/small_mlp.py``) then took a second core for no gain (``python -m ops.bench.group_cost --policy
model``, docs/RESULTS.md).
"""

from __future__ import annotations

import threadpoolctl
import torch


def use_threads(count: int) -> None:
    """From now on in this process: ``count`` torch intra-op threads, and ``count`` threads in each BLAS library
    loaded (OpenBLAS, MKL, BLIS: ``threadpoolctl``)."""
    if count < 1:
        raise ValueError(f"threads: 1 at least, got {count}")
    torch.set_num_threads(count)
    threadpoolctl.threadpool_limits(limits=count, user_api="blas")
