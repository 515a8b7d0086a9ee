"""Which checkpoint a resumed run continues from: the newest intact one, or the one ``--checkpoint N`` names.

``pick_checkpoint`` reads and checks checkpoints newest first (learner/run/checkpoint_integrity.py) and changes nothing;
the learner then ``settle``s on its choice: one console line per damaged checkpoint (the last also says which one
the run resumes from), a note for a checkpoint older code wrote without a manifest, and every checkpoint newer
than the chosen one moved aside (``damaged-update_N`` or ``superseded-update_N`` beside the others), so pruning
and a later --resume never mix them with the checkpoints the resumed run writes. Only after this is anything of
the run rewritten (metrics.jsonl, TensorBoard and the opponent pool are cut back to the chosen update).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from learner.run.checkpoint import PREFIX, Checkpoint, list_checkpoints, load_checkpoint
from learner.run.checkpoint_integrity import MANIFEST, CheckpointDamaged
from learner.run.run_dir import RunDirError

LOG = logging.getLogger("sluice.learner")


class NoIntactCheckpoint(Exception):
    """No checkpoint the run could continue from is intact (or the one asked for is damaged): exit 1."""


@dataclass(frozen=True, kw_only=True)
class ResumePoint:
    """The checkpoint a resumed run continues from, and what was found on the way to it."""

    path: Path
    """Its directory."""
    checkpoint: Checkpoint
    """Its contents, checked."""
    damaged: tuple[tuple[Path, str], ...] = ()
    """Newer checkpoints found damaged, newest first: (directory, "file: reason")."""
    superseded: tuple[Path, ...] = ()
    """Newer intact checkpoints passed over because --checkpoint asked for an older one."""
    has_manifest: bool = True
    """False for a checkpoint older code wrote (its checksums could not be checked)."""

    def notes(self) -> list[str]:
        """The console lines that say what was damaged and where the run resumes from."""
        lines = [f"learner: checkpoint {path.name} is damaged ({reason})" for path, reason in self.damaged]
        if lines:
            lines[-1] += f"; resuming from {self.path.name}"
        if not self.has_manifest:
            lines.append(f"learner: note: checkpoint {self.path.name} has no {MANIFEST} (older code wrote it): its "
                         "files' checksums are not checked, only its weights and counters")
        return lines


def pick_checkpoint(run_dir: Path, wanted: int | None = None) -> ResumePoint:
    """The newest intact checkpoint of ``run_dir`` (``wanted``: the one of that update). NoIntactCheckpoint when
    none is intact or ``wanted`` is damaged, RunDirError when ``wanted`` does not exist."""
    checkpoints = list_checkpoints(run_dir)
    if wanted is not None:
        return _pick_wanted(run_dir, checkpoints, wanted)
    damaged: list[tuple[Path, str]] = []
    for path in reversed(checkpoints):
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointDamaged as err:
            damaged.append((path, str(err)))
            continue
        return ResumePoint(path=path, checkpoint=checkpoint, damaged=tuple(damaged),
                           has_manifest=(path / MANIFEST).exists())
    found = "; ".join(f"{path.name}: {reason}" for path, reason in damaged) or "none"
    raise NoIntactCheckpoint(f"cannot resume: no intact checkpoint in {run_dir / 'checkpoints'} ({found})")


def _pick_wanted(run_dir: Path, checkpoints: list[Path], wanted: int) -> ResumePoint:
    names = ", ".join(path.name for path in checkpoints) or "none"
    path = run_dir / "checkpoints" / f"{PREFIX}{wanted:08d}"
    if path not in checkpoints:
        raise RunDirError(f"cannot resume from --checkpoint {wanted}: {path} does not exist; the run has {names}")
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointDamaged as err:
        raise NoIntactCheckpoint(f"cannot resume from --checkpoint {wanted}: {path.name} is damaged ({err}); the "
                                 f"run has {names}") from err
    return ResumePoint(path=path, checkpoint=checkpoint, superseded=tuple(p for p in checkpoints if p.name > path.name),
                       has_manifest=(path / MANIFEST).exists())


def settle(point: ResumePoint, say: Callable[[str], None]) -> None:
    """Say what ``point`` found (its notes, through ``say``) and move every newer checkpoint aside."""
    for line in point.notes():
        say(line)
    for path, _reason in point.damaged:
        _move_aside(path, "damaged-")
    for path in point.superseded:
        _move_aside(path, "superseded-")


def resume_checkpoint(run_dir: Path, *, resume: bool, point: ResumePoint | None,
                      chosen: Callable[[Path | None], None] = lambda path: None) -> Checkpoint | None:
    """With ``resume``, the checkpoint a run continues from: ``point``, else the newest intact one
    (NoIntactCheckpoint when none is); None for a fresh run or one without a checkpoint yet. ``chosen`` hears the
    choice's path (None: none), before the run's files are settled on it (``settle``: what was damaged is said, newer
    checkpoints are moved aside)."""
    if not resume:
        point = None
    elif point is None and list_checkpoints(run_dir):
        point = pick_checkpoint(run_dir)
    chosen(None if point is None else point.path)
    if point is None:
        return None
    settle(point, say=lambda line: print(line, flush=True))
    LOG.info("resumed from %s (update %d, %d env steps)", point.path.name,
             point.checkpoint.trainer_state.update, point.checkpoint.trainer_state.env_steps)
    return point.checkpoint


def _move_aside(path: Path, prefix: str) -> None:
    target = path.with_name(prefix + path.name)
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{prefix}{path.name}.{number}")
    os.rename(path, target)
    LOG.info("moved %s aside to %s", path, target.name)
