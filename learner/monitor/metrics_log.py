"""metrics.jsonl (one JSON object per update), and its TensorBoard scalars.

The console shows these records through learner/monitor/progress.py's ProgressLine (this module prints nothing).

A resumed run continues from its last checkpoint, so the records a crashed run wrote after that checkpoint are
written again: opening the log drops every record newer than the update it resumes from (and a torn last line),
rewriting the file atomically (temp file, fsync, rename), so each update appears once. The same records go to
TensorBoard event files in run_dir/tensorboard/ (learner/monitor/tensorboard_log.py), purged the same way on resume.
The learner opens the log only after the checkpoint it resumes from was checked (learner/run/resume_point.py), so a
damaged checkpoint never cuts the file. A disk error (full, read-only) from either writer is one RunFilesError
naming the file (learner/run/run_files.py); closing is quiet about them (each record was flushed as it was written,
so what a close could not flush is what a write already failed on, and the learner reported that).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from learner.run.atomic import atomic_write_text
from learner.run.run_files import RunFilesError, writing
from learner.monitor.tensorboard_log import STEP_KEY, TensorBoardLog

LOG = logging.getLogger("sluice.learner")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def drop_records_after(path: Path, update: int) -> int:
    """Keep only the records of updates <= ``update`` in the metrics file at ``path`` (atomically); returns how
    many lines were dropped (newer records, and lines that are not a whole record, e.g. torn by a crash)."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if (number := _update_of(line)) is not None and number <= update]
    if len(kept) == len(lines):
        return 0
    atomic_write_text(path, "".join(line if line.endswith("\n") else line + "\n" for line in kept))
    return len(lines) - len(kept)


def last_record(path: Path) -> dict[str, Any] | None:
    """The last whole record of the metrics file at ``path`` (None without one)."""
    if not path.exists():
        return None
    for line in reversed(path.read_text().splitlines()):
        if _update_of(line) is not None:
            return json.loads(line)
    return None


def _update_of(line: str) -> int | None:
    """The ``update`` of one metrics.jsonl line, None if it is not a whole record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    update = record.get("update") if isinstance(record, dict) else None
    return update if isinstance(update, int) and not isinstance(update, bool) else None


class MetricsLog:
    """Appends one JSON line per update (and its TensorBoard scalars); the console line is ProgressLine's."""

    def __init__(self, path: Path, *, resumed_at_update: int = 0, tensorboard_dir: Path | None = None) -> None:
        """``tensorboard_dir``: where the event files go (default: tensorboard/ beside the metrics file);
        ``resumed_at_update``: the update of the checked checkpoint a resumed run continues from (ValueError < 0)."""
        if resumed_at_update < 0:
            raise ValueError(f"resumed_at_update must be >= 0, got {resumed_at_update}")
        self.path = path
        with writing(path):
            dropped = drop_records_after(path, resumed_at_update)
            self.file = path.open("a", buffering=1)
        if dropped:
            LOG.info("%s: dropped %d records newer than update %d (they are written again)", path, dropped,
                     resumed_at_update)
        self.tensorboard = TensorBoardLog(tensorboard_dir or path.parent / "tensorboard",
                                          purge_step=_purge_step(path, resumed_at_update))

    def write(self, record: dict[str, Any]) -> None:
        """Log one update (to the file and TensorBoard; nothing is printed); RunFilesError on a disk error."""
        with writing(self.path):
            self.file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self.tensorboard.write(record)

    def close(self) -> None:
        """Flush and close, quiet about disk errors (see the module's docstring)."""
        try:
            with writing(self.path):
                self.file.close()
        except RunFilesError as err:
            LOG.debug("%s", err)
        try:
            self.tensorboard.close()
        except RunFilesError as err:
            LOG.debug("%s", err)


def _purge_step(path: Path, resumed_at_update: int) -> int | None:
    """TensorBoard's purge_step for a run resumed at ``resumed_at_update`` (None for a fresh run): one past the
    agent steps of the last record kept, so the events written after the checkpoint are hidden."""
    if resumed_at_update <= 0:
        return None
    kept = last_record(path)
    step = None if kept is None else kept.get(STEP_KEY)
    return step + 1 if isinstance(step, int) else 0
