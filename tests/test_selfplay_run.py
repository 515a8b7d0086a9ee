"""Self-play end to end with real processes: learner (serving the pool) + actor host on Connect Four, then the
ELO tool on the run's pool, and the standalone pool server answering an actor host's client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from actors.opponents import policy_from_file
from actors.pool_client import PoolClient, PoolError
from protocol import Limits
from protocol.endpoints import parse_endpoint
from tests.processes import REPO, Run, free_port_triple, metrics, start, wait_for

pytestmark = pytest.mark.integration

SMALL = ["--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
         "--set", "trainer.forward_pass_minibatch_target_size=32", "--set", "trainer.total_timesteps=40000",
         "--set", "selfplay.snapshot_interval=2", "--set", "selfplay.alternation_steps=40",
         "--set", "model.hidden_size=32"]


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path, *SMALL, config="configs/selfplay_connect4.yaml")
    yield r
    r.close()


@pytest.mark.slow
def test_selfplay_run_fills_the_pool_and_the_elo_tool_rates_it(run, tmp_path):
    run.train_to_the_end(2)
    records = metrics(run.run_dir)
    last = records[-1]
    assert last["pool_snapshots"] == 1 + len(records) // 2  # the initial weights, then every 2 updates
    assert abs(last["win_rate"] + last["draw_rate"] + last["loss_rate"] - 1) < 1e-9
    assert any(r["opponents_unique_mean"] for r in records)
    index = json.loads((run.run_dir / "pool" / "index.json").read_text())
    assert len(index["snapshots"]) == last["pool_snapshots"]
    assert int(run.log("actors.log").split("self-play: drew opponents ")[1].split(" times")[0]) >= 2  # alternated
    done = subprocess.run([sys.executable, "-m", "evaluation.elo", "--run-dir", str(run.run_dir), "--episodes", "20",
                           "--max-snapshots", "3", "--output-heatmap"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    elo = json.loads((run.run_dir / "elo" / "elo.json").read_text())
    assert elo["ratings"]["random"] == pytest.approx(1000.0)
    assert (run.run_dir / "elo" / "win_rate_heatmap.png").read_bytes()[:4] == b"\x89PNG"

    # the same pool, served standalone: an actor host's client gets opponents and verified snapshot files
    port = free_port_triple()
    server = start("learner.pool.server", "--run-dir", str(run.run_dir), "--bind", f"tcp://127.0.0.1:{port}",
                   log=tmp_path / "pool.log")
    try:
        assert wait_for(lambda: "serving on" in (tmp_path / "pool.log").read_text(), 30)
        client = PoolClient(parse_endpoint(f"tcp://127.0.0.1:{port}"), limits=Limits(), timeout_s=10, sender="t")
        assignment = client.opponents(16)
        assert len(assignment.digests) == 16 and max(assignment.indices) < last["pool_snapshots"]
        weights = policy_from_file(client.snapshot(assignment.digests[0]), assignment.digests[0])
        assert all(np.isfinite(w).all() for w in weights.values())
        with pytest.raises(PoolError, match="missing"):
            client.snapshot("0" * 64)
        client.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=5) as reply:  # --bind port + 1
            exposed = reply.read().decode()
        assert 'sluice_pool_requests_total{type="get_opponents"} 1.0' in exposed
        assert 'sluice_pool_requests_total{type="get_snapshot"} 1.0' in exposed
        assert 'sluice_pool_rejected_total{reason="not_found"} 1.0' in exposed
        assert f"sluice_pool_snapshots {float(last['pool_snapshots'])}" in exposed
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0


def test_pool_server_cli_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "learner.pool.server", "--run-dir", str(tmp_path / "nope")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a run directory" in done.stderr


def test_actors_pool_address_is_checked():
    done = subprocess.run([sys.executable, "-m", "actors", "--pool", "udp://x"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "python -m actors: error: --pool" in done.stderr


@pytest.mark.slow
def test_pool_survives_a_crash_and_resume(run):
    """The learner dies (SIGKILL) after snapshots past its last checkpoint; --resume retakes them once."""
    learner = run.learner("--set", "selfplay.snapshot_interval=1", "--set", "run.checkpoint_interval=3",
                          "--set", "trainer.total_timesteps=1000000")
    actors = run.actors(2)
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 5, 120), run.log("learner.log")
    learner.send_signal(signal.SIGKILL)
    learner.wait(timeout=10)
    before = json.loads((run.run_dir / "pool" / "index.json").read_text())["snapshots"]
    resumed = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                    "--set", "trainer.total_timesteps=30000", log=run.tmp / "resumed.log")
    run.procs.append(resumed)
    assert resumed.wait(timeout=120) == 0, run.log("resumed.log")
    assert actors.wait(timeout=30) == 0, run.log("actors.log")
    after = json.loads((run.run_dir / "pool" / "index.json").read_text())["snapshots"]
    updates = [s["update"] for s in after]
    assert updates == sorted(set(updates)), updates  # every update once, in order
    assert updates[0] == 0 and len(after) >= len(before) - 2
    if before[-1]["update"] % 3:  # snapshots newer than the checkpoint resumed from were dropped, then retaken
        assert "dropped" in run.log("resumed.log")
    run.assert_clean()
