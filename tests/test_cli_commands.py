"""The learner's command line (issue 32): --resume of a finished run, the --seed / --device shortcuts and the
console scripts beside python -m. No process is started: main() runs in this process, and the learner is
replaced where a test only needs to see that it would have started."""

from __future__ import annotations

import importlib
import importlib.metadata
import signal
import tomllib
from pathlib import Path

import pytest
import torch

import learner.trainer
from configs.loader import load_config
from learner.cli import main
from learner.run.checkpoint import LearnedState, TrainerState, list_checkpoints, save_checkpoint
from learner.run.run_dir import new_run_dir

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = REPO / "configs" / "cartpole.yaml"  # total_timesteps 3,000,000, target_episode_return 475


class Started(Exception):
    """The learner would have been built (and would have bound its ports)."""


@pytest.fixture(autouse=True)
def learner_never_starts(monkeypatch):
    """A Learner built by main() raises Started instead of binding; pytest's signal handlers are kept."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def refuse(*_args, **_kwargs):
        raise Started

    monkeypatch.setattr(learner.trainer, "Learner", refuse)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def run_with_checkpoint(tmp_path: Path, state: TrainerState) -> Path:
    """A cartpole run directory with one checkpoint holding ``state`` (the weights are a stand-in: finishing is read
    from the counters alone)."""
    run_dir = new_run_dir(load_config(CARTPOLE), tmp_path / "run")
    learned = LearnedState(modules={"model": {"weight": torch.zeros(2)}}, optimizers={})
    save_checkpoint(run_dir, learned=learned, state=state, keep=3)
    return run_dir


# ---------------------------------------------------------------- --resume of a finished run


def test_resume_of_a_run_past_total_timesteps_says_it_is_finished_and_exits_0(tmp_path, capsys):
    run_dir = run_with_checkpoint(tmp_path, TrainerState(update=367, agent_steps=3_006_464))
    assert main(["--resume", "--run-dir", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out == (
        f"learner: run {run_dir} is finished (total_timesteps reached: 3,006,464 agent steps, update 367); nothing "
        f"to resume, nothing started. To train on: --resume --run-dir {run_dir} --set trainer.total_timesteps=N "
        "with N above 3,006,464 (it is 3,000,000)\n")
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "console.log").exists()
    assert [path.name for path in list_checkpoints(run_dir)] == ["update_00000367"]


def test_resume_of_a_run_that_reached_its_target_return_names_that_setting(tmp_path, capsys):
    run_dir = run_with_checkpoint(tmp_path, TrainerState(update=40, agent_steps=327_680,
                                                         recent_returns=[500.0] * 100))
    assert main(["--resume", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "is finished (target return reached: 327,680 agent steps, update 40)" in out
    assert out.endswith("--set trainer.target_episode_return=null (or above 475)\n")
    assert "total_timesteps" not in out


def test_resume_with_a_raised_total_timesteps_goes_on(tmp_path, capsys):
    run_dir = run_with_checkpoint(tmp_path, TrainerState(update=367, agent_steps=3_006_464))
    with pytest.raises(Started):
        main(["--resume", "--run-dir", str(run_dir), "--set", "trainer.total_timesteps=6e6"])
    assert "is finished" not in capsys.readouterr().out


def test_resume_of_an_unfinished_run_goes_on(tmp_path, capsys):
    run_dir = run_with_checkpoint(tmp_path, TrainerState(update=100, agent_steps=819_200))
    with pytest.raises(Started):
        main(["--resume", "--run-dir", str(run_dir)])
    assert "is finished" not in capsys.readouterr().out


# ---------------------------------------------------------------- --seed and --device


def print_config(capsys, *args: str) -> dict:
    import yaml

    assert main([*args, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_seed_and_device_are_shortcuts_for_set(capsys):
    assert print_config(capsys, "--seed", "7", "--device", "cpu") == print_config(
        capsys, "--set", "run.seed=7", "--set", "run.device=cpu")
    printed = print_config(capsys, "--seed", "7", "--device", "cpu")
    assert (printed["run"]["seed"], printed["run"]["device"]) == (7, "cpu")


def test_seed_and_device_agreeing_with_set_are_fine(capsys):
    printed = print_config(capsys, "--seed", "7", "--set", "run.seed=7", "--device", "cpu", "--set", "run.device=cpu")
    assert (printed["run"]["seed"], printed["run"]["device"]) == (7, "cpu")


@pytest.mark.parametrize("args, message", [
    (["--seed", "7", "--set", "run.seed=8"],
     "--seed 7 and --set run.seed=8 both set run.seed, to different values: give one of them"),
    (["--device", "cpu", "--set", "run.device=cuda"],
     "--device cpu and --set run.device=cuda both set run.device, to different values: give one of them"),
])
def test_a_shortcut_conflicting_with_set_is_an_error_naming_both(capsys, args, message):
    assert main([*args, "--plan"]) == 2
    assert capsys.readouterr().err == f"python -m learner: error: {message}\n"


def test_a_bad_device_is_the_config_error_of_run_device(capsys):
    assert main(["--device", "gpu", "--plan"]) == 2
    assert "run.device: 'gpu' is not allowed; allowed: auto, cpu, cuda" in capsys.readouterr().err


# ---------------------------------------------------------------- console scripts

CONSOLE_SCRIPTS = {
    "sluice-learner": "learner.cli:main",
    "sluice-actors": "actors.cli:main",
    "sluice-keys": "protocol.keys:main",
    "sluice-evaluate": "evaluation.evaluate:main",
}
PYTHON_M = {"sluice-learner": "learner.__main__", "sluice-actors": "actors.__main__", "sluice-keys": "protocol.keys",
            "sluice-evaluate": "evaluation.evaluate"}
"""The module ``python -m`` runs for each command (its ``main`` is what it calls)."""


def test_pyproject_declares_the_console_scripts():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == CONSOLE_SCRIPTS


@pytest.mark.parametrize("name", sorted(CONSOLE_SCRIPTS))
def test_each_console_script_calls_the_main_python_m_runs(name):
    installed = {point.name: point for point in importlib.metadata.entry_points(group="console_scripts")}
    if name not in installed:
        pytest.skip(f"{name} is not installed: reinstall after pyproject.toml changed (bash ops/setup.sh does)")
    assert installed[name].value == CONSOLE_SCRIPTS[name]
    assert installed[name].load() is importlib.import_module(PYTHON_M[name]).main
