"""The real processes a soak run drives: a learner, its genuine actor host and a standalone pool server.

Each process starts in its own session (its own process group), so stopping it takes its env workers with it.
``Stack.close`` asks each to stop, then kills whatever is left and reports what would have been left behind:
live processes and /dev/shm segments (which it removes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
STOP_WAIT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class StackOptions:
    """What to start."""

    config: str
    """The learner's run config, relative to the repository."""
    overrides: tuple[str, ...]
    """``--set SECTION.KEY=VALUE`` overrides laid over it (network.port is added)."""
    host_workers: int
    """Env worker processes of the genuine actor host (0: start no actor host)."""
    pool_server: bool
    """Also start ``python -m learner.pool.server`` on the learner's run directory (self-play configs)."""
    work_dir: Path
    """Where the run directory and the processes' logs go."""


@dataclass(frozen=True, kw_only=True)
class Leftovers:
    """What the stack's processes would have left behind when it was closed."""

    processes: tuple[str, ...]
    """Processes still alive after their stop signal and the wait (then killed)."""
    shm_segments: tuple[str, ...]
    """/dev/shm segments of the stack's processes still there after they exited (then removed)."""


def free_port_triple() -> int:
    """A port p with p to p+3 free on 127.0.0.1 (the learner's control, data and weights ports, and its /metrics)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        held: list[socket.socket] = []
        try:
            for port in (base, base + 1, base + 2, base + 3):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no four consecutive free ports found on 127.0.0.1")


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (VmRSS of /proc/PID/status), None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> set[int]:
    """Live descendant PIDs of ``pid`` (from /proc/PID/task/*/children)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for task in Path(f"/proc/{frontier.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            frontier.extend(c for c in children if c not in found)
            found.update(children)
    return found


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the run's metrics.jsonl (a partly written last line is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


class Stack:
    """Learner + genuine actor host (+ standalone pool server), started by ``start`` and stopped by ``close``."""

    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.port = free_port_triple()
        self.run_dir = options.work_dir / "run"
        self.pool_port = free_port_triple() if options.pool_server else None
        self.procs: dict[str, subprocess.Popen] = {}
        self.descendants: dict[str, set[int]] = {}

    @property
    def control_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def data_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port + 1}"

    @property
    def pool_url(self) -> str | None:
        return None if self.pool_port is None else f"tcp://127.0.0.1:{self.pool_port}"

    def learner(self) -> subprocess.Popen:
        return self.procs["learner"]

    def _start(self, name: str, module: str, *args: str) -> subprocess.Popen:
        log = (self.options.work_dir / f"{name}.log").open("w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.options.work_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, *, first_updates: int, timeout_s: float) -> None:
        """Start everything and wait until the learner has written ``first_updates`` metrics records (0: until
        it listens)."""
        overrides = [arg for item in self.options.overrides for arg in ("--set", item)]
        self._start("learner", "learner", "--config", self.options.config, "--run-dir", str(self.run_dir),
                    "--set", f"network.port={self.port}", *overrides)
        learner = self.learner()
        if not wait_until(lambda: learner.poll() is not None or "listening on" in self.log("learner"), timeout_s):
            raise RuntimeError(f"the learner did not start listening within {timeout_s:g} s:\n{self.log('learner')}")
        if learner.poll() is not None:
            raise RuntimeError(f"the learner exited with status {learner.returncode} before it listened:\n"
                               f"{self.log('learner')}")
        if self.options.host_workers:
            self._start("host", "actors", "--n", str(self.options.host_workers), "--learner", self.control_url)
        if self.pool_url is not None:
            self._start("pool_server", "learner.pool.server", "--run-dir", str(self.run_dir), "--bind", self.pool_url)
            if not wait_until(lambda: "serving on" in self.log("pool_server"), timeout_s):
                raise RuntimeError(f"the pool server did not start within {timeout_s:g} s:\n{self.log('pool_server')}")
        if not wait_until(lambda: len(read_metrics(self.run_dir)) >= first_updates, timeout_s):
            raise RuntimeError(f"the learner wrote fewer than {first_updates} metrics records in {timeout_s:g} s:\n"
                               f"{self.log('learner')[-3000:]}\n{self.log('host')[-3000:]}")
        for name, proc in self.procs.items():
            self.descendants[name] = descendants(proc.pid)

    def dead(self) -> list[str]:
        """Names of the started processes that are no longer running, with their exit status."""
        return [f"{name} (exit {proc.returncode})" for name, proc in self.procs.items() if proc.poll() is not None]

    def close(self) -> Leftovers:
        """Stop the learner (it tells the host to stop), the pool server and the host; kill what is left."""
        for name in ("learner", "pool_server", "host"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
        survivors = []
        for name, proc in self.procs.items():
            pids = {proc.pid} | self.descendants.get(name, set()) | descendants(proc.pid)
            alive = [pid for pid in pids if _running(pid)]
            if alive:
                survivors.append(f"{name}: pids {sorted(alive)}")
            _kill_group(proc)
        segments = []
        for name, proc in self.procs.items():
            for path in SHM.glob(f"sluice_{proc.pid}_*"):
                segments.append(path.name)
                path.unlink(missing_ok=True)
        return Leftovers(processes=tuple(survivors), shm_segments=tuple(segments))


def _running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
