"""`python -m learner` tells errors apart by type: the user's print one line and exit 2; a bug in the learner,
or the user's env raising while its spec is read, propagates with its traceback."""

from __future__ import annotations

import inspect
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import learner.trainer
from learner.cli import main
from tests import faulty_envs
from tests.processes import REPO, free_port_triple

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
    def broken_probe(_cfg):
        raise ValueError("internal: spec cache out of sync")

    monkeypatch.setattr(learner.trainer, "probe_env_spec", broken_probe)
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
    assert f"cannot bind tcp://127.0.0.1:{port + 1}: Address already in use" in one_line_error(capsys)
    # nothing of a run was written: the same --run-dir can be used again
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


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
