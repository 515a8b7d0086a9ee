"""ops/bench/gpu_check.sh on a machine without a GPU: it says so in one line and exits 2, writing nothing."""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.processes import REPO

pytestmark = pytest.mark.integration


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_check_says_it_needs_a_gpu(tmp_path) -> None:
    result = subprocess.run(["bash", str(REPO / "ops" / "bench" / "gpu_check.sh")], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.strip() == "gpu_check.sh: torch sees no CUDA device; run this on a GPU machine"
    assert not list(tmp_path.iterdir())


def test_gpu_check_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(REPO / "ops" / "bench" / "gpu_check.sh")], check=True)
