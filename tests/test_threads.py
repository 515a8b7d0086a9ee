"""policies/threads.use_threads: run.torch_threads sizes torch's intra-op pool and the BLAS under NumPy's products
(an actor host's NumPy policy twin would otherwise run a BLAS thread per core beside its env workers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from policies.threads import use_threads
from tests.processes import REPO

REPORT = ("import numpy, threadpoolctl, torch\n"
          "from policies.threads import use_threads\n"
          "use_threads(1)\n"
          "blas = sorted({pool['num_threads'] for pool in threadpoolctl.threadpool_info() if pool['user_api'] == 'blas'})\n"
          "print(torch.get_num_threads(), blas)\n")


@pytest.mark.integration  # a fresh process: the test's own thread counts stay as they are
def test_use_threads_sizes_torch_and_numpys_blas() -> None:
    done = subprocess.run([sys.executable, "-c", REPORT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "[1]"]  # NumPy's wheels bring OpenBLAS: a BLAS is there to size


def test_use_threads_refuses_fewer_than_one() -> None:
    with pytest.raises(ValueError, match="threads: 1 at least, got 0"):
        use_threads(0)
