"""Run provenance written into the run directory at start: command.txt (the command line), git.txt (commit and
whether the tree is dirty), versions.json (python and the main packages), and console.log, a copy of what the
learner prints and logs from then on.

Writing the record is RunFilesError on a disk error (learner/run/run_files.py). The copy into console.log stops, without
a word, when that file cannot be written any more (a full disk): the console itself goes on, and the learner's
own writers report the disk.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TextIO

from learner.run.run_files import writing

PACKAGES = ("torch", "numpy", "pyzmq", "sluice")
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def git_description(source_dir: Path) -> str:
    """"commit <hash>" and "dirty"/"clean" for the checkout holding ``source_dir``, or "not a git checkout"."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source_dir, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=source_dir, capture_output=True, text=True,
                                timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout\n"
    return f"commit {commit}\ntree {'dirty' if status.strip() else 'clean'}\n"


def package_versions() -> dict[str, str | None]:
    """Python's version and the installed version of each of PACKAGES (None where one is not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class ConsoleCopy:
    """Copies stdout and the log records into a file until closed (at the latest when the process exits)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", buffering=1)
        self.stdout = sys.stdout
        self.handler = _CopyHandler(path, mode="a")
        self.handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(self.handler)
        sys.stdout = _Tee(self.stdout, self.file)
        atexit.register(self.close)

    def close(self) -> None:
        """Stop copying: put stdout back (if nothing replaced it since) and close the file."""
        if isinstance(sys.stdout, _Tee) and sys.stdout.copy is self.file:
            sys.stdout = self.stdout
        logging.getLogger().removeHandler(self.handler)
        with contextlib.suppress(OSError):  # the disk is full: what could not be copied is lost
            self.handler.close()
        with contextlib.suppress(OSError):
            self.file.close()
        atexit.unregister(self.close)


class _CopyHandler(logging.FileHandler):
    """A FileHandler that stops (instead of printing a traceback for every record) once its file cannot be written."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            self.setLevel(logging.CRITICAL + 1)
        else:
            super().handleError(record)


class _Tee:
    """A text stream writing to the console and to a copy (the copy stops when it cannot be written)."""

    def __init__(self, console: TextIO, copy: TextIO) -> None:
        self.console = console
        self.copy = copy
        self.stopped = False

    def write(self, text: str) -> int:
        self._copy(self.copy.write, text)
        return self.console.write(text)

    def flush(self) -> None:
        self._copy(self.copy.flush)
        self.console.flush()

    def _copy(self, action: Callable[..., object], *args: str) -> None:
        """``action`` on the copy; after an error writing it, the copy is left alone (a close would fail again)."""
        if self.stopped or self.copy.closed:
            return
        try:
            action(*args)
        except OSError:
            self.stopped = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.console, name)


def write_run_record(run_dir: Path, command: list[str] | None = None) -> ConsoleCopy:
    """Write command.txt (``command``, default this process's command line as typed), git.txt and versions.json
    into ``run_dir`` and start copying the console to console.log; the caller may close the returned copy (the
    process's exit does)."""
    with writing(run_dir / "command.txt"):
        (run_dir / "command.txt").write_text(shlex.join(sys.orig_argv if command is None else command) + "\n")
    with writing(run_dir / "git.txt"):
        (run_dir / "git.txt").write_text(git_description(Path(__file__).resolve().parent))
    with writing(run_dir / "versions.json"):
        (run_dir / "versions.json").write_text(json.dumps(package_versions(), indent=2) + "\n")
    with writing(run_dir / "console.log"):
        return ConsoleCopy(run_dir / "console.log")
