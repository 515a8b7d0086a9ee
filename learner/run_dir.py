"""The run directory: runs/<name>-<timestamp>/ with config.yaml, metrics.jsonl, checkpoints/, logs."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from configs.loader import ConfigError, config_to_dict, load_config
from configs.schema import RunConfig
from learner.checkpoint import list_checkpoints


class RunDirError(ValueError):
    """The run directory cannot be used as asked."""


def new_run_dir(config: RunConfig, run_dir: Path | None) -> Path:
    """Create the directory for a fresh run and write its resolved config.yaml."""
    if run_dir is None:
        run_dir = Path("runs") / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if list_checkpoints(run_dir) or (run_dir / "metrics.jsonl").exists():
        raise RunDirError(f"run directory {run_dir} already holds a run; pass --resume to continue it, "
                          f"or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return run_dir


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
