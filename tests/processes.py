"""Helpers for tests that start real learner and actor processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")


def free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65000:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} free ports in a row found")


def free_port_triple() -> int:
    """A port p with p to p+3 free on 127.0.0.1 (control, data, weights, and the learner's /metrics)."""
    return free_ports(4)


def start(module: str, *args: str, log: Path) -> subprocess.Popen:
    """Start ``python -m module args`` with stdout+stderr to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    handle = log.open("w")
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=handle,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def descendants(pid: int) -> set[int]:
    """All live descendant PIDs of ``pid`` (from /proc), except multiprocessing's resource trackers: the first
    spawned child of a process (an env worker, the env spec's child) starts one, which lives exactly as long as that
    process (a test process that spawned anything has one until it exits)."""
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
    return {child for child in found if not _is_resource_tracker(child)}


def _is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` runs multiprocessing's (or multiprocess's) resource tracker."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def session_members(session: int) -> set[int]:
    """Live (not zombie) PIDs of session ``session`` (a process started with start_new_session=True leads one whose
    id is its PID): its descendants, orphaned ones included, which ``descendants`` no longer finds once it exited."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            members.add(int(stat.parent.name))
    return members


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


def ipc_files(owner_pid: int) -> list[str]:
    """The data socket files (/tmp/sluice_<pid>_data<rank>, protocol/same_machine.py) a learner ``owner_pid`` left."""
    return sorted(p.name for p in Path("/tmp").glob(f"sluice_{owner_pid}_data*"))


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


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Run:
    """A learner plus actor hosts, cleaned up whatever happens."""

    def __init__(self, tmp_path: Path, *learner_args: str, config: str = "configs/cartpole.yaml") -> None:
        self.tmp = tmp_path
        self.port = free_port_triple()
        self.run_dir = tmp_path / "run"
        self.learner_args = ["--config", config, "--run-dir", str(self.run_dir),
                             "--set", f"network.port={self.port}", *learner_args]
        self.procs: list = []
        self.workers: dict[int, set[int]] = {}

    def learner(self, *extra: str, log: str = "learner.log"):
        proc = start("learner", *self.learner_args, *extra, log=self.tmp / log)
        self.procs.append(proc)
        return proc

    def actors(self, n: int = 2, log: str = "actors.log"):
        proc = start("actors", "--n", str(n), "--learner", f"tcp://127.0.0.1:{self.port}", log=self.tmp / log)
        self.procs.append(proc)
        return proc

    def note_workers(self, proc) -> set[int]:
        """Remember the env worker processes of an actor host (to check they are gone later)."""
        wait_for(lambda: len(descendants(proc.pid)) >= 1, 30)
        self.workers[proc.pid] = descendants(proc.pid)
        return self.workers[proc.pid]

    def train_to_the_end(self, workers: int = 2, *, learner_timeout: float = 240) -> None:
        """Start the learner and one actor host of ``workers`` env workers, wait until the run ends by itself (both
        exit 0, else the failing side's log), and check nothing is left behind."""
        learner, actors = self.learner(), self.actors(workers)
        self.note_workers(actors)
        assert learner.wait(timeout=learner_timeout) == 0, self.log("learner.log")
        assert actors.wait(timeout=30) == 0, self.log("actors.log")
        self.assert_clean()

    def log(self, name: str) -> str:
        return (self.tmp / name).read_text()

    def assert_clean(self) -> None:
        for proc in self.procs:
            assert proc.poll() is not None, f"process {proc.args} still running"
            assert not alive(proc.pid)
            children = self.workers.get(proc.pid, set()) | descendants(proc.pid)
            assert wait_for(lambda: not any(alive(c) for c in children), 5), f"orphans of {proc.args}"
            assert shm_segments(proc.pid) == [], f"leaked shared memory of {proc.pid}"
            assert ipc_files(proc.pid) == [], f"leaked ipc socket files of {proc.pid}"

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc)
