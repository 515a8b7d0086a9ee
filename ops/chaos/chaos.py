"""Chaos run: one training run through what a cluster does to it, in one script (root: namespaces, nftables, tmpfs).

    .venv/bin/python ops/chaos/chaos.py [--pause-s 30] [--partition-s 20] [--peer-timeout-s 10] [--keep DIR]

A learner in one network namespace (its run directory on a small tmpfs) and an actor host in another (CartPole that
hangs on demand, ops/chaos/hang_env.py), over a veth link, both with network.peer_timeout_s at --peer-timeout-s
(default: the config's default, 10 s; the pauses and the partition should outlast it).
In order:

1. the learner SIGSTOPped for --pause-s, then continued;
2. the link cut both ways by nftables for --partition-s, then healed;
3. the actor host SIGSTOPped for --pause-s, then continued;
4. one env step that never returns (env.step_timeout_s 5);
5. the learner killed (SIGKILL), the newest checkpoint damaged (an exponent byte flipped in every 37th float of
   model.safetensors), the learner started again with --resume;
6. the run directory's disk filled.

Cases 1-5 pass when updates resume within a bound, case 6 when the learner stops with exit 1 and one line naming the
path and "No space left on device", the host stops too, and the newest checkpoint left is intact. The table at the
end gives, per case, the seconds from the fault's end to the next update (or to the stop) and what was said. Exit 1
when a case fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from learner.run.checkpoint import load_checkpoint  # noqa: E402  (after the path insert)
from ops.chaos.hang_env import TRIGGER_VARIABLE  # noqa: E402
from tests.netns import NFT, NamespacePair, missing_requirements  # noqa: E402
from tests.processes import kill_tree, metrics, wait_for  # noqa: E402

PORT = 5555
RESUME_BOUND_S = 60.0
"""Seconds after a fault ends within which the next update must come (cases 1-5)."""
STOP_BOUND_S = 60.0
"""Seconds after the disk fills within which the learner and the host must have stopped (case 6)."""
HEARTBEATS_PER_TIMEOUT = 8
"""A short --peer-timeout-s shortens the heartbeat interval (1 s by default) to this fraction of it."""
DISK_BYTES = 96 * 2 ** 20
"""Size of the tmpfs holding the run directory."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One case's row of the table."""

    case: str
    """What was done."""
    passed: bool
    """Whether the promise held."""
    seconds: float | None
    """From the fault's end to the next update (or to the clean stop); None when it never came."""
    said: str
    """The line the run said about it (learner or host), shortened."""


class ChaosRun:
    """The two namespaces, the tmpfs, the learner and the host; everything undone by ``close``."""

    def __init__(self, root: Path, *, peer_timeout_s: float) -> None:
        self.root = root
        self.peer_timeout_s = peer_timeout_s
        self.disk = root / "disk"
        self.disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(self.disk)], check=True)
        self.run_dir = self.disk / "run"
        self.trigger = root / "hang"
        os.environ[TRIGGER_VARIABLE] = str(self.trigger)
        self.pair = NamespacePair()
        self.learner: subprocess.Popen | None = None
        self.host: subprocess.Popen | None = None
        self.learner_starts = 0

    def start_learner(self, *, resume: bool = False) -> None:
        """The learner in its namespace; ``resume``: from the run directory's checkpoints and saved config."""
        self.learner_starts += 1
        settings = ("network.host", self.pair.learner_ip), ("network.port", PORT), (
            "trainer.target_episode_return", "null"), ("trainer.total_timesteps", 10 ** 12), (
            "run.checkpoint_interval", 5), ("env.name", "native"), (
            "env.entry_point", "ops.chaos.hang_env:HangOnTrigger"), ("env.step_timeout_s", 5), (
            "network.peer_timeout_s", self.peer_timeout_s), (
            "network.heartbeat_interval_s", min(1.0, self.peer_timeout_s / HEARTBEATS_PER_TIMEOUT))
        config = ["--resume"] if resume else ["--config", "configs/cartpole.yaml"]
        for key, value in ([] if resume else settings):
            config += ["--set", f"{key}={value}"]
        self.learner = self.pair.python(self.pair.learner_ns, "learner", "--run-dir", str(self.run_dir), *config,
                                        "--insecure", log=self.log_path("learner"))

    def start_host(self) -> None:
        self.host = self.pair.python(self.pair.host_ns, "actors", "--n", "1", "--learner",
                                     f"tcp://{self.pair.learner_ip}:{PORT}", "--insecure", log=self.root / "host.log")

    def log_path(self, name: str) -> Path:
        return self.root / (f"{name}.log" if name != "learner" else f"learner-{self.learner_starts}.log")

    def log(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def updates(self) -> int:
        return len(metrics(self.run_dir))

    def close(self) -> None:
        for proc in (self.learner, self.host):
            if proc is not None and proc.poll() is None:
                kill_tree(proc)
        self.pair.remove()
        subprocess.run(["umount", "-l", str(self.disk)], check=False)


def last_line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    return lines[-1][:160] if lines else f"(no line with {needle!r})"


def recovery(run: ChaosRun, *, before: int, since: float) -> float | None:
    """Seconds from ``since`` to the first update past ``before`` (None: none within RESUME_BOUND_S)."""
    if not wait_for(lambda: run.updates() > before, RESUME_BOUND_S, interval=0.2):
        return None
    return time.monotonic() - since


def paused(run: ChaosRun, pid: int, seconds: float, *, case: str, say_log: str, needle: str) -> Outcome:
    before = run.updates()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)
    took = recovery(run, before=run.updates(), since=time.monotonic())
    return Outcome(case=case, passed=took is not None and run.updates() > before, seconds=took,
                   said=last_line_with(run.log(say_log), needle))


def partitioned(run: ChaosRun, seconds: float) -> Outcome:
    run.pair.partition()
    try:
        time.sleep(seconds)
        before = run.updates()
    finally:
        run.pair.heal()
    took = recovery(run, before=before, since=time.monotonic())
    return Outcome(case=f"partition {seconds:.0f} s", passed=took is not None, seconds=took,
                   said=last_line_with(run.log("learner"), "forgotten"))


def hanging_env(run: ChaosRun) -> Outcome:
    run.trigger.touch()
    began = time.monotonic()
    restarted = wait_for(lambda: "stuck: no answer" in run.log("host"), 30)
    before = run.updates()
    took = recovery(run, before=before, since=began)
    return Outcome(case="env step that never returns", passed=restarted and took is not None, seconds=took,
                   said=last_line_with(run.log("host"), "stuck: no answer"))


def flip_exponents(path: Path) -> None:
    """Flip the exponent byte of every 37th float32 of a safetensors file (past its header)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    for offset in range(start + 3, len(data), 4 * 37):
        data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def damaged_checkpoint(run: ChaosRun) -> Outcome:
    assert run.learner is not None
    run.learner.send_signal(signal.SIGKILL)  # a crash: the host stays, and registers with the next learner
    run.learner.wait(timeout=60)
    checkpoints = sorted((run.run_dir / "checkpoints").glob("update_*"))
    newest, intact = checkpoints[-1], checkpoints[-2]
    fallback_update = int(intact.name.split("_")[1])
    flip_exponents(newest / "model.safetensors")
    began = time.monotonic()
    run.start_learner(resume=True)

    def updated_past_fallback() -> bool:
        return max((record["update"] for record in metrics(run.run_dir)), default=0) > fallback_update

    listening = wait_for(lambda: "listening on" in run.log("learner"), RESUME_BOUND_S)  # after the records' purge
    took = (time.monotonic() - began if listening and wait_for(updated_past_fallback, RESUME_BOUND_S, interval=0.2)
            else None)
    said = last_line_with(run.log("learner"), "is damaged")
    kept = {record["update"] for record in metrics(run.run_dir)} >= set(range(1, fallback_update + 1))
    passed = took is not None and f"resuming from {intact.name}" in said and kept
    return Outcome(case=f"damaged newest checkpoint ({newest.name}), --resume", passed=passed, seconds=took, said=said)


def full_disk(run: ChaosRun) -> Outcome:
    assert run.learner is not None and run.host is not None
    filler = run.disk / "filler"
    began = time.monotonic()
    with open(filler, "wb") as sink:
        try:
            while True:
                sink.write(b"\0" * (1 << 20))
        except OSError:
            pass
    try:
        code = run.learner.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - began
    try:
        host_code = run.host.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        host_code = None
    out = run.log("learner")
    said = [line for line in out.splitlines() if "No space left on device" in line]
    newest = sorted((run.run_dir / "checkpoints").glob("update_*"))[-1]
    try:
        load_checkpoint(newest)
        intact = True
    except (OSError, ValueError) as err:
        print(f"chaos: the newest checkpoint {newest} does not load: {err}", file=sys.stderr)
        intact = False
    filler.unlink()
    passed = code == 1 and len(said) == 1 and "Traceback" not in out and host_code is not None and intact
    return Outcome(case="disk full", passed=passed, seconds=took if code is not None else None,
                   said=said[0][:160] if said else "(no line with 'No space left on device')")


def table(outcomes: list[Outcome]) -> str:
    rows = ["| case | result | seconds | said |", "| --- | --- | --- | --- |"]
    for outcome in outcomes:
        seconds = "-" if outcome.seconds is None else f"{outcome.seconds:.1f}"
        rows.append(f"| {outcome.case} | {'ok' if outcome.passed else 'FAILED'} | {seconds} | `{outcome.said}` |")
    return "\n".join(rows)


def run_cases(run: ChaosRun, args: argparse.Namespace) -> list[Outcome]:
    run.start_learner()
    run.start_host()
    if not wait_for(lambda: run.updates() >= 10, 180):
        raise SystemExit("chaos: the run did not reach 10 updates in 180 s\n" + run.log("learner")[-2000:])
    assert run.learner is not None and run.host is not None
    cases: list[Callable[[], Outcome]] = [
        lambda: paused(run, run.learner.pid, args.pause_s, case=f"learner SIGSTOP {args.pause_s:.0f} s",
                       say_log="learner", needle="did not run for"),
        lambda: partitioned(run, args.partition_s),
        lambda: paused(run, run.host.pid, args.pause_s, case=f"actor host SIGSTOP {args.pause_s:.0f} s",
                       say_log="learner", needle="forgotten"),
        lambda: hanging_env(run),
        lambda: damaged_checkpoint(run),
        lambda: full_disk(run),
    ]
    outcomes = []
    for case in cases:
        outcomes.append(case())
        print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pause-s", type=float, default=30.0, help="how long the learner and the host are stopped")
    parser.add_argument("--partition-s", type=float, default=20.0, help="how long the link is cut")
    parser.add_argument("--peer-timeout-s", type=float, default=10.0,
                        help="network.peer_timeout_s of the run (the faults should last longer)")
    parser.add_argument("--keep", type=Path, help="keep the logs here (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    missing = missing_requirements() or (None if Path(NFT).exists() else "nftables' nft is missing")
    if missing is not None:
        print(f"chaos: {missing}", file=sys.stderr)
        return 2
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="sluice-chaos-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        run = ChaosRun(root, peer_timeout_s=args.peer_timeout_s)
        try:
            outcomes = run_cases(run, args)
        finally:
            run.close()
    print(table(outcomes))
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
