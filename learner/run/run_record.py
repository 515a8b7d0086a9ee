"""Run provenance written into the run directory at start: command.txt (the command line), git.txt (commit and
whether the tree is dirty), versions.json (python and the main packages), and console.log, a copy of what the
learner's terminal shows from then on.

console.log holds what the terminal showed: everything written to stdout and stderr (``print``, the logging
records of the handlers writing there, warnings, tracebacks), in the order written, and the progress line's text
(learner/monitor/progress.py: every event and plain line; in live mode the live line's text at most once per its
plain interval and its last text, not every redraw), without terminal control codes (ANSI escape sequences, and a
``\\r`` keeps only what follows it, as a terminal would show it). ``ConsoleCopy`` does this by standing in for
``sys.stdout`` and ``sys.stderr`` (and the stream of every logging handler that wrote to them), and, on a terminal,
it clears the live progress line before anything else is written and draws it again after a whole line.
``begin_console_copy`` starts copying before the run directory is known (kept in memory, up to
``EARLY_COPY_CHARS``, until ``write_run_record`` names the file).

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
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import ClassVar, Protocol, TextIO

from learner.run.run_files import writing

PACKAGES = ("torch", "numpy", "pyzmq", "sluice")


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


EARLY_COPY_CHARS = 1_000_000
"""What ``begin_console_copy`` keeps in memory at most until the run directory is known (later text is lost)."""
CONTROL_SEQUENCE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
"""An ANSI escape sequence: CSI (colours, erase, cursor moves), OSC (window titles) or a two-character one."""


def plain_line(line: str) -> str:
    """One line as a terminal leaves it, without control codes: escape sequences removed, only the text after the
    last carriage return kept (a trailing one, of a CRLF, aside)."""
    line = CONTROL_SEQUENCE.sub("", line.removesuffix("\r"))
    return line.rsplit("\r", 1)[-1]


class StatusLine(Protocol):
    """A line a terminal shows below everything else and redraws (the live progress line)."""

    lock: threading.RLock
    stream: TextIO
    copy: Callable[[str], None] | None

    def hide(self) -> None:
        """Clear the line: other output follows."""

    def show(self) -> None:
        """Draw the line again: the other output ended a line."""


class ConsoleCopy:
    """Stands in for stdout and stderr, copying what is written to them into console.log until closed (at the
    latest when the process exits), and keeps a live status line (``hold_status_line``) off the other output."""

    active: ClassVar[ConsoleCopy | None] = None
    """The copy of this process, while one is open."""

    def __init__(self, path: Path | None) -> None:
        """``path``: console.log (None: kept in memory until ``attach``)."""
        self.lock = threading.RLock()
        self.file: TextIO | None = None
        self.early: list[str] | None = [] if path is None else None
        self.early_chars = 0
        self.partial = ""
        """The copy's unfinished last line."""
        self.stopped = False
        """console.log could not be written: nothing more is copied."""
        self.at_line_start = True
        """Whether the terminal's cursor is at the start of a line (the last write ended a line)."""
        self.status: StatusLine | None = None
        self.stdout, self.stderr = sys.stdout, sys.stderr
        self.streams = (_ConsoleStream(self, self.stdout), _ConsoleStream(self, self.stderr))
        self.handlers: list[tuple[logging.StreamHandler, TextIO]] = []
        if path is not None:
            self.file = path.open("a", buffering=1)
        sys.stdout, sys.stderr = self.streams
        for handler in logging.getLogger().handlers:  # basicConfig's handler holds the stderr it was given
            if type(handler) is logging.StreamHandler and handler.stream in (self.stdout, self.stderr):
                self.handlers.append((handler, handler.stream))
                handler.setStream(self.streams[0] if handler.stream is self.stdout else self.streams[1])
        ConsoleCopy.active = self
        atexit.register(self.close)

    def attach(self, path: Path) -> None:
        """Copy into ``path`` from now on, starting with what was kept in memory."""
        with self.lock:
            if self.file is not None:
                return
            self.file = path.open("a", buffering=1)
            early, self.early = self.early or [], None
            self._write_copy("".join(early))

    def hold_status_line(self, status: StatusLine) -> None:
        """Keep ``status`` (the live progress line) off everything else written to the terminal, and copy its
        lines into console.log. Call before the threads that print start: ``status`` takes this copy's lock."""
        with self.lock:
            if isinstance(status.stream, _ConsoleStream):  # it writes to the terminal itself
                status.stream = status.stream.console
            status.lock = self.lock
            status.copy = self.copy_text
            self.status = status

    def write(self, console: TextIO, text: str) -> int:
        """``text`` to the terminal stream ``console`` and to the copy, the status line cleared around it."""
        with self.lock:
            status = self.status
            if status is not None and self.at_line_start and text:
                status.hide()
            try:
                written = console.write(text)
                console.flush()  # stdout and stderr share the terminal: each write shows in the order made
            finally:
                self.copy_text(text)
                if text:
                    self.at_line_start = text.endswith("\n")
                if status is not None and self.at_line_start:
                    status.show()
            return written

    def copy_text(self, text: str) -> None:
        """``text`` into the copy only, whole lines without control codes."""
        with self.lock:
            if self.stopped or "\n" not in text and len(self.partial) < 100_000:
                self.partial += "" if self.stopped else text
                return
            lines = (self.partial + text).split("\n")
            self.partial = lines.pop()
            self._write_copy("".join(plain_line(line) + "\n" for line in lines))

    def _write_copy(self, text: str) -> None:
        if not text or self.stopped:
            return
        if self.file is None:
            if self.early is not None and self.early_chars + len(text) <= EARLY_COPY_CHARS:
                self.early.append(text)
                self.early_chars += len(text)
            return
        try:
            self.file.write(text)
        except (OSError, ValueError):  # the disk is full (or the file closed): the copy stops
            self.stopped = True

    def close(self) -> None:
        """Stop copying: put stdout, stderr and the logging handlers' streams back (where nothing replaced them
        since) and close the file (an unfinished last line is kept)."""
        with self.lock:
            if self.partial:
                self.partial, rest = "", self.partial
                self._write_copy(plain_line(rest) + "\n")
            if sys.stdout is self.streams[0]:
                sys.stdout = self.stdout
            if sys.stderr is self.streams[1]:
                sys.stderr = self.stderr
            for handler, stream in self.handlers:
                if handler.stream in self.streams:
                    handler.setStream(stream)
            self.handlers = []
            if self.status is not None:
                self.status.copy = None
                self.status = None
            if self.file is not None:
                with contextlib.suppress(OSError):  # the disk is full: what could not be copied is lost
                    self.file.close()
            self.stopped = True
            if ConsoleCopy.active is self:
                ConsoleCopy.active = None
        atexit.unregister(self.close)


class _ConsoleStream:
    """sys.stdout or sys.stderr while a ConsoleCopy is open: writes go through the copy to ``console``."""

    def __init__(self, copy: ConsoleCopy, console: TextIO) -> None:
        self.copier = copy
        self.console = console

    def write(self, text: str) -> int:
        return self.copier.write(self.console, text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.console.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self.console, name)


class _Tee:
    """A text stream writing to a console and to a copy that stops when it cannot be written (the earlier, stdout-only
    console copy; ConsoleCopy replaced it, tests/test_disk_errors.py still checks its full-disk behaviour)."""

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
        if self.stopped or self.copy.closed:
            return
        try:
            action(*args)
        except OSError:
            self.stopped = True


def begin_console_copy() -> ConsoleCopy:
    """Start copying the console now, before the run directory is known (the command line's warnings): kept in
    memory until ``write_run_record`` writes it into console.log; the caller closes it when no run starts."""
    return ConsoleCopy.active if ConsoleCopy.active is not None else ConsoleCopy(None)


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
        if ConsoleCopy.active is not None and ConsoleCopy.active.file is None:  # begun early: now into the file
            ConsoleCopy.active.attach(run_dir / "console.log")
            return ConsoleCopy.active
        return ConsoleCopy(run_dir / "console.log")
