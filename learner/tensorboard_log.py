"""TensorBoard scalars of each metrics.jsonl record, in run_dir/tensorboard/, with agent_steps as the step.

Every numeric value of a record becomes one scalar; a nested dict (messages_dropped_by_reason) becomes
"name/key" scalars; None, booleans and text are skipped. A resumed run passes ``purge_step`` (one past the agent
steps of its checkpoint) so TensorBoard hides the events a crashed process wrote after that checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

STEP_KEY = "agent_steps"


def scalars_of(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The (tag, value) pairs of one record: finite numbers, nested dicts flattened to "name/key"."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars_of(value, prefix=f"{tag}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield tag, float(value)


class TensorBoardLog:
    """Writes each record's scalars to TensorBoard event files and flushes them, one record at a time."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        """Log one record at its agent_steps (a record without them is skipped)."""
        step = record.get(STEP_KEY)
        if not isinstance(step, int) or isinstance(step, bool):
            return
        for tag, value in scalars_of(record):
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
