"""The actor host's env workers (WorkerPool over real processes and shared memory): ready groups, an env that
raises (its traceback, with the user's file and line, on the host's stderr), a worker that dies (restarted after a
backoff that does not hold up the other workers, its agents forgotten; also between collect and wake) or dies in
a loop (fatal, naming the worker and its exit cause), and an env that cannot start (fatal, with the reason)."""

from __future__ import annotations

import inspect
import json
import os
import signal
import time

import pytest
import zmq

from actors.env_failures import EnvFailure
from actors.rows_report import RowsReport
from actors.slot_layout import SlotLayout
from actors.stop_flag import StopFlag
from actors import worker_pool
from actors.worker import WorkerPriority
from actors.worker_pool import MAX_DEATHS_IN_A_ROW, WorkerPool
from configs.env_config import EnvConfig
from envs.builtin.cartpole import CartPoleVec
from tests import faulty_envs
from tests.processes import shm_segments

pytestmark = pytest.mark.integration


def native(entry_point: str, **kwargs) -> EnvConfig:
    return EnvConfig(name="native", entry_point=f"tests.faulty_envs:{entry_point}", kwargs=kwargs)


def line_of(function, text: str) -> int:
    """The file line number of the first line of ``function`` that contains ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


class Pool:
    """A WorkerPool with its poller and what it reported, pumped like the host's loop does."""

    def __init__(self, env: EnvConfig, *, workers: int = 1, groups: int = 2,
                 priority: WorkerPriority = WorkerPriority()) -> None:
        self.poller = zmq.Poller()
        self.restarted: list[int] = []
        self.report = RowsReport()
        self.layout = SlotLayout(workers=workers, groups=groups, envs_per_group=2, agents_per_env=1)
        self.pool = WorkerPool(env_config=env, env_spec=CartPoleVec.SPEC, layout=self.layout, seed=0,
                               poller=self.poller, stop=StopFlag(), on_restart=self.restarted.append,
                               priority=priority)

    def pump(self, until, *, wake: bool = False, timeout: float = 60) -> None:
        """Collect replies (and, with ``wake``, step every ready group again) until ``until()``."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "the workers did not get there in time"
            self.pool.collect(self.pool.wait(100), self.report)
            if wake and self.pool.ready:
                batch = list(self.pool.ready)
                self.pool.ready.clear()
                self.pool.wake(batch)


def test_an_env_exception_shows_the_users_file_and_line_on_the_hosts_stderr(capfd):
    pool = Pool(native("FlakyCartPole", fail_every=3))
    try:
        pool.pump(lambda: pool.report.env_restarts >= 1, wake=True)
        error = pool.pool.last_env_error
    finally:
        pool.pool.stop()
    raised_at = line_of(faulty_envs.FlakyCartPole.step, "raise RuntimeError")
    assert error.error_type == "RuntimeError"
    assert error.location == f"{faulty_envs.__file__}:{raised_at}"
    assert "env 'native:tests.faulty_envs:FlakyCartPole' raised in step()" in error.message
    assert "flaky env: failing on step call 3" in error.message
    err = capfd.readouterr().err
    assert f'File "{faulty_envs.__file__}", line {raised_at}, in step' in err, err
    assert "RuntimeError: flaky env: failing on step call 3" in err
    assert "NoneType: None" not in err
    assert error.text().endswith(f"(RuntimeError at {error.location})")


def test_ready_groups_and_a_killed_worker_is_restarted_with_its_agents_forgotten():
    pool = Pool(EnvConfig(), workers=2)
    try:
        pool.pump(lambda: len(pool.pool.ready) == 4)
        assert sorted((v.worker, v.group, v.slot_ids.tolist()) for v in pool.pool.ready) == [
            (0, 0, [0, 1]), (0, 1, [2, 3]), (1, 0, [4, 5]), (1, 1, [6, 7])]
        os.kill(pool.pool.workers[1].process.pid, signal.SIGKILL)
        pool.pump(lambda: pool.restarted == [1] and sum(v.worker == 1 for v in pool.pool.ready) == 2)
        assert len(pool.pool.ready) == 4 and pool.pool.workers[1].restarts == 1
        assert min(pool.pool.read_clocks()) >= 0
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_a_worker_that_dies_before_answering_again_and_again_is_fatal():
    pool = Pool(native("DiesAtBirth"), groups=1)
    try:
        with pytest.raises(EnvFailure, match=f"env worker 0 died {MAX_DEATHS_IN_A_ROW} times in a row without "
                                             r"completing a step \(last: exit code 3\)"):
            pool.pump(lambda: False)
        assert pool.restarted == [0] * MAX_DEATHS_IN_A_ROW  # each death forgets its agents
        assert pool.pool.workers[0].restarts == MAX_DEATHS_IN_A_ROW - 1
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_a_worker_killed_in_its_first_step_every_time_is_fatal_naming_the_signal():
    """Its reset replies come every time; only a completed step would show it can live."""
    pool = Pool(native("DiesInStep", die_on=1, kill_with="SIGKILL"), groups=1)
    try:
        with pytest.raises(EnvFailure, match=f"env worker 0 died {MAX_DEATHS_IN_A_ROW} times in a row without "
                                             r"completing a step \(last: killed by SIGKILL\)"):
            pool.pump(lambda: False, wake=True)
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_deaths_in_a_row_reset_after_a_completed_step():
    pool = Pool(native("DiesInStep", die_on=4), groups=1)  # every life completes 3 steps, then dies
    try:
        pool.pump(lambda: pool.pool.workers[0].restarts == MAX_DEATHS_IN_A_ROW, wake=True)  # respawned, not fatal
        assert pool.restarted == [0] * MAX_DEATHS_IN_A_ROW and pool.pool.workers[0].deaths_in_a_row == 1
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_a_respawn_waits_its_backoff_while_the_other_workers_keep_stepping(monkeypatch):
    monkeypatch.setattr(worker_pool, "RESPAWN_BACKOFF_S", 3600.0)  # never due unless the test says so
    pool = Pool(EnvConfig(), workers=2)
    try:
        pool.pump(lambda: len(pool.pool.ready) == 4)
        os.kill(pool.pool.workers[1].process.pid, signal.SIGKILL)
        pool.pump(lambda: pool.restarted == [1], wake=True)
        buried = pool.pool.workers[1]
        assert buried.channel is None and buried.respawn_at is not None and buried.restarts == 0
        stepped_before = pool.pool.clocks_seen.copy()
        replies = pool.pool.workers[0].replies
        pool.pump(lambda: pool.pool.workers[0].replies >= replies + 50, wake=True)  # worker 0 is served meanwhile
        assert pool.pool.workers[1] is buried
        assert min(pool.pool.read_clocks()) >= 0 and (pool.pool.clocks_seen >= stepped_before).all()
        buried.respawn_at = 0.0  # its backoff is over
        pool.pump(lambda: pool.pool.workers[1].restarts == 1 and pool.pool.workers[1].replies > pool.layout.groups,
                  wake=True)  # respawned, and it has stepped
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_a_worker_that_dies_between_collect_and_wake_is_restarted_and_the_host_survives():
    pool = Pool(EnvConfig(), workers=2)
    try:
        pool.pump(lambda: len(pool.pool.ready) == 4)
        batch = list(pool.pool.ready)  # collected: the host now decides for these groups ...
        pool.pool.ready.clear()
        dying = pool.pool.workers[1].process
        os.kill(dying.pid, signal.SIGKILL)  # ... and worker 1 dies before its actions go out
        dying.join(timeout=10)
        assert dying.exitcode == -signal.SIGKILL
        with pytest.raises(BrokenPipeError):  # what the host's wake used to die of
            pool.pool.workers[1].channel.send(0)
        pool.pool.wake(batch)  # no exception: worker 0 steps, worker 1's EOF buries it at the next poll
        pool.pump(lambda: pool.restarted == [1] and pool.pool.workers[1].restarts == 1
                  and sum(v.worker == 1 for v in pool.pool.ready) == 2)
        assert sum(v.worker == 0 for v in pool.pool.ready) == 2
        pool.pool.wake(list(pool.pool.ready))  # the respawned worker steps like any other
        pool.pool.ready.clear()
        pool.pump(lambda: len(pool.pool.ready) == 4)
    finally:
        pool.pool.stop()
    assert shm_segments(os.getpid()) == []


def test_an_env_that_cannot_start_is_fatal_with_its_type_and_line(capfd):
    pool = Pool(native("BrokenReset"), groups=1)
    try:
        with pytest.raises(EnvFailure) as caught:
            pool.pump(lambda: False)
    finally:
        pool.pool.stop()
    raised_at = line_of(faulty_envs.BrokenReset.reset, "raise OSError")
    report = caught.value.report
    assert report.error_type == "OSError" and report.location == f"{faulty_envs.__file__}:{raised_at}"
    assert str(caught.value).startswith("env worker 0 could not start its env: env "
                                        "'native:tests.faulty_envs:BrokenReset' raised in reset(): OSError(")
    assert f'File "{faulty_envs.__file__}", line {raised_at}, in reset' in capfd.readouterr().err


def priority(pid: int) -> tuple[int, int]:
    """A process's nice value (from /proc/<pid>/stat) and scheduling policy."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16]), os.sched_getscheduler(pid)


@pytest.mark.parametrize("batch", [True, False], ids=["SCHED_BATCH", "SCHED_OTHER"])
def test_workers_add_the_asked_niceness_and_policy_to_the_hosts_and_keep_them_when_respawned(batch) -> None:
    pool = Pool(native("DiesInStep", die_on=3), workers=2, priority=WorkerPriority(nice=3, batch=batch))
    expected = (min(19, os.nice(0) + 3), os.SCHED_BATCH if batch else os.sched_getscheduler(0))
    try:
        pool.pump(lambda: len(pool.pool.ready) == 4)  # both workers started and reset their groups
        assert [priority(worker.process.pid) for worker in pool.pool.workers] == [expected, expected]
        first_pids = [worker.process.pid for worker in pool.pool.workers]
        pool.pump(lambda: all(worker.restarts >= 1 for worker in pool.pool.workers), wake=True)
        pool.pump(lambda: len(pool.pool.ready) == 4)  # the new lives reset their groups; no step wakes them
        assert [worker.process.pid for worker in pool.pool.workers] != first_pids
        assert [priority(worker.process.pid) for worker in pool.pool.workers] == [expected, expected]
    finally:
        pool.pool.stop()


@pytest.mark.parametrize("threads", [1, 2])
def test_workers_run_their_numeric_libraries_on_the_asked_threads(tmp_path, threads) -> None:
    """BLAS and torch (which the env loads) in the worker run ``threads`` threads (default 1), whatever the cores."""
    report = tmp_path / "threads.json"
    pool = Pool(native("ReportsThreads", path=str(report), load_torch=True), groups=1,
                priority=WorkerPriority(threads=threads))
    try:
        pool.pump(lambda: report.exists(), wake=True)
    finally:
        pool.pool.stop()
    seen = json.loads(report.read_text())
    assert seen["blas"] and set(seen["blas"]) == {threads} and seen["torch"] == threads, seen
