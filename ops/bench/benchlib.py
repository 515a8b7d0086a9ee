"""What every benchmark in ops/bench shares: the machine description and the one-JSON-object-per-line output.

Scripts here run as ``.venv/bin/python ops/bench/<name>.py`` (this folder is then first on sys.path, so
``from benchlib import emit, machine`` works).
"""

from __future__ import annotations

import json
import os
import platform


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


def emit(record: dict) -> None:
    """Print one benchmark's figures as one JSON object on one line (with the machine added)."""
    print(json.dumps({**record, "machine": record.get("machine", machine())}), flush=True)
