"""The chaos run (ops/chaos/chaos.py) end to end, with pauses and a partition past a shortened network.peer_timeout_s:
one training run through a learner SIGSTOP, a partition, a host SIGSTOP, a hung env, a damaged newest checkpoint
and a full disk, each recovered from or stopped cleanly (the script exits 1 when a case fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import NFT, missing_requirements
from tests.processes import REPO

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(missing_requirements() is not None or not Path(NFT).exists(),
                                 reason=missing_requirements() or "nftables' nft is missing (ops/setup.sh installs it)")]


def test_the_chaos_run_recovers_from_every_case(tmp_path):
    done = subprocess.run([sys.executable, "ops/chaos/chaos.py", "--peer-timeout-s", "4", "--pause-s", "6",
                           "--partition-s", "6", "--keep", str(tmp_path / "logs")], cwd=REPO, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "| ok |" in line]
    cases = ("learner SIGSTOP", "partition", "actor host SIGSTOP", "env step that never returns",
             "damaged newest checkpoint", "disk full")
    assert all(any(case in row for row in rows[-6:]) for case in cases), out
    assert "No space left on device; stopping" in out and "is damaged (model.safetensors: sha256 mismatch)" in out
    assert not (tmp_path / "logs" / "disk").is_mount(), "the chaos run's tmpfs must be unmounted"
