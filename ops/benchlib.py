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
from collections.abc import Iterator
from contextlib import contextmanager


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
    raise KeyboardInterrupt(f"signal {signum}")


def emit(record: dict) -> None:
    """Print one benchmark's figures as one JSON object on one line (with the machine added)."""
    print(json.dumps({**record, "machine": record.get("machine", machine())}), flush=True)
