"""A benchmark stopped by SIGTERM mid-measurement cleans up as Ctrl-C does (ops.benchlib.run_stoppable): it exits with
143 and one line, and leaves no process it started (actor hosts and workers, learners, senders, ranks), no shared
memory and no temporary folder behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.processes import descendants

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")


def started(count: int, settle_s: float = 1.0) -> Callable[[int], bool]:
    """Ready once the bench has had ``count`` processes of its own running for ``settle_s``: mid-measurement, not in
    the instant a process is being started (a stop there can still lose the child, as any Python program can)."""
    since: list[float] = []

    def ready(pid: int) -> bool:
        if len(descendants(pid)) < count:
            since.clear()
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= settle_s
    return ready


BENCHES = {
    "pipeline": (["--envs", "grid3", "--async-factor", "2", "--pipeline-only", "--seconds", "120"], started(3)),
    "load": (["--hosts", "2", "--seconds", "120"], started(3)),
    "curve_cost": (["--seconds", "120"], started(1)),
    "learner_update": (["--ranks", "2", "--no-compile", "--updates", "100000"], started(2)),
    "message_cost": (["--configs", "configs/cartpole.yaml", "--messages", "60000", "--rounds", "100"], started(1)),
    "group_cost": (["--config", "configs/cartpole.yaml", "--calls", "20000", "--rounds", "100", "--step-us", "0"],
                   started(1, settle_s=5.0)),  # its handoff's sleeper, past the kernels' first compile
}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("name", list(BENCHES))
def test_a_bench_stopped_by_sigterm_leaves_nothing_behind(name: str, tmp_path: Path) -> None:
    args, ready = BENCHES[name]
    shm_before = set(SHM.glob("sluice_*"))
    tmp_before = set(Path("/tmp").glob("sluice*"))
    bench = subprocess.Popen([sys.executable, "-m", f"ops.bench.{name}", *args], cwd=REPO, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "TMPDIR": str(tmp_path)})
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while not ready(bench.pid):
            assert bench.poll() is None, bench.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"{name} never got going"
            time.sleep(0.05)
        seen = descendants(bench.pid)
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in seen) and time.monotonic() < deadline:  # an exiting child's last moments
        time.sleep(0.1)
    left = sorted(pid for pid in seen if alive(pid))
    for pid in left:  # cleaned up before any assertion, so that a failure leaves nothing running either
        os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 143, stderr[-3000:]
    assert f"{name}: stopped by SIGTERM" in stderr
    assert not left, f"{name} left processes {left} running"
    assert set(SHM.glob("sluice_*")) <= shm_before
    assert set(Path("/tmp").glob("sluice*")) <= tmp_before
    assert not [entry for entry in tmp_path.iterdir() if not entry.name.startswith("torchinductor_")]  # torch's cache
