"""Hostile-input soak: a real learner with a genuine actor host keeps training while every one of its sockets gets
hostile messages; then every message must be accounted for.

    .venv/bin/python ops/soak/fuzz.py --messages-per-socket 100000 [--seed S]

Starts a self-play Connect Four learner scaled down to update every second or so (its control socket also serves
the opponent pool), one genuine actor host, and ``python -m learner.pool.server`` on the learner's run directory.
A fake actor host registers like a real one (ops/soak/genuine.py) so that genuine ROWS blocks with a valid token
can be broken one field at a time. Then, socket by socket and class by class (ops/soak/targets.py), it sends
hostile messages: data blocks only when the PUSH socket reports room, requests at most WINDOW at a time. After
each data class it waits until the learner's metrics account for it. It prints a table and every check, and exits
1 when a check fails (ops/soak/README.md). Everything it started is stopped, whatever happens.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from genuine import RegisteredSender
from mutations import HostileClass, Outcome
from protocol import Limits, MessageType, ProtocolError, decode
from report import Check, ClassResult, Expectations, Observations, run_checks, table
from stack import Stack, StackOptions, read_metrics, rss_kib, wait_until
from targets import control_classes, data_classes, pool_classes

SMALL_SELFPLAY = ("trainer.num_workers=1", "trainer.batch_size=1024", "trainer.minibatch_size=512",
                  "trainer.forward_pass_minibatch_target_size=32", "trainer.update_epochs=1",
                  "trainer.total_timesteps=1000000000", "model.hidden_size=32", "network.rows_per_message=8",
                  "network.message_bytes=0",
                  "selfplay.snapshot_interval=5", "selfplay.alternation_steps=50", "run.checkpoint_interval=1000")
"""configs/selfplay_connect4.yaml scaled down to update about once a second on a 2-core machine."""
WINDOW = 32
"""Requests in flight at once on a request socket."""
REPLY_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0
KEEPALIVE_EVERY = 64
"""Messages between the registered sender's heartbeat checks."""


@dataclass(frozen=True, kw_only=True)
class FuzzOptions:
    """One soak run."""

    messages_per_socket: int
    """Hostile messages per socket (data, control, pool on the control socket, standalone pool server)."""
    seed: int
    """Seeds the choice of classes' variants and their random content."""
    work_dir: Path
    """Run directory and logs."""
    config: str = "configs/selfplay_connect4.yaml"
    """The learner's config (a self-play one, so the pool sockets get traffic too)."""
    overrides: tuple[str, ...] = SMALL_SELFPLAY
    """--set overrides."""
    settle_timeout_s: float = 30.0
    """How long to wait for the learner's metrics to account for a data class."""
    after_timeout_s: float = 60.0
    """How long to wait for updates after the hostile traffic."""
    expect: Expectations = field(default_factory=Expectations)
    """What the checks demand."""


@dataclass(frozen=True, kw_only=True)
class FuzzResult:
    """What ``run_fuzz`` returns."""

    observations: Observations
    """Everything measured."""
    checks: list[Check]
    """Every verdict."""

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def table(self) -> str:
        return table(self.observations, self.checks)


def split(total: int, classes: list[HostileClass]) -> list[int]:
    """Messages per class: ``total`` shared by the classes' ``share`` (each at least 1)."""
    weights = np.array([c.share for c in classes], dtype=np.float64)
    counts = np.maximum(1, np.floor(total * weights / weights.sum())).astype(int)
    counts[0] += max(0, total - int(counts.sum()))
    return [int(c) for c in counts]


class Fuzzer:
    """Sends the classes of one run, socket by socket, and records what came of them."""

    def __init__(self, stack: Stack, sender: RegisteredSender, context: zmq.Context, options: FuzzOptions) -> None:
        self.stack = stack
        self.sender = sender
        self.context = context
        self.options = options
        self.rng = np.random.default_rng(options.seed)
        self.limits = Limits()

    def last_record(self) -> dict[str, Any]:
        records = read_metrics(self.stack.run_dir)
        return records[-1] if records else {}

    # -- data ------------------------------------------------------------------------------------------------

    def data(self, cls: HostileClass, count: int) -> ClassResult:
        result = ClassResult(socket="data", name=cls.name, outcome=cls.outcome)
        before = self.last_record()
        for index in range(count):
            if index % KEEPALIVE_EVERY == 0:
                self.sender.keep_alive()
            variant, frames = cls.make(self.rng)
            deadline = time.monotonic() + SEND_TIMEOUT_S
            while not self.sender.send(frames, timeout_s=0.2):
                self.sender.keep_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the learner's data socket took nothing for {SEND_TIMEOUT_S:g} s")
            result.sent += 1
            result.variants[variant] += 1
        self._settle(result, before)
        return result

    def _settle(self, result: ClassResult, before: dict[str, Any]) -> None:
        """Wait until the learner's counters account for the class (or the timeout), then one update more."""
        must = result.sent if result.outcome in (Outcome.REJECTED, Outcome.DROPPED) else 0

        def accounted() -> bool:
            self.sender.keep_alive()
            after = self.last_record()
            dropped, rows = _data_delta(before, after)
            if result.outcome is Outcome.DROPPED:
                return dropped + rows >= must
            return dropped >= must and after.get("update", 0) > before.get("update", 0)

        wait_until(accounted, self.options.settle_timeout_s, interval_s=0.2)
        settled = self.last_record().get("update", 0)
        wait_until(lambda: self.sender.keep_alive() or self.last_record().get("update", 0) > settled,
                   self.options.settle_timeout_s, interval_s=0.2)
        after = self.last_record()
        result.dropped_messages, result.dropped_rows = _data_delta(before, after)
        if "messages_dropped_by_reason" in after:
            was = Counter(before.get("messages_dropped_by_reason", {}))
            result.dropped_by_reason = {k: v - was[k] for k, v in after["messages_dropped_by_reason"].items()
                                        if v - was[k]}

    # -- request sockets -----------------------------------------------------------------------------------------

    def requests(self, socket_name: str, url: str, cls: HostileClass, count: int) -> ClassResult:
        """Send ``count`` requests of ``cls`` from a fresh identity, at most WINDOW unanswered at once."""
        result = ClassResult(socket=socket_name, name=cls.name, outcome=cls.outcome)
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(url)
        try:
            waiting = 0
            while result.sent < count or waiting:
                if result.sent % KEEPALIVE_EVERY == 0:
                    self.sender.keep_alive()
                while result.sent < count and (waiting < WINDOW or cls.outcome is Outcome.SILENT):
                    variant, frames = cls.make(self.rng)
                    sock.send_multipart(frames)
                    result.sent += 1
                    result.variants[variant] += 1
                    waiting += cls.outcome is not Outcome.SILENT
                timeout = 0.5 if cls.outcome is Outcome.SILENT else REPLY_TIMEOUT_S
                if not sock.poll(int(timeout * 1000)):
                    break
                self._answer(result, sock.recv_multipart(copy=False))
                waiting = max(0, waiting - 1)
            while sock.poll(200):  # anything late (a SILENT class must get nothing at all)
                self._answer(result, sock.recv_multipart(copy=False))
                waiting = max(0, waiting - 1)
            result.unanswered = waiting
        finally:
            sock.close(linger=0)
        return result

    def _answer(self, result: ClassResult, frames: list) -> None:
        result.max_reply_bytes = max(result.max_reply_bytes, sum(len(f.buffer) for f in frames))
        try:
            reply = decode(frames, self.limits)
        except ProtocolError as err:
            result.other_replies[f"undecodable:{err.reason}"] += 1
            return
        if reply.type is MessageType.ERROR:
            result.errors[reply.fields["reason"]] += 1
        else:
            result.other_replies[reply.type.value] += 1

    # -- the whole run ---------------------------------------------------------------------------------------------

    def sockets(self) -> list[tuple[str, str | None, list[HostileClass]]]:
        """(socket name, request URL or None for data, classes), in the order they run."""
        plan = [("data", None, data_classes(self.sender)),
                ("control", self.stack.control_url, control_classes(self.sender))]
        if self.sender.shape.config.selfplay.enabled:
            plan.append(("pool_control", self.stack.control_url, pool_classes(standalone=False)))
        if self.stack.pool_url is not None:
            plan.append(("pool_server", self.stack.pool_url, pool_classes(standalone=True)))
        return plan

    def run(self, seen: Observations) -> None:
        for socket_name, url, classes in self.sockets():
            for cls, count in zip(classes, split(self.options.messages_per_socket, classes)):
                if url is None:
                    result = self.data(cls, count)
                else:
                    result = self.requests(socket_name, url, cls, count)
                seen.classes.append(result)
                print(f"  {socket_name}/{cls.name}: {result.sent} sent", flush=True)


def _data_delta(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """Messages dropped, and rows dropped as stale or future, between two metrics records."""
    dropped = after.get("messages_dropped", 0) - before.get("messages_dropped", 0)
    rows = sum(after.get(k, 0) - before.get(k, 0) for k in ("rows_dropped_stale", "rows_dropped_future"))
    return dropped, rows


def run_fuzz(options: FuzzOptions) -> FuzzResult:
    """Start everything, send the hostile traffic, stop everything; the observations and the checks."""
    seen = Observations()
    stack = Stack(StackOptions(config=options.config, overrides=options.overrides, host_workers=1,
                               pool_server=True, work_dir=options.work_dir))
    context = zmq.Context()
    sender = None
    try:
        stack.start(first_updates=2, timeout_s=180)
        sender = RegisteredSender(context, control_url=stack.control_url, name="fuzz-sender")
        fuzzer = Fuzzer(stack, sender, context, options)
        first = fuzzer.last_record()
        learner_pid = stack.learner().pid
        seen.rss_before_kib = rss_kib(learner_pid) or 0
        seen.updates_before = first.get("update", 0)
        fuzzer.run(seen)
        last = fuzzer.last_record()
        seen.updates_at_end_of_traffic = last.get("update", 0)
        wait_until(lambda: sender.keep_alive() or fuzzer.last_record().get("update", 0)
                   >= seen.updates_at_end_of_traffic + options.expect.min_updates_after, options.after_timeout_s)
        end = fuzzer.last_record()
        seen.updates_after = end.get("update", 0) - seen.updates_at_end_of_traffic
        seen.rss_after_kib = rss_kib(learner_pid) or 0
        seen.metrics_keys = tuple(end)
        if "control_rejected_by_reason" in end:
            was = Counter(first.get("control_rejected_by_reason", {}))
            seen.control_rejected_by_reason = {k: v - was[k] for k, v in end["control_rejected_by_reason"].items()}
        seen.sender_refusals = dict(sender.replies_refused)
        seen.dead = stack.dead()
    finally:
        if sender is not None:
            sender.close()
        context.destroy(linger=0)
        leftovers = stack.close()
        seen.leftover_processes, seen.leftover_shm = leftovers.processes, leftovers.shm_segments
        learner_log = options.work_dir / "learner.log"
        seen.learner_log_bytes = learner_log.stat().st_size if learner_log.exists() else 0
    return FuzzResult(observations=seen, checks=run_checks(seen, options.expect))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ops/soak/fuzz.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages-per-socket", type=int, default=100_000, help="default %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="default %(default)s")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directory and logs here")
    args = parser.parse_args(argv)
    if args.messages_per_socket < 1:
        parser.error(f"--messages-per-socket must be >= 1, got {args.messages_per_socket}")
    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as scratch:
        work_dir = args.keep or Path(scratch)
        work_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        result = run_fuzz(FuzzOptions(messages_per_socket=args.messages_per_socket, seed=args.seed,
                                      work_dir=work_dir))
        print(result.table())
        print(f"{time.monotonic() - started:.0f} s, seed {args.seed}, logs in {work_dir}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
