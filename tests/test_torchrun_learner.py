"""The data-parallel learner for real (issue 15): torchrun starts two learner ranks (gloo on CPU), real actor hosts
push rows over real ZeroMQ sockets to the ranks rank 0 routes them to."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.same_machine import remove_stale_ipc_files
from tests.processes import REPO, alive, descendants, free_ports, kill_tree, metrics, shm_segments, start, wait_for

pytestmark = pytest.mark.integration

RANKS = 2


def rank_pid(torchrun: subprocess.Popen, rank: int) -> int | None:
    """The pid of learner rank ``rank`` under ``torchrun`` (from its environment), None before it started."""
    for pid in descendants(torchrun.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"learner" in cmdline:
            return pid
    return None


class RankedRun:
    """torchrun with two learner ranks plus actor hosts, cleaned up whatever happens."""

    def __init__(self, tmp_path: Path, *overrides: str, config: str = "configs/cartpole.yaml") -> None:
        self.tmp = tmp_path
        self.port = free_ports(4 + RANKS)  # control, data, weights, metrics; rank 1's data at port + 4
        self.run_dir = tmp_path / "run"
        self.procs: list[subprocess.Popen] = []
        self.pids: set[int] = set()
        args = ["--config", config, "--run-dir", str(self.run_dir), "--plain",
                "--set", f"network.port={self.port}", *[part for o in overrides for part in ("--set", o)]]
        handle = (tmp_path / "learner.log").open("w")
        self.torchrun = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
             # torchrun looks at its ranks every 5 s (not 0.1): a killed rank is first named by rank 0 (3 s heartbeat)
             "--monitor-interval", "5",
             "-m", "learner", *args], cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.procs.append(self.torchrun)

    def actors(self, n: int, log: str) -> subprocess.Popen:
        proc = start("actors", "--n", str(n), "--learner", f"tcp://127.0.0.1:{self.port}", log=self.tmp / log)
        self.procs.append(proc)
        return proc

    def note_processes(self) -> None:
        """Remember every process started so far (to check later that none is left)."""
        for proc in self.procs:
            self.pids |= descendants(proc.pid) | {proc.pid}

    def log(self, name: str = "learner.log") -> str:
        return (self.tmp / name).read_text()

    def updates(self) -> int:
        return len(metrics(self.run_dir))

    def assert_clean(self) -> None:
        self.note_processes()
        for proc in self.procs:
            assert proc.poll() is not None, f"process {proc.args} still running"
        assert wait_for(lambda: not any(alive(pid) for pid in self.pids), 10), "orphan processes"
        assert not any(shm_segments(pid) for pid in self.pids), "leaked shared memory"

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc)


@pytest.fixture
def ranked(tmp_path, request):
    run = RankedRun(tmp_path, *getattr(request, "param", ()))
    yield run
    run.close()


@pytest.mark.slow
def test_two_ranks_and_two_actor_hosts_solve_cartpole(ranked):
    """Each host is routed to its own rank; the ranks' updates together solve CartPole."""
    first, second = ranked.actors(2, "a1.log"), ranked.actors(2, "a2.log")
    assert ranked.torchrun.wait(timeout=400) == 0, ranked.log()
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    out = ranked.log()
    assert "learner rank 1 of 2: data socket bound, 256 rows per batch" in out  # segments 512 over 2 ranks
    assert "solved: mean return" in out and "learner rank 1: stopped (target return reached)" in out
    # the first host to join fed both ranks until the second came; then each fed its own rank
    assert "rows to learner ranks [0, 1]" in out and re.search(r"rows to learner ranks \[[01]\]", out)
    assert "rows now go to" in ranked.log("a1.log") + ranked.log("a2.log")
    records = metrics(ranked.run_dir)
    assert records[-1]["episode_return_mean"] >= 475
    # rank 0 counts what both ranks' hosts reported: every row of every update
    assert records[-1]["rows_received"] >= 512 * len(records)
    assert all(r["rank0_rows_wait_s"] >= 0 and r["rank1_rows_wait_s"] >= 0 for r in records)
    assert [r["update"] for r in records] == list(range(1, len(records) + 1))
    assert list((ranked.run_dir / "checkpoints").glob("update_*/model.safetensors"))
    ranked.assert_clean()


@pytest.mark.parametrize("ranked", [("trainer.target_episode_return=null",)], indirect=True)
@pytest.mark.slow
def test_hosts_are_rebalanced_when_one_leaves(ranked):
    """One host feeds both ranks; a second takes one rank; when the first leaves, the second feeds both again and
    training goes on."""
    first = ranked.actors(1, "a1.log")
    assert wait_for(lambda: ranked.updates() >= 3, 180), ranked.log()
    assert "rows to learner ranks [0, 1]" in ranked.log()  # one host, two ranks: it feeds both
    second = ranked.actors(1, "a2.log")
    assert wait_for(lambda: "rows now go to" in ranked.log("a1.log"), 60), ranked.log("a1.log")
    ranked.note_processes()
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 143  # 128 + SIGTERM: a host a signal stopped exits as the learner does
    assert wait_for(lambda: "left" in ranked.log(), 30)
    assert wait_for(lambda: "rows now go to" in ranked.log("a2.log"), 60), ranked.log("a2.log")
    after_leave = ranked.updates()
    assert wait_for(lambda: ranked.updates() >= after_leave + 3, 120), ranked.log()
    ranked.torchrun.send_signal(signal.SIGTERM)
    assert ranked.torchrun.wait(timeout=60) != 0  # torchrun reports the ranks a signal stopped
    assert second.wait(timeout=30) == 0, ranked.log("a2.log")
    assert "final checkpoint in" in ranked.log()
    ranked.assert_clean()


@pytest.mark.parametrize("ranked", [("trainer.target_episode_return=null",)], indirect=True)
def test_a_killed_rank_ends_the_run_cleanly_naming_it(ranked):
    """SIGKILL on rank 1: the run ends within the timeout, the message names rank 1, actor hosts are told to stop,
    nothing is left behind."""
    host = ranked.actors(2, "a1.log")
    assert wait_for(lambda: ranked.updates() >= 3, 180), ranked.log()
    ranked.note_processes()
    pid = rank_pid(ranked.torchrun, 1)
    assert pid is not None
    # one host feeds both ranks, each over its unix socket (the ranks and the host share this machine)
    assert (f"rows go to the learner over ipc:///tmp/sluice_{rank_pid(ranked.torchrun, 0)}_data0, "
            f"ipc:///tmp/sluice_{pid}_data1 (same machine)") in ranked.log("a1.log"), ranked.log("a1.log")
    os.kill(pid, signal.SIGKILL)
    assert ranked.torchrun.wait(timeout=90) != 0
    assert host.wait(timeout=60) == 0, ranked.log("a1.log")
    out = ranked.log()
    stopped = re.search(rf"learner: stopped \(learner rank 1 \(pid {pid}\) has ended\); (final|last) checkpoint in",
                        out)
    assert stopped is not None, out  # rank 0 names the rank
    # mid-update (most of rank 0's time is the update's collectives) the half-done update is not checkpointed; between
    # updates rank 0's last update completed on both ranks, so it is the final checkpoint
    cut_short = "no final checkpoint (update" in out
    assert stopped.group(1) == ("last" if cut_short else "final"), out
    ranked.assert_clean()
    # SIGKILL left rank 1's socket file (rank 0 removed its own); the next learner's start removes it, as here
    assert Path(f"/tmp/sluice_{pid}_data1") in remove_stale_ipc_files()


def test_a_batch_that_does_not_split_over_the_ranks_stops_every_rank_with_the_numbers(tmp_path):
    """Each rank checks the rank plan before it joins the others: one line with the numbers, exit 2."""
    env = {**os.environ, "WORLD_SIZE": "3", "RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "learner", "--config", "configs/cartpole.yaml", "--run-dir",
                           str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("python -m learner: error: segments (512) must be divisible by the learner ranks "
                                   "(3) so every rank holds the same share: remainder 2; change trainer.batch_size "
                                   "or the rank count")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_coma_trains_on_two_ranks(tmp_path):
    """COMA under torchrun: each rank keeps its host's transitions and draws half of every gradient step from them;
    rank 0 reports the whole batch (both ranks' transitions) and the averaged losses."""
    run = RankedRun(tmp_path, "trainer.total_timesteps=24000", "coma.epochs=2", config="configs/coma_spread.yaml")
    try:
        host = run.actors(1, "a1.log")
        assert run.torchrun.wait(timeout=300) == 0, run.log()
        assert host.wait(timeout=30) == 0, run.log("a1.log")
        out = run.log()
        assert "learner rank 1 of 2: data socket bound, 40 rows per batch" in out  # 80 team rows over 2 ranks
        records = metrics(run.run_dir)
        assert len(records) >= 2
        for record in records:  # 2000 env steps per update, 2 epochs of ceil(2000 / 64) steps
            assert record["transitions_added"] == 2000 and record["gradient_steps"] == 64
            assert math.isfinite(record["critic_loss"]) and math.isfinite(record["actor_loss_0"])
        assert list((run.run_dir / "checkpoints").glob("update_*/replay.safetensors"))
        run.assert_clean()
    finally:
        run.close()
