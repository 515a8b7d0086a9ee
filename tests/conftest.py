"""The run-time half of the integration mark's guard (tests/test_markers.py reads the source; this watches the run).

A test not marked ``integration`` that starts a process (subprocess.Popen, os.fork / posix_spawn / exec / system,
a multiprocessing child or process pool, here or in the library code it calls) fails, naming what it started, so
``bash ops/test.sh --fast`` (``-m "not integration and not slow"``) never starts a learner, actor host, env worker or
spawned child. Two short-lived tools are let through: ``git`` (a run records its source commit with ``git rev-parse``)
and ``ffmpeg`` (imageio-ffmpeg's encoder behind ``evaluation.evaluate --video``).

Nothing happens at import: the audit hook and the multiprocessing wrapper are set up in pytest_configure.
"""

from __future__ import annotations

import os
import sys

import pytest

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                            "os.system"})
"""Audit events (docs.python.org/3/library/audit_events.html) that start a process."""
ALLOWED_TOOLS = ("git", "ffmpeg", "fc")
"""Short-lived tools a unit test may run through library code, by program name (``fc``: fc-list, which matplotlib's
first import in a new environment runs to build its font cache)."""

_state: dict = {"test": None, "found": {}, "start": None}
"""The unmarked test now running (its nodeid, or None), what each started, the original Process.start."""


def _what(event: str, args: tuple) -> str | None:
    """What the event starts, or None when it is allowed."""
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        argv = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or [])
        program = os.path.basename(os.fsdecode(executable or (argv[0] if argv else "")))
        if program.split("-")[0] in ALLOWED_TOOLS:  # ffmpeg-linux-x86_64-v9.0.2 is ffmpeg
            return None
        return "subprocess " + " ".join(os.fsdecode(a) for a in argv)[:160]
    return event


def _audit(event: str, args: tuple) -> None:
    if event in PROCESS_EVENTS and _state["test"] is not None:
        what = _what(event, args)
        if what is not None:
            _state["found"].setdefault(_state["test"], []).append(what)


def _watched_start(process) -> None:
    if _state["test"] is not None:
        _state["found"].setdefault(_state["test"], []).append(f"multiprocessing {type(process).__name__}")
    _state["start"](process)


def pytest_configure(config: pytest.Config) -> None:
    import multiprocessing.process

    if _state["start"] is None:
        sys.addaudithook(_audit)  # an audit hook cannot be removed; it does nothing outside an unmarked test
        _state["start"] = multiprocessing.process.BaseProcess.start
        multiprocessing.process.BaseProcess.start = _watched_start


def pytest_unconfigure(config: pytest.Config) -> None:
    import multiprocessing.process

    if _state["start"] is not None:
        multiprocessing.process.BaseProcess.start = _state["start"]
        _state["start"] = None
    _state["test"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _state["test"] = None if item.get_closest_marker("integration") else item.nodeid
    try:
        yield
    finally:
        _state["test"] = None
        _state["found"].pop(item.nodeid, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    started = _state["found"].pop(item.nodeid, [])
    if started and not report.failed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process but is not marked integration: "
                           f"{'; '.join(dict.fromkeys(started))}\nadd `pytestmark = pytest.mark.integration` near "
                           f"the module's imports (or @pytest.mark.integration on the test): "
                           f"bash ops/test.sh --fast must not start processes")
