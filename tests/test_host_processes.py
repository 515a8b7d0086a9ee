"""``python -m actors --n N --hosts K``: K host processes under one supervisor (actors/host_processes.py), each a
host of the learner's; the supervisor passes signals on, stops the rest when one fails, and leaves nothing behind."""

from __future__ import annotations

import argparse
import os
import signal
import sys

import pytest

from actors.cli import build_parser
from actors.host_processes import host_command, split_workers
from tests.processes import Run, alive, descendants, ipc_files, metrics, shm_segments, start, wait_for


def test_workers_are_dealt_out_evenly_the_first_hosts_taking_the_remainder() -> None:
    assert split_workers(7, 3) == [3, 2, 2]
    assert split_workers(4, 4) == [1, 1, 1, 1]
    assert sum(split_workers(16, 5)) == 16
    with pytest.raises(ValueError, match="3 host processes need at least 3 env workers, got 2"):
        split_workers(2, 3)


def test_each_host_gets_the_supervisors_options_its_workers_and_its_own_metrics_port() -> None:
    args = build_parser().parse_args(["--n", "4", "--hosts", "2", "--learner", "tcp://10.0.0.2:5555", "--insecure",
                                      "--null-policy", "--metrics-port", "9100", "--curve-server-key", "s.key",
                                      "--worker-nice", "7", "--worker-scheduler", "normal",
                                      "--worker-threads", "3"])
    first, second = (host_command(args, 2, index) for index in (0, 1))
    assert first[:3] == [sys.executable, "-m", "actors"] and "--hosts" not in first
    flags = argparse.ArgumentParser()
    for name in ("--n", "--learner", "--metrics-port", "--curve-server-key", "--curve-client-key", "--device",
                 "--metrics-host", "--pool", "--worker-nice", "--worker-scheduler", "--worker-threads"):
        flags.add_argument(name)
    for name in ("--insecure", "--null-policy", "--strict-keys"):
        flags.add_argument(name, action="store_true")
    parsed = [flags.parse_args(command[3:]) for command in (first, second)]
    assert [p.metrics_port for p in parsed] == ["9100", "9101"]
    assert all(p.n == "2" and p.learner == "tcp://10.0.0.2:5555" and p.insecure and p.null_policy
               and p.curve_server_key == "s.key" and not p.strict_keys and p.pool is None and p.worker_nice == "7"
               and p.worker_scheduler == "normal" and p.worker_threads == "3"
               for p in parsed)
    free = build_parser().parse_args(["--n", "4", "--hosts", "2"])
    assert host_command(free, 2, 1)[host_command(free, 2, 1).index("--metrics-port") + 1] == "0"


def hosts_of(supervisor) -> list[int]:
    """The host processes of a supervisor (its children that run ``python -m actors``)."""
    return [pid for pid in descendants(supervisor.pid) if parent_of(pid) == supervisor.pid]


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


def assert_hosts_clean(hosts: list[int], everything: set[int]) -> None:
    assert wait_for(lambda: not any(alive(pid) for pid in everything), 10), "orphans of the host processes"
    for pid in hosts:
        assert shm_segments(pid) == [] and ipc_files(pid) == [], f"host {pid} left shared memory or ipc files"


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path, "--set", "trainer.target_episode_return=null")
    yield r
    r.close()


def start_hosts(run: Run, workers: int = 2, hosts: int = 2):
    supervisor = start("actors", "--n", str(workers), "--hosts", str(hosts), "--learner",
                       f"tcp://127.0.0.1:{run.port}", log=run.tmp / "actors.log")
    run.procs.append(supervisor)
    assert wait_for(lambda: len(hosts_of(supervisor)) == hosts, 30), run.log("actors.log")
    return supervisor


@pytest.mark.integration
def test_two_host_processes_join_the_learner_and_end_with_its_run(run):
    learner = run.learner()
    supervisor = start_hosts(run)
    hosts = hosts_of(supervisor)
    assert wait_for(lambda: run.log("learner.log").count("joined with 1 workers") == 2, 90), run.log("learner.log")
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 2, 90), run.log("learner.log")
    everything = descendants(supervisor.pid)
    assert max(r["actor_hosts"] for r in metrics(run.run_dir)) == 2
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143
    assert supervisor.wait(timeout=30) == 0, run.log("actors.log")  # each host stopped as the learner said
    assert run.log("actors.log").count("stopped (learner: SIGTERM received)") == 2
    assert_hosts_clean(hosts, everything)
    run.assert_clean()


@pytest.mark.integration
def test_ctrl_c_to_the_supervisor_stops_every_host_cleanly(run):
    """SIGINT as a terminal's Ctrl-C sends it: the hosts, in their own process groups, get it from the supervisor
    (SIGTERM takes the same path)."""
    signum = signal.SIGINT
    run.learner()
    supervisor = start_hosts(run)
    hosts = hosts_of(supervisor)
    assert wait_for(lambda: run.log("learner.log").count("joined with 1 workers") == 2, 90), run.log("learner.log")
    everything = descendants(supervisor.pid)
    supervisor.send_signal(signum)
    assert supervisor.wait(timeout=30) == 128 + signum, run.log("actors.log")
    assert run.log("actors.log").count(f"stopped ({signal.Signals(signum).name} received)") == 2
    assert_hosts_clean(hosts, everything)


@pytest.mark.integration
def test_a_host_that_dies_stops_the_other_and_the_supervisor_says_so(run):
    run.learner()
    supervisor = start_hosts(run)
    first, second = sorted(hosts_of(supervisor))
    assert wait_for(lambda: run.log("learner.log").count("joined with 1 workers") == 2, 90), run.log("learner.log")
    assert wait_for(lambda: all(shm_segments(pid) for pid in (first, second)), 30)  # both hosts run their workers
    everything = descendants(supervisor.pid)
    os.kill(first, signal.SIGKILL)
    assert supervisor.wait(timeout=30) == 128 + signal.SIGKILL, run.log("actors.log")
    assert f"actors: host process {first} ended with exit code -9; stopping the others" in run.log("actors.log")
    assert "stopped (SIGTERM received)" in run.log("actors.log")
    assert not alive(second)
    assert wait_for(lambda: not any(alive(pid) for pid in everything), 10), "orphans of the host processes"
    assert all(shm_segments(pid) == [] and ipc_files(pid) == [] for pid in (first, second))
