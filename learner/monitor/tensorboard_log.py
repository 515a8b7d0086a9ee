"""TensorBoard scalars of each metrics.jsonl record, in run_dir/tensorboard/, with agent_steps as the step.

Every numeric value of a record becomes one scalar; a nested dict (messages_dropped_by_reason) becomes
"name/key" scalars; None, booleans and text are skipped. A resumed run passes ``purge_step`` (one past the agent
steps of its checkpoint) so TensorBoard hides the events a crashed process wrote after that checkpoint.

TensorBoard writes events from a thread of its own; a disk error there is raised again by the next write or
flush of the main thread, where it becomes RunFilesError naming run_dir/tensorboard (learner/run/run_files.py). The
thread's own report of it (a traceback on stderr) is left out, so a full disk is one line, not several.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from learner.run.run_files import DISK_ERRNOS, writing

STEP_KEY = "agent_steps"


def scalars_of(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The (tag, value) pairs of one record: finite numbers, nested dicts flattened to "name/key"."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars_of(value, prefix=f"{tag}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield tag, float(value)


def step_scalars(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """One record as every scalar logger takes it (TensorBoard here, W&B and MLflow in
    learner/monitor/tracking.py): its agent_steps and its scalars; None for a record without agent_steps."""
    step = record.get(STEP_KEY)
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    return step, dict(scalars_of(record))


class QuietWriterDiskErrors:
    """A threading.excepthook: TensorBoard's writer thread dying of a disk error is not reported there (the main
    thread's next write or flush raises it again); everything else goes to the hook it was put in front of."""

    def __init__(self, previous: Callable[[threading.ExceptHookArgs], Any]) -> None:
        self.previous = previous

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        if (type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError)
                and args.exc_value.errno in DISK_ERRNOS):
            return
        self.previous(args)

    @classmethod
    def install(cls) -> None:
        """Put one in front of threading.excepthook (once per process)."""
        if not isinstance(threading.excepthook, cls):
            threading.excepthook = cls(threading.excepthook)


class TensorBoardLog:
    """Writes each record's scalars to TensorBoard event files and flushes them, one record at a time."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        QuietWriterDiskErrors.install()
        self.log_dir = log_dir
        with writing(log_dir):
            self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        """Log one record at its agent_steps (a record without them is skipped); RunFilesError on a disk error."""
        logged = step_scalars(record)
        if logged is None:
            return
        step, scalars = logged
        with writing(self.log_dir):
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, global_step=step)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file (RunFilesError on a disk error)."""
        with writing(self.log_dir):
            self.writer.close()
