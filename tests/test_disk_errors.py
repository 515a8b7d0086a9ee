"""A full disk or a read-only run directory: one line naming the path and the OS's reason, exit 1, actor hosts told
to stop, the last good checkpoint kept and no temporary files left. Units for each writer; real processes on a
small tmpfs (mounting needs root: the tests that mount skip without it). A full /dev/shm stops an actor host at its
start with one line."""

from __future__ import annotations

import errno
import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from actors.shm import SharedMemoryFull, ShmSegment, segment_name
from configs.loader import load_config
from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from learner.run import checkpoint as ckpt
from learner.monitor import tensorboard_log
from learner.run.checkpoint import LearnedState, TrainerState, list_checkpoints, load_checkpoint, save_checkpoint
from learner.cli import main
from learner.monitor.metrics_log import MetricsLog
from learner.run.run_dir import new_run_dir
from learner.run.run_files import RunFilesError, as_run_files_error, check_writable, writing
from learner.run.run_record import _Tee
from policies.factory import make_policy
from tests.processes import REPO, Run, metrics, wait_for

SPEC = EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.discrete(2))
CARTPOLE = str(REPO / "configs" / "cartpole.yaml")
FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def learned() -> LearnedState:
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=1))
    return LearnedState(modules={"model": policy.state_dict()}, optimizers={})


def test_disk_errors_become_one_line_naming_the_path_and_others_pass(tmp_path):
    error = as_run_files_error(FULL, tmp_path / "x")
    assert str(error) == f"cannot write {tmp_path / 'x'}: No space left on device"
    assert str(as_run_files_error(OSError(errno.EROFS, "Read-only file system"), tmp_path)).endswith(
        ": Read-only file system")
    assert as_run_files_error(OSError(errno.ENOENT, "No such file"), tmp_path) is None
    with pytest.raises(RunFilesError, match="Disk quota exceeded"):
        with writing(tmp_path):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(FileNotFoundError):
        with writing(tmp_path):
            raise FileNotFoundError(errno.ENOENT, "No such file")


def test_a_full_disk_while_saving_names_the_checkpoint_and_leaves_no_temp_dir(tmp_path, monkeypatch):
    previous = save_checkpoint(tmp_path, learned=learned(), state=TrainerState(update=1), keep=3)

    def full(_tensors, filename):
        Path(filename).write_bytes(b"partial")
        raise FULL

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(RunFilesError) as info:
        save_checkpoint(tmp_path, learned=learned(), state=TrainerState(update=2), keep=3)
    assert str(info.value) == f"cannot write {tmp_path / 'checkpoints' / 'update_00000002'}: No space left on device"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["update_00000001"]
    assert load_checkpoint(previous).trainer_state.update == 1


class FullFile(io.StringIO):
    """A file on a full disk: every write fails."""

    def write(self, text: str) -> int:
        raise FULL


def test_metrics_and_tensorboard_writes_fail_as_one_error_and_close_quietly(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"update": 1, "agent_steps": 10, "loss": 0.5})
    log.file.close()
    log.file = FullFile()
    with pytest.raises(RunFilesError, match=f"^cannot write {re.escape(str(tmp_path / 'metrics.jsonl'))}: No space"):
        log.write({"update": 2, "agent_steps": 20})
    log.close()
    log = MetricsLog(tmp_path / "metrics.jsonl", resumed_at_update=1)

    def full_flush() -> None:
        raise FULL

    log.tensorboard.writer.flush = full_flush
    with pytest.raises(RunFilesError, match=f"^cannot write {re.escape(str(tmp_path / 'tensorboard'))}: No space"):
        log.write({"update": 2, "agent_steps": 20})
    log.close()
    assert [json.loads(line)["update"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError, match="resumed_at_update must be >= 0, got -5"):
        MetricsLog(tmp_path / "metrics.jsonl", resumed_at_update=-5)


def test_the_tensorboard_writer_threads_disk_error_is_not_reported_twice():
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    passed_on: list[BaseException] = []
    hook = tensorboard_log.QuietWriterDiskErrors(lambda args: passed_on.append(args.exc_value))
    writer_thread, bug = _AsyncWriterThread(queue.Queue(), None, 120), ValueError("bug")
    for thread, exc in ((writer_thread, FULL), (threading.Thread(), FULL), (writer_thread, bug)):
        hook(threading.ExceptHookArgs([type(exc), exc, None, thread]))
    assert passed_on == [FULL, bug]  # only TensorBoard's own thread dying of a disk error is left out


def test_the_console_copy_stops_quietly_on_a_full_disk():
    console = io.StringIO()
    tee = _Tee(console, FullFile())
    tee.write("learner: one\n")
    tee.write("learner: two\n")
    tee.flush()
    assert console.getvalue() == "learner: one\nlearner: two\n" and tee.stopped


@pytest.fixture
def tmpfs(tmp_path):
    """A 3 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a small disk to fill, or one to make read-only) needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Write a file on ``disk`` until it is full."""
    with (disk / "filler").open("wb", buffering=0) as file:
        while True:
            try:
                file.write(b"\0" * 65536)
            except OSError as err:
                assert err.errno == errno.ENOSPC
                return


@pytest.mark.integration
def test_a_full_disk_stops_the_learner_with_one_line_and_the_hosts_with_it(tmp_path, tmpfs):
    run = Run(tmp_path, "--set", "trainer.target_episode_return=null", "--set", "run.checkpoint_interval=1",
              "--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024", "--plain")
    run.run_dir = tmpfs / "run"
    run.learner_args[run.learner_args.index("--run-dir") + 1] = str(run.run_dir)
    try:
        learner, actors = run.learner(), run.actors(1)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 2, 120), run.log("learner.log")
        fill(tmpfs)
        assert learner.wait(timeout=30) == 1, run.log("learner.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
    finally:
        run.close()
    out = run.log("learner.log")
    full = [line for line in out.splitlines() if "No space left on device" in line]
    assert len(full) == 1, out
    assert re.fullmatch(rf"learner: cannot write {re.escape(str(run.run_dir))}/\S+: No space left on device; stopping",
                        full[0]), full
    assert "Traceback" not in out and "Exception" not in out, out
    assert "learner: stopped (the run directory cannot be written); last checkpoint in" in out
    assert "stopped (learner: the run directory cannot be written)" in run.log("actors.log")
    root = run.run_dir / "checkpoints"
    assert not [p.name for p in root.iterdir() if not p.name.startswith("update_")]  # no temporary directories
    newest = list_checkpoints(run.run_dir)[-1]
    assert load_checkpoint(newest).trainer_state.update >= 1


def read_only(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)


@pytest.mark.integration
def test_a_fresh_run_in_a_read_only_directory_is_one_line_and_exit_1(tmp_path, tmpfs):
    read_only(tmpfs)
    done = subprocess.run([sys.executable, "-m", "learner", "--config", CARTPOLE, "--run-dir", str(tmpfs / "run")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("python -m learner: error: ")]
    assert errors == [f"python -m learner: error: cannot write {tmpfs / 'run' / 'config.yaml'}: Read-only file system"]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


@pytest.mark.integration
def test_resuming_a_read_only_run_directory_is_one_line_and_exit_1(tmpfs, capsys):
    run_dir = new_run_dir(load_config(CARTPOLE), tmpfs / "run")
    save_checkpoint(run_dir, learned=learned(), state=TrainerState(update=2), keep=3)
    read_only(tmpfs)
    with pytest.raises(RunFilesError, match="Read-only file system"):
        check_writable(run_dir)
    assert main(["--resume", "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("python -m learner: error: ")]
    assert errors == [f"python -m learner: error: cannot write {run_dir}: Read-only file system"], err


@pytest.mark.integration
def test_save_checkpoint_on_a_real_full_disk_leaves_the_last_one_loadable(tmpfs):
    previous = save_checkpoint(tmpfs, learned=learned(), state=TrainerState(update=1), keep=3)
    fill(tmpfs)
    big = LearnedState(modules={"model": {"w": torch.zeros(1 << 20)}}, optimizers={})
    with pytest.raises(RunFilesError, match=r"update_00000002: No space left on device$"):
        save_checkpoint(tmpfs, learned=big, state=TrainerState(update=2), keep=3)
    assert sorted(p.name for p in (tmpfs / "checkpoints").iterdir()) == ["update_00000001"]
    assert load_checkpoint(previous).trainer_state.update == 1


def test_a_shared_memory_segment_is_reserved_whole_or_not_made(monkeypatch):
    """A full /dev/shm is an error when the host makes its segment (named, with the OS's reason), no file left
    behind, not a SIGBUS at the first write of a page."""
    def full(fd, offset, length):
        raise FULL

    monkeypatch.setattr(os, "posix_fallocate", full)
    name = segment_name(os.getpid(), "full_test")
    with pytest.raises(SharedMemoryFull) as caught:
        ShmSegment.create(name, 3_000_000)
    assert caught.value.strerror == (f"cannot reserve 3.0 MB of shared memory for /dev/shm/{name}: No space left on "
                                     f"device (free some, or give /dev/shm more room, e.g. docker run --shm-size)")
    assert not Path("/dev/shm", name).exists()


@pytest.mark.integration
def test_a_full_dev_shm_stops_an_actor_host_at_its_start_with_one_line(tmp_path):
    """An actor host whose /dev/shm is full (a filled tmpfs in its own mount namespace) stops as it builds its
    workers: one line, exit 1, and the learner hears why it left."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs over /dev/shm in a mount namespace needs root")
    run = Run(tmp_path, "--plain")
    script = ("mount -t tmpfs -o size=64k tmpfs /dev/shm && { dd if=/dev/zero of=/dev/shm/filler bs=4k 2>/dev/null; "
              "exec \"$0\" -m actors --n 2 --learner \"$1\"; }")
    try:
        learner = run.learner()
        with (tmp_path / "actors.log").open("w") as log:
            actors = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, sys.executable,
                                       f"tcp://127.0.0.1:{run.port}"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        run.procs.append(actors)
        assert actors.wait(timeout=120) == 1, run.log("actors.log")
        assert wait_for(lambda: "cannot reserve" in run.log("learner.log"), 30), run.log("learner.log")
        learner.terminate()
        assert learner.wait(timeout=30) == 143
    finally:
        run.close()
    out = run.log("actors.log")
    assert "Traceback" not in out, out
    full = [line for line in out.splitlines() if "shared memory" in line]
    assert len(full) == 1 and re.fullmatch(r"python -m actors: error: cannot reserve [0-9.]+ MB of shared memory for "
                                           r"/dev/shm/sluice_\d+_slots: No space left on device \(free some, or give "
                                           r"/dev/shm more room, e\.g\. docker run --shm-size\)", full[0]), out
    run.assert_clean()
