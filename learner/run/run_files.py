"""Run files that cannot be written: a full disk, a read-only or foreign run directory.

Every writer of the run directory (checkpoints, metrics.jsonl, TensorBoard, the run record, config.yaml) turns an
``OSError`` of this kind (``DISK_ERRNOS``) into ``RunFilesError``, one line naming the path and the OS's reason.
The learner stops on it through the same shutdown as SIGTERM (actor hosts are told to exit), keeps the last good
checkpoint, and exits 1; a run directory that cannot be written at start is the same one line and exit 1.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT})
"""What a full disk or quota, a read-only mount or missing permissions raise."""


class RunFilesError(Exception):
    """A file of the run directory cannot be written (full disk, read-only, no permission)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason


def as_run_files_error(err: OSError, path: Path) -> RunFilesError | None:
    """``err`` as a RunFilesError about ``path`` when it is a disk error (DISK_ERRNOS), else None."""
    if err.errno not in DISK_ERRNOS:
        return None
    return RunFilesError(path, err.strerror or os.strerror(err.errno))


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Raise a disk error (DISK_ERRNOS) from the block as RunFilesError naming ``path``; others pass unchanged."""
    try:
        yield
    except OSError as err:
        converted = as_run_files_error(err, path)
        if converted is None:
            raise
        raise converted from err


def check_writable(run_dir: Path) -> None:
    """RunFilesError unless a file can be created in ``run_dir`` and in its checkpoints/ (when that exists): what a
    resumed run writes first, checked before anything is started."""
    for directory in (run_dir, run_dir / "checkpoints"):
        if not directory.is_dir():
            continue
        with writing(directory):
            fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=directory)
            os.close(fd)
            os.unlink(probe)
