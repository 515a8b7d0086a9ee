"""What the scripts of ops/bench (throughput, peers) and ops/experiments (learning results) share: the machine
description and the one-JSON-object-per-line output.

Those scripts run as modules from the repository root, ``.venv/bin/python -m ops.bench.<name>`` or
``.venv/bin/python -m ops.experiments.<name>`` (``ops`` is then importable as a namespace package), and import
this as ``from ops.benchlib import emit, machine``.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's machine string)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line naming the machine a figure came from: CPU model, core count, OS."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


class SignalStop(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is (``sigterm_as_interrupt``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so ``finally`` blocks and context managers clean up
    (processes, temporary folders) on either. The previous handler is restored after."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise SignalStop(signum)


def run_stoppable(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())`` for a script's ``__main__``, with SIGTERM stopping it as Ctrl-C does: ``main``'s finally
    blocks and context managers clean up what it started (processes, shared memory, folders). A stop is one line on
    stderr and exit status 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    try:
        with sigterm_as_interrupt():
            code = main()
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"{Path(sys.argv[0]).stem}: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    sys.exit(code)


def end_process(process: Any, timeout_s: float) -> None:
    """Join a multiprocessing ``process`` for up to ``timeout_s``, then kill and join it if it still runs; nothing if
    it never started (a stop that came while it was being started)."""
    if process.pid is None:
        return
    process.join(timeout=timeout_s)
    if process.is_alive():
        process.kill()
        process.join()


def emit(record: dict) -> None:
    """Print one benchmark's figures as one JSON object on one line (with the machine added)."""
    print(json.dumps({**record, "machine": record.get("machine", machine())}), flush=True)
