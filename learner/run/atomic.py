"""Atomic writes of the run directory: a file, or a whole directory, appears complete or not at all.

The one owner of the temp-then-rename writing that checkpoints (learner/run/checkpoint.py), the pool store
(learner/pool/store.py), metrics.jsonl's rewrite on resume (learner/monitor/metrics_log.py) and the kept best
(evaluation/best_snapshot.py) share:

* ``atomic_write_bytes`` / ``atomic_write_text``: a hidden temp file (``.tmp-*``) in the target's directory, written,
  fsynced, renamed over the target (``os.replace``), then the directory fsynced; a failure removes the temp file.
* ``atomic_directory``: a hidden temp directory (``.tmp-*``) beside the target for the caller to fill; when the
  block ends without error every file in it is fsynced and it is renamed into place (an existing target is first
  renamed aside to ``.old-<name>``, never deleted before the new one is in place), the parent is fsynced and the
  old one removed; a failure removes the temp directory. ``restore_set_aside`` puts back a target that a crash
  between the two renames left aside.
* ``fsync_path``: fsync a file or a directory by path.

Errors are the OS's (``OSError``), unchanged: callers that write the run directory turn disk errors into
``RunFilesError`` with ``learner.run.run_files.writing``, as before. This lives in learner/ because its users are
learner/ and evaluation/ (above learner in the import order); nothing below learner writes files atomically.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMP_PREFIX = ".tmp-"
"""Names of the temporary files and directories (hidden, in the target's directory)."""
ASIDE_PREFIX = ".old-"
"""Name prefix of a replaced directory while ``atomic_directory`` moves the new one into place."""


def fsync_path(path: Path) -> None:
    """fsync the file or directory at ``path`` (a directory: so a rename or a new file in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a hidden temp file in the same directory: fsync, rename, fsync the dir."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a hidden temporary directory beside ``final`` (whose parent must exist) to fill; on a clean exit every
    file in it is fsynced and it replaces ``final`` (the old one renamed aside first, removed after), then the
    parent is fsynced. On any error (also KeyboardInterrupt) the temporary directory is removed and the error
    raised; a crash between the two renames leaves the old one at ``.old-<name>`` (``restore_set_aside``)."""
    root = final.parent
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=root))
    try:
        yield tmp
        for path in tmp.iterdir():
            fsync_path(path)
        aside = root / f"{ASIDE_PREFIX}{final.name}"
        if final.exists():  # replacing: move the old one aside, never delete it first
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        os.rename(tmp, final)
        fsync_path(root)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def restore_set_aside(root: Path) -> None:
    """Put back, in ``root``, every directory ``atomic_directory`` moved aside and whose replacement never arrived
    (a crash between its two renames)."""
    for aside in root.glob(f"{ASIDE_PREFIX}*"):
        final = root / aside.name[len(ASIDE_PREFIX):]
        if not final.exists():
            os.rename(aside, final)
