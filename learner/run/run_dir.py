"""The run directory: runs/<name>-<timestamp>/ with config.yaml, metrics.jsonl, checkpoints/, logs.

A resumed run takes its config.yaml as it was saved: one that is empty, cut short (keys missing from its end) or
missing sections is refused with one line naming the file and what is missing (a missing key may be given with
--set), never filled in from the defaults. Keys missing before the file's last key are keys a later version added
to a section of a whole file: their defaults apply, said in one line.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from configs.loader import ConfigError, config_to_dict, load_config, parse_override
from configs.plan import make_plan
from configs.schema import SECTIONS, RunConfig
from learner.run.checkpoint import list_checkpoints
from learner.run.run_files import writing

LOG = logging.getLogger("sluice.learner")

MISSING_SHOWN = 6
"""How many missing keys the error about a cut config.yaml names before it says how many more."""


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
    with writing(run_dir / "config.yaml"):
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
    defaulted = check_saved_config(saved, overrides)
    if defaulted:
        LOG.warning("learner: %s has no %s (keys added to Sluice since this run began): their defaults apply",
                    saved, ", ".join(defaulted))
    try:
        return load_config(saved, overrides)
    except ConfigError as err:
        raise RunDirError(f"cannot resume from {run_dir}: {err}") from err


def check_saved_config(path: Path, overrides: list[str]) -> list[str]:
    """RunDirError unless the run's saved config ``path`` is a whole one: not empty, valid YAML, every section of the
    schema present, and no key missing from its end (a key may come from ``overrides`` instead). A file cut short
    loses its end; keys missing before the last key present are keys a later Sluice added to a section (the file is
    whole): returned, so the caller says their defaults apply."""
    text = path.read_text(errors="replace")
    if not text.strip():
        raise RunDirError(f"cannot resume: {path} is empty (cut short when it was written?); restore the run's config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 1}"
        raise RunDirError(f"cannot resume: {path} is not valid YAML{where} (cut short?): "
                          f"{getattr(err, 'problem', None) or type(err).__name__}") from err
    if not isinstance(data, dict):
        raise RunDirError(f"cannot resume: {path} is not a mapping of config sections (cut short?)")
    given = {f"{section}.{key}" for text in overrides for section, values in _override_keys(text) for key in values}
    ordered = [(name, f"{name}.{field.name}", isinstance(data.get(name), dict) and field.name in data[name])
               for name, cls in SECTIONS.items() for field in dataclasses.fields(cls)]
    last_present = max((i for i, (_, _, present) in enumerate(ordered) if present), default=-1)
    sections = [name for name in SECTIONS if not isinstance(data.get(name), dict) or not data[name]]
    cut = [key for i, (name, key, present) in enumerate(ordered)
           if not present and key not in given and i > last_present and name not in sections]
    if sections or cut:
        parts = [f"sections {', '.join(sections)}"] if sections else []
        if cut:
            more = f" and {len(cut) - MISSING_SHOWN} more" if len(cut) > MISSING_SHOWN else ""
            parts.append(f"keys {', '.join(cut[:MISSING_SHOWN])}{more}")
        raise RunDirError(f"cannot resume: {path} is missing {' and '.join(parts)} (cut short?); restore the run's "
                          "config (a missing key can be given with --set), it is never filled in with defaults")
    return [key for i, (name, key, present) in enumerate(ordered) if not present and key not in given
            and i < last_present]


def _override_keys(text: str) -> list[tuple[str, dict]]:
    """The (section, keys) one --set override gives; none for one that does not parse (load_config reports it)."""
    try:
        return list(parse_override(text).items())
    except ConfigError:
        return []


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


def schedule_jump_warning(run_dir: Path, config: RunConfig, *, update: int) -> str | None:
    """A warning when ``config`` (the resumed run's, --set applied) changes the schedules' length
    (trainer.total_timesteps // trainer.batch_size) from the saved config.yaml's: the learning rate, entropy
    and clip schedules then jump from where the checkpoint left them (at ``update``). None when nothing jumps."""
    saved_config = load_config(run_dir / "config.yaml")
    saved = saved_config.trainer
    old_epochs = make_plan(saved, num_agents=saved_config.env.num_agents).total_epochs
    new_epochs = make_plan(config.trainer, num_agents=config.env.num_agents).total_epochs
    if old_epochs == new_epochs:
        return None
    old_progress, new_progress = (min(1.0, update / epochs) for epochs in (old_epochs, new_epochs))
    return (f"resuming with trainer.total_timesteps {config.trainer.total_timesteps:,} (batch_size "
            f"{config.trainer.batch_size:,}) instead of the saved {saved.total_timesteps:,} (batch_size "
            f"{saved.batch_size:,}): the learning rate, entropy and clip schedules jump: progress at the checkpoint "
            f"(update {update}) was {old_progress:.1%} of the old total ({old_epochs} updates) and is "
            f"{new_progress:.1%} of the new one ({new_epochs} updates)")
