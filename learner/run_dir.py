"""The run directory: runs/<name>-<timestamp>/ with config.yaml, metrics.jsonl, checkpoints/, logs."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from configs.loader import ConfigError, config_to_dict, load_config
from configs.plan import make_plan
from configs.schema import RunConfig
from learner.checkpoint import list_checkpoints, load_checkpoint


class RunDirError(ValueError):
    """The run directory cannot be used as asked."""


def default_run_dir(config: RunConfig) -> Path:
    """runs/<run.name>-<timestamp>: where a fresh run goes without --run-dir."""
    return Path("runs") / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def new_run_dir(config: RunConfig, run_dir: Path | None) -> Path:
    """Create the directory for a fresh run and write its resolved config.yaml."""
    if run_dir is None:
        run_dir = default_run_dir(config)
    if list_checkpoints(run_dir) or (run_dir / "metrics.jsonl").exists():
        raise RunDirError(f"run directory {run_dir} already holds a run; pass --resume to continue it, "
                          f"or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return run_dir


def read_run_config(run_dir: Path) -> RunConfig:
    """The config.yaml a run directory holds; RunDirError naming what is missing or unreadable."""
    if not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist")
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunDirError(f"{path} does not exist (is {run_dir} a run directory?)")
    try:
        return load_config(path)
    except ConfigError as err:
        raise RunDirError(f"cannot read {path}: {err}") from err


def resume_config(run_dir: Path | None, overrides: list[str]) -> RunConfig:
    """The config saved in a run directory, with --set overrides applied."""
    if run_dir is None:
        raise RunDirError("--resume needs --run-dir DIR (the run to continue)")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise RunDirError(f"cannot resume: {saved} does not exist (is {run_dir} a run directory?)")
    try:
        return load_config(saved, overrides)
    except ConfigError as err:
        raise RunDirError(f"cannot resume from {run_dir}: {err}") from err


@contextmanager
def fresh_run_dir(config: RunConfig, run_dir: Path | None) -> Iterator[Path]:
    """``new_run_dir`` for a start that can still fail (a port in use, a bad device): if the block raises before
    the run wrote metrics.jsonl or a checkpoint, a directory this start created is removed again, so the same
    command works once the cause is fixed. A directory that existed before is left as it is."""
    run_dir = default_run_dir(config) if run_dir is None else run_dir
    created = not run_dir.exists()
    run_dir = new_run_dir(config, run_dir)
    try:
        yield run_dir
    except BaseException:
        if created and not (run_dir / "metrics.jsonl").exists() and not list_checkpoints(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def check_resumable(run_dir: Path) -> None:
    """RunDirError unless ``run_dir`` holds a checkpoint to continue from (--resume never starts afresh)."""
    if not list_checkpoints(run_dir):
        raise RunDirError(f"cannot resume: {run_dir} has no checkpoint in {run_dir / 'checkpoints'} (the run "
                          f"stopped before its first one); start a fresh run with another --run-dir, or delete "
                          f"{run_dir} and start it again without --resume")


def schedule_jump_warning(run_dir: Path, config: RunConfig) -> str | None:
    """A warning when ``config`` (the resumed run's, --set applied) changes the schedules' length
    (trainer.total_timesteps // trainer.batch_size) from the saved config.yaml's: the learning rate, entropy
    and clip schedules then jump from where the checkpoint left them. None when nothing jumps."""
    saved_config = load_config(run_dir / "config.yaml")
    saved = saved_config.trainer
    old_epochs = make_plan(saved, num_agents=saved_config.env.num_agents).total_epochs
    new_epochs = make_plan(config.trainer, num_agents=config.env.num_agents).total_epochs
    if old_epochs == new_epochs:
        return None
    update = load_checkpoint(list_checkpoints(run_dir)[-1]).trainer_state.update
    old_progress, new_progress = (min(1.0, update / epochs) for epochs in (old_epochs, new_epochs))
    return (f"resuming with trainer.total_timesteps {config.trainer.total_timesteps:,} (batch_size "
            f"{config.trainer.batch_size:,}) instead of the saved {saved.total_timesteps:,} (batch_size "
            f"{saved.batch_size:,}): the learning rate, entropy and clip schedules jump: progress at the checkpoint "
            f"(update {update}) was {old_progress:.1%} of the old total ({old_epochs} updates) and is "
            f"{new_progress:.1%} of the new one ({new_epochs} updates)")
