"""An actor host whose learner comes back with a different config rebuilds itself for that config."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from actors.host import ActorHost, config_differences, describe_config_change, weight_shapes
from actors.stop_flag import StopFlag
from protocol import Message, MessageType
from tests.processes import Run, alive, descendants, metrics, shm_segments, start, wait_for

QUICK_PEER_TIMEOUT = ("--set", "network.peer_timeout_s=2")


def env_workers(host_pid: int) -> set[int]:
    """The env worker processes among a host's children (not the multiprocessing resource tracker)."""
    def workers() -> set[int]:
        found = set()
        for pid in descendants(host_pid):
            try:
                if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(pid)
            except OSError:
                continue
        return found
    assert wait_for(lambda: len(workers()) >= 2, 60)
    return workers()


def test_config_differences_name_each_changed_key_with_both_values():
    old = {"env": {"name": "cartpole", "max_steps": 500}, "model": {"hidden_size": 32}, "run": {"seed": 1}}
    new = {"env": {"name": "cartpole", "max_steps": 200}, "model": {"hidden_size": 16, "core": "lstm"},
           "run": {"seed": 1}}
    assert config_differences(old, new) == ["env.max_steps: 500 -> 200", "model.hidden_size: 32 -> 16",
                                            "model.core: - -> 'lstm'"]
    assert config_differences(old, old) == []
    assert describe_config_change({"a": 1, "b": 1, "c": 1, "d": 1}, {}) == "a: 1 -> -, b: 1 -> -, c: 1 -> - and 1 more"


def test_weights_of_another_model_make_the_host_register_again_instead_of_loading_them():
    """A restarted learner's broadcast can arrive before the host noticed the restart: it must not be loaded."""
    loaded = []
    host = ActorHost.__new__(ActorHost)
    host.weight_shapes = weight_shapes({"w": np.zeros((32, 4)), "b": np.zeros(32)})
    host.inference = SimpleNamespace(version=3, load=lambda version, arrays: loaded.append(version))
    host.stop = StopFlag()
    host.state = SimpleNamespace(last_reply=100.0)

    def broadcast(version: int, hidden: int) -> Message:
        arrays = {"w": np.zeros((hidden, 4), np.float32), "b": np.zeros(hidden, np.float32)}
        return Message(type=MessageType.WEIGHTS, sender="learner", version=version, arrays=arrays)

    host.link = SimpleNamespace(latest_broadcast=lambda: broadcast(9, 16))
    host._apply_broadcast()
    assert loaded == [] and host.state.last_reply == 0.0
    host.state.last_reply = 100.0
    host.link = SimpleNamespace(latest_broadcast=lambda: broadcast(9, 32))
    host._apply_broadcast()
    assert loaded == [9] and host.state.last_reply == 100.0


@pytest.mark.integration
@pytest.mark.slow
def test_host_rebuilds_for_a_learner_restarted_with_another_config(tmp_path):
    run = Run(tmp_path)
    try:
        first = run.learner("--set", "trainer.target_episode_return=null", *QUICK_PEER_TIMEOUT)
        host = run.actors(2)
        run.note_workers(host)
        old_workers = env_workers(host.pid)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 1, 120), run.log("learner.log")
        old_segments = set(shm_segments(host.pid))
        assert {name.split("_")[2] for name in old_segments} == {"slots", "rows"}  # rows in shared memory
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)

        second_dir = tmp_path / "second"
        second = start("learner", "--config", "configs/cartpole.yaml", "--run-dir", str(second_dir),
                       "--set", f"network.port={run.port}", "--set", "trainer.target_episode_return=null",
                       "--set", "model.hidden_size=16", *QUICK_PEER_TIMEOUT, log=tmp_path / "second.log")
        run.procs.append(second)
        assert wait_for(lambda: len(metrics(second_dir)) >= 2, 180), run.log("second.log") + run.log("actors.log")
        out = run.log("actors.log")
        assert "now runs a different config (model.hidden_size: 32 -> 16): rebuilding this host for it" in out
        assert "Traceback" not in out and host.poll() is None
        assert wait_for(lambda: not any(alive(pid) for pid in old_workers), 5), "the old workers must be gone"
        segments = set(shm_segments(host.pid))
        old_rows = {name for name in old_segments if "_rows_" in name}
        assert not segments & old_rows, "the old host's rows segment is gone (its slots segment's name comes again)"
        assert {name.split("_")[2] for name in segments} <= {"slots", "rows"} and len(segments) <= 2, segments

        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) in (0, 130, 143), run.log("second.log")
        assert host.wait(timeout=30) == 0, run.log("actors.log")
        assert "stopped (learner: SIGTERM received)" in run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()


@pytest.mark.integration
def test_same_config_under_a_new_run_id_keeps_the_host(tmp_path):
    """The --resume case: the learner restarts with the same config, and the host just registers again."""
    run = Run(tmp_path)
    try:
        first = run.learner("--set", "trainer.target_episode_return=null", *QUICK_PEER_TIMEOUT)
        host = run.actors(2)
        workers = run.note_workers(host)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 1, 120), run.log("learner.log")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second_dir = tmp_path / "second"
        second = start("learner", "--config", "configs/cartpole.yaml", "--run-dir", str(second_dir),
                       "--set", f"network.port={run.port}", "--set", "trainer.target_episode_return=null",
                       *QUICK_PEER_TIMEOUT, log=tmp_path / "second.log")
        run.procs.append(second)
        assert wait_for(lambda: len(metrics(second_dir)) >= 1, 180), run.log("second.log") + run.log("actors.log")
        out = run.log("actors.log")
        assert "registered again" in out and "different config" not in out
        assert all(alive(pid) for pid in workers), "the same workers keep stepping"
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) in (0, 130, 143), run.log("second.log")
        assert host.wait(timeout=30) == 0, run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()
