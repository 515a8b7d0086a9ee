"""`python -m learner` tells errors apart by type: the user's print one line and exit 2; a bug in the learner,
or the user's env raising while its spec is read, propagates with its traceback."""

from __future__ import annotations

import inspect
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import learner.build
import learner.trainer
from configs.loader import load_config
from learner.run.checkpoint import TrainerState, list_checkpoints, save_checkpoint
from learner.cli import main
from learner.run.run_dir import new_run_dir
from tests import faulty_envs
from tests.processes import REPO, free_port_triple, ipc_files, kill_tree, start, wait_for

CARTPOLE = str(REPO / "configs" / "cartpole.yaml")


@pytest.fixture(autouse=True)
def keep_signal_handlers():
    """main() installs the learner's SIGINT/SIGTERM handlers; put pytest's back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def learner_args(tmp_path: Path, *overrides: str) -> list[str]:
    args = ["--config", CARTPOLE, "--run-dir", str(tmp_path / "run"), "--set", f"network.port={free_port_triple()}"]
    for item in overrides:
        args += ["--set", item]
    return args


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.startswith("python -m learner: error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


def test_an_internal_error_at_startup_propagates_with_its_traceback(tmp_path, capsys, monkeypatch):
    def broken_probe(_cfg, **_kwargs):
        raise ValueError("internal: spec cache out of sync")

    monkeypatch.setattr(learner.build, "probe_env_spec", broken_probe)
    with pytest.raises(ValueError, match="internal: spec cache out of sync"):
        main(learner_args(tmp_path))
    assert "python -m learner: error" not in capsys.readouterr().err


def test_a_config_error_at_startup_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(learner_args(tmp_path, "env.num_agents=2")) == 2
    assert "env.num_agents=2 but env 'cartpole' has 1 agent per environment" in one_line_error(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_config_error(tmp_path, capsys):
    assert main(learner_args(tmp_path, "run.device=cuda")) == 2
    assert "run.device is 'cuda' but torch sees no CUDA device" in one_line_error(capsys)


def test_a_bad_host_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(learner_args(tmp_path, "network.host=not a host")) == 2
    assert "'not a host' is not a valid host name or address" in one_line_error(capsys)


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, capsys):
    port = free_port_triple()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        assert main(learner_args(tmp_path, f"network.port={port}")) == 2
    err = one_line_error(capsys)
    assert f"cannot bind tcp://127.0.0.1:{port + 1}: Address already in use" in err
    assert "--set network.port=PORT" in err
    # the run directory this start made is gone again: the same --run-dir can be used again
    assert not (tmp_path / "run").exists()


def test_coma_on_an_env_it_cannot_learn_is_one_line_naming_why(tmp_path, capsys):
    assert main(learner_args(tmp_path, "trainer.algorithm=coma", "coma.rollout_length=8192")) == 2
    err = one_line_error(capsys)
    assert "trainer.algorithm coma needs continuous (box) actions" in err
    assert not (tmp_path / "run").exists()


def test_a_metrics_port_in_use_is_one_line_naming_the_setting_and_leaves_no_run_dir(tmp_path, capsys):
    port = free_port_triple()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 3))  # the default metrics port: network.port + 3
        taken.listen()
        assert main(learner_args(tmp_path, f"network.port={port}")) == 2
    err = one_line_error(capsys)
    assert f"cannot bind the Prometheus endpoint at 127.0.0.1:{port + 3}: Address already in use" in err
    assert "--set network.metrics_port=PORT; 0 takes a free one" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_an_env_that_raises_in_its_constructor_shows_the_users_file_and_line(tmp_path):
    source, first = inspect.getsourcelines(faulty_envs.BrokenConstructor.__init__)
    line = first + next(i for i, text in enumerate(source) if 'track["height"]' in text)
    entry_point = "tests.faulty_envs:BrokenConstructor"
    done = subprocess.run([sys.executable, "-m", "learner",
                           *learner_args(tmp_path, "env.name=native", f"env.entry_point={entry_point}")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "python -m learner: error" not in done.stderr
    assert f"EnvRaised: env 'native:{entry_point}' raised in make(): KeyError('height')" in done.stderr
    assert f'faulty_envs.py", line {line}, in __init__' in done.stderr


@pytest.mark.integration
def test_a_port_in_use_leaves_no_run_dir_and_the_same_command_starts_once_it_is_free(tmp_path):
    args = learner_args(tmp_path)
    port = int(args[args.index("--set") + 1].split("=")[1])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        refused = subprocess.run([sys.executable, "-m", "learner", *args], cwd=REPO, capture_output=True, text=True,
                                 timeout=120)
    assert refused.returncode == 2, refused.stderr
    error_lines = [line for line in refused.stderr.splitlines() if line.startswith("python -m learner: error: ")]
    assert len(error_lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"cannot bind tcp://127.0.0.1:{port}: Address already in use" in error_lines[0]
    assert "--set network.port=PORT" in error_lines[0]
    assert not (tmp_path / "run").exists()

    log = tmp_path / "learner.log"
    learner_proc = start("learner", *args, log=log)
    try:
        assert wait_for(lambda: "listening on" in log.read_text(), 120), log.read_text()
        learner_proc.send_signal(signal.SIGINT)
        assert learner_proc.wait(timeout=60) == 128 + signal.SIGINT == 130, log.read_text()
    finally:
        kill_tree(learner_proc)
    assert "stopped (SIGINT received)" in log.read_text()
    assert ipc_files(learner_proc.pid) == []  # its data socket's unix socket file went with it
    assert list_checkpoints(tmp_path / "run")  # the same final checkpoint as before: --resume continues it


def test_resume_of_a_run_without_a_checkpoint_is_an_error_naming_it(tmp_path, capsys):
    run_dir = new_run_dir(load_config(CARTPOLE), tmp_path / "run")
    assert main(["--resume", "--run-dir", str(run_dir), "--set", f"network.port={free_port_triple()}"]) == 2
    err = one_line_error(capsys)
    assert f"cannot resume: {run_dir} has no checkpoint" in err and "--run-dir" in err
    assert not (run_dir / "metrics.jsonl").exists()  # nothing was started afresh


def checkpointed_run(tmp_path: Path, update: int) -> Path:
    """A cartpole run directory with one checkpoint taken after ``update`` updates."""
    config = load_config(CARTPOLE)
    run_dir = new_run_dir(config, tmp_path / "run")
    trainer = learner.trainer.Learner(config, run_dir, resume=False)
    save_checkpoint(run_dir, learned=trainer.algorithm.state_dict(), state=TrainerState(update=update), keep=3)
    return run_dir


def resume_with_port_taken(run_dir: Path, *overrides: str) -> None:
    """``--resume`` of ``run_dir`` that stops at binding (its control port is taken): exit 2."""
    port = free_port_triple()
    args = ["--resume", "--run-dir", str(run_dir), "--set", f"network.port={port}"]
    for item in overrides:
        args += ["--set", item]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert main(args) == 2


def test_resume_with_another_total_timesteps_warns_that_the_schedules_jump(tmp_path, capsys):
    # cartpole: 3,000,000 // 8192 = 366 updates in all; 6,000,000 // 8192 = 732
    run_dir = checkpointed_run(tmp_path, update=183)
    resume_with_port_taken(run_dir, "trainer.total_timesteps=6000000")
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if line.startswith("python -m learner: warning: "))
    assert "trainer.total_timesteps 6,000,000" in warning and "saved 3,000,000" in warning
    assert "learning rate, entropy and clip schedules jump" in warning
    assert "was 50.0% of the old total (366 updates) and is 25.0% of the new one (732 updates)" in warning
    assert list_checkpoints(run_dir)  # a failed resume leaves the run as it was

    resume_with_port_taken(run_dir)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.integration
def test_the_resume_warning_and_the_resume_lines_reach_console_log(tmp_path):
    """What the learner says before its run directory's console.log is open (the command line's warning, the
    checkpoint it resumes from) is in console.log too, not only on the terminal."""
    run_dir = checkpointed_run(tmp_path, update=183)
    proc = start("learner", "--resume", "--run-dir", str(run_dir), "--set", f"network.port={free_port_triple()}",
                 "--set", "trainer.total_timesteps=6000000", "--plain", log=tmp_path / "learner.log")
    console = run_dir / "console.log"
    try:
        assert wait_for(lambda: console.exists() and "listening on" in console.read_text(), 60), \
            (tmp_path / "learner.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        kill_tree(proc)
    text = console.read_text()
    assert "python -m learner: warning: resuming with trainer.total_timesteps 6,000,000" in text
    assert "resumed from" in text and "update 183" in text


def test_exit_codes_are_in_the_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "130  stopped by SIGINT" in out and "143 stopped by SIGTERM" in out and "0    the run finished" in out


def test_request_stop_keeps_the_first_reason_and_exit_code(tmp_path):
    trainer = learner.trainer.Learner(load_config(CARTPOLE), tmp_path, resume=False)
    learner.trainer.install_signal_handlers(trainer)
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_for(trainer.stop.is_set, 5)
    assert (trainer.stop_reason, trainer.exit_code) == ("SIGTERM received", 143)
    trainer.request_stop("total_timesteps reached")
    assert (trainer.stop_reason, trainer.exit_code) == ("SIGTERM received", 143)
