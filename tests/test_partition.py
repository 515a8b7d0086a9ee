"""A real network partition between two namespaces: the learner in one, an actor host in the other, the link cut
both ways by nftables for longer than network.peer_timeout_s, then healed. Training must resume within a bound.

Before sessions were idempotent this stalled for good: the REGISTERs the host queued while cut off each minted a
new token on arrival, the host kept the first, and the learner refused every ROWS message after as not_registered.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.netns import NFT, NamespacePair, missing_requirements
from tests.processes import kill_tree, metrics, wait_for

PORT = 5555
PARTITION_S = 6.0
"""How long the link is cut (three peer timeouts)."""
RESUME_BOUND_S = 30.0
"""Seconds from the heal to three more updates (docs/OPERATIONS.md's bound for a partition)."""

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(missing_requirements() is not None or not Path(NFT).exists(),
                                 reason=missing_requirements() or "nftables' nft is missing (ops/setup.sh installs it)")]


@pytest.fixture
def pair():
    namespaces = NamespacePair()
    namespaces.procs: list[subprocess.Popen] = []
    yield namespaces
    for proc in namespaces.procs:
        if proc.poll() is None:
            kill_tree(proc)
    namespaces.remove()


def test_training_resumes_after_a_partition_longer_than_the_peer_timeout_heals(pair, tmp_path):
    run_dir = tmp_path / "run"
    learner = pair.python(pair.learner_ns, "learner", "--config", "configs/cartpole.yaml", "--run-dir", str(run_dir),
                          "--set", f"network.host={pair.learner_ip}", "--set", f"network.port={PORT}",
                          "--set", "trainer.target_episode_return=null", "--set", "network.peer_timeout_s=2",
                          "--set", "network.heartbeat_interval_s=0.25",
                          "--insecure", log=tmp_path / "learner.log")
    host = pair.python(pair.host_ns, "actors", "--n", "1", "--learner", f"tcp://{pair.learner_ip}:{PORT}",
                       "--insecure", log=tmp_path / "host.log")
    pair.procs += [learner, host]

    def logs() -> str:
        return (tmp_path / "learner.log").read_text()[-3000:] + (tmp_path / "host.log").read_text()[-3000:]

    assert wait_for(lambda: len(metrics(run_dir)) >= 5, 120), logs()
    assert "over ipc" not in (tmp_path / "host.log").read_text()  # another network namespace: TCP, which is cut
    pair.partition()
    try:
        time.sleep(PARTITION_S)
        assert "silent for 2 s: forgotten" in (tmp_path / "learner.log").read_text(), logs()
        during = len(metrics(run_dir))
    finally:
        pair.heal()
    healed = time.monotonic()
    assert wait_for(lambda: len(metrics(run_dir)) >= during + 3, RESUME_BOUND_S), logs()
    print(f"updates resumed {time.monotonic() - healed:.1f} s after the partition healed")
    assert "registered again" in (tmp_path / "host.log").read_text()
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143, logs()
    assert host.wait(timeout=30) == 0, logs()
