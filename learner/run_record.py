"""Run provenance written into the run directory at start: command.txt (the command line), git.txt (commit and
whether the tree is dirty), versions.json (python and the main packages), and console.log, a copy of what the
learner prints and logs from then on."""

from __future__ import annotations

import atexit
import json
import logging
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TextIO

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
        self.handler = logging.FileHandler(path, mode="a")
        self.handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(self.handler)
        sys.stdout = _Tee(self.stdout, self.file)
        atexit.register(self.close)

    def close(self) -> None:
        """Stop copying: put stdout back (if nothing replaced it since) and close the file."""
        if isinstance(sys.stdout, _Tee) and sys.stdout.copy is self.file:
            sys.stdout = self.stdout
        logging.getLogger().removeHandler(self.handler)
        self.handler.close()
        self.file.close()
        atexit.unregister(self.close)


class _Tee:
    """A text stream writing to the console and to a copy."""

    def __init__(self, console: TextIO, copy: TextIO) -> None:
        self.console = console
        self.copy = copy

    def write(self, text: str) -> int:
        if not self.copy.closed:
            self.copy.write(text)
        return self.console.write(text)

    def flush(self) -> None:
        if not self.copy.closed:
            self.copy.flush()
        self.console.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self.console, name)


def write_run_record(run_dir: Path, command: list[str] | None = None) -> ConsoleCopy:
    """Write command.txt (``command``, default this process's command line as typed), git.txt and versions.json
    into ``run_dir`` and start copying the console to console.log; the caller may close the returned copy (the
    process's exit does)."""
    (run_dir / "command.txt").write_text(shlex.join(sys.orig_argv if command is None else command) + "\n")
    (run_dir / "git.txt").write_text(git_description(Path(__file__).resolve().parent))
    (run_dir / "versions.json").write_text(json.dumps(package_versions(), indent=2) + "\n")
    return ConsoleCopy(run_dir / "console.log")
