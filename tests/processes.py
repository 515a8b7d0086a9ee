"""Helpers for tests that start real learner and actor processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")


def free_port_triple() -> int:
    """A port p with p, p+1 and p+2 free on 127.0.0.1 (control, data, weights)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base > 65000:
            continue
        try:
            sockets = []
            for port in (base, base + 1, base + 2):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free port triple found")


def start(module: str, *args: str, log: Path) -> subprocess.Popen:
    """Start ``python -m module args`` with stdout+stderr to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    handle = log.open("w")
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=handle,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def descendants(pid: int) -> set[int]:
    """All live descendant PIDs of ``pid`` (from /proc)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def shm_segments(owner_pid: int) -> list[str]:
    """Sluice shared-memory segments owned by ``owner_pid``."""
    return sorted(p.name for p in SHM.glob(f"sluice_{owner_pid}_*"))


def kill_tree(proc: subprocess.Popen) -> None:
    """Last-resort cleanup so a failing test leaves nothing behind."""
    for pid in descendants(proc.pid) | {proc.pid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
