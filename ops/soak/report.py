"""What a soak run observed, the checks it must pass, and the table it prints. Pure: no sockets, no processes,
so a test can hold a run's observations against expectations that cannot hold and see the checks fail."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mutations import Outcome

REQUEST_SOCKETS = ("control", "pool_control", "pool_server")
"""Sockets where every message gets an answer (or, for SILENT classes, none)."""
LEARNER_CONTROL_SOCKETS = ("control", "pool_control")
"""Request sockets served by the learner's control thread (its rejection counts cover them)."""


@dataclass(frozen=True, kw_only=True)
class Expectations:
    """What the checks demand."""

    max_rss_growth_mib: float = 256.0
    """Most the learner's resident memory may grow from before the hostile traffic to after it."""
    min_updates_after: int = 2
    """Updates the learner must make after the hostile traffic (training goes on)."""
    max_reply_bytes: int = 64 << 10
    """Largest answer a hostile request may get."""
    extra_data_drops: int = 0
    """Added to the data drops each class must cause (0; a test raises it to see the accounting check fail)."""


@dataclass(kw_only=True)
class ClassResult:
    """One hostile class on one socket."""

    socket: str
    """data, control, pool_control (pool requests on the learner's control socket) or pool_server."""
    name: str
    """The class's name."""
    outcome: Outcome
    """What the receiver must do with each of its messages."""
    sent: int = 0
    """Messages the socket took (data: only when it reported room; requests: all were answered or timed out)."""
    variants: Counter = field(default_factory=Counter)
    """Messages sent per variant."""
    errors: Counter = field(default_factory=Counter)
    """Requests: ERROR answers, by reason."""
    other_replies: Counter = field(default_factory=Counter)
    """Requests: answers other than ERROR, by type."""
    unanswered: int = 0
    """Requests: messages without an answer when the class ended."""
    max_reply_bytes: int = 0
    """Requests: the largest answer."""
    dropped_messages: int = 0
    """Data: messages the learner counted as dropped while this class ran."""
    dropped_by_reason: dict[str, int] | None = None
    """Data: the same by reason, when the learner's metrics record them (messages_dropped_by_reason)."""
    dropped_rows: int = 0
    """Data: rows the learner dropped as stale or future while this class ran."""


@dataclass(kw_only=True)
class Observations:
    """Everything a soak run measured."""

    classes: list[ClassResult] = field(default_factory=list)
    """Per socket and class, in the order they ran."""
    control_rejected_by_reason: dict[str, int] | None = None
    """Control rejections the learner's metrics counted during the hostile traffic, by reason (None: not there)."""
    metrics_keys: tuple[str, ...] = ()
    """Keys of the learner's last metrics record."""
    sender_refusals: dict[str, int] = field(default_factory=dict)
    """ERROR answers the registered fake sender got to its own heartbeats (it must stay registered)."""
    dead: list[str] = field(default_factory=list)
    """Started processes that were no longer running before the harness stopped them."""
    rss_before_kib: int = 0
    """Learner VmRSS before the hostile traffic."""
    rss_after_kib: int = 0
    """Learner VmRSS after it."""
    updates_before: int = 0
    """The learner's update count when the hostile traffic began."""
    updates_at_end_of_traffic: int = 0
    """Its update count when the hostile traffic ended."""
    updates_after: int = 0
    """Updates it made after the hostile traffic, while the harness waited."""
    leftover_processes: tuple[str, ...] = ()
    """Processes still alive after the harness stopped everything."""
    leftover_shm: tuple[str, ...] = ()
    """/dev/shm segments left behind."""
    learner_log_bytes: int = 0
    """Size of the learner's log at the end (what a flood of rejections writes)."""


@dataclass(frozen=True, kw_only=True)
class Check:
    """One verdict."""

    name: str
    """What was checked."""
    passed: bool
    """Whether it held."""
    detail: str
    """The figures behind it."""


def class_checks(result: ClassResult, expect: Expectations) -> list[Check]:
    """The verdicts on one class."""
    label = f"{result.socket}/{result.name}"
    if result.socket == "data":
        must = result.sent + expect.extra_data_drops
        reasons = "" if result.dropped_by_reason is None else f" {dict(result.dropped_by_reason)}"
        detail = (f"sent {result.sent}, dropped as messages {result.dropped_messages}{reasons}, "
                  f"rows dropped stale/future {result.dropped_rows}")
        if result.outcome is Outcome.REJECTED:
            passed = result.dropped_messages == must
            if result.dropped_by_reason is not None:
                passed = passed and sum(result.dropped_by_reason.values()) == must
            return [Check(name=f"{label}: every message dropped exactly once", passed=passed, detail=detail)]
        if result.outcome is Outcome.DROPPED:
            passed = result.dropped_messages <= must <= result.dropped_messages + result.dropped_rows
            return [Check(name=f"{label}: every message dropped (as a message or its row)", passed=passed,
                          detail=detail)]
        if result.outcome is Outcome.REPORTED:
            return []
        return [Check(name=f"{label}: genuine rows accepted (nothing dropped)",
                      passed=result.dropped_messages == 0 and expect.extra_data_drops == 0, detail=detail)]
    answered = sum(result.errors.values()) + sum(result.other_replies.values())
    detail = (f"sent {result.sent}, ERROR {sum(result.errors.values())} {dict(result.errors)}, other answers "
              f"{dict(result.other_replies)}, unanswered {result.unanswered}, largest answer {result.max_reply_bytes} B")
    if result.outcome is Outcome.SILENT:
        return [Check(name=f"{label}: no answer", passed=answered == 0, detail=detail)]
    return [Check(name=f"{label}: every message answered with ERROR",
                  passed=sum(result.errors.values()) == result.sent and answered == result.sent, detail=detail),
            Check(name=f"{label}: answers bounded", passed=result.max_reply_bytes <= expect.max_reply_bytes,
                  detail=f"largest {result.max_reply_bytes} B, limit {expect.max_reply_bytes} B")]


def run_checks(seen: Observations, expect: Expectations) -> list[Check]:
    """Every verdict of a soak run."""
    checks = [check for result in seen.classes for check in class_checks(result, expect)]
    errors = Counter()
    for result in seen.classes:
        if result.socket in LEARNER_CONTROL_SOCKETS:
            errors.update(result.errors)
    if seen.control_rejected_by_reason is not None:
        counted = {k: v for k, v in seen.control_rejected_by_reason.items() if v}
        checks.append(Check(name="learner's control rejections by reason match the ERROR answers",
                            passed=counted == {k: v for k, v in errors.items() if v},
                            detail=f"metrics {counted}, answers {dict(errors)}"))
    growth_mib = (seen.rss_after_kib - seen.rss_before_kib) / 1024
    checks += [
        Check(name="no process died", passed=not seen.dead, detail=", ".join(seen.dead) or "all alive"),
        Check(name="the registered sender stayed registered", passed=not seen.sender_refusals,
              detail=str(seen.sender_refusals or "never refused")),
        Check(name="learner memory bounded", passed=growth_mib <= expect.max_rss_growth_mib,
              detail=f"VmRSS {seen.rss_before_kib / 1024:.0f} -> {seen.rss_after_kib / 1024:.0f} MiB "
                     f"({growth_mib:+.0f} MiB, limit {expect.max_rss_growth_mib:g})"),
        Check(name="training goes on afterwards", passed=seen.updates_after >= expect.min_updates_after,
              detail=f"updates {seen.updates_before} -> {seen.updates_at_end_of_traffic} during the traffic, "
                     f"+{seen.updates_after} after (need {expect.min_updates_after})"),
        Check(name="nothing left behind", passed=not seen.leftover_processes and not seen.leftover_shm,
              detail=f"processes {list(seen.leftover_processes)}, /dev/shm {list(seen.leftover_shm)}"),
    ]
    return checks


def table(seen: Observations, checks: list[Check]) -> str:
    """The report: per socket and class what was sent and what came of it, then every check."""
    lines = [f"{'socket':<13} {'class':<19} {'expect':<9} {'sent':>8} {'refused':>8} {'other':>6} "
             f"{'rows_drop':>9}  reasons"]
    for r in seen.classes:
        if r.socket == "data":
            refused, other = r.dropped_messages, "-"
            reasons = r.dropped_by_reason if r.dropped_by_reason is not None else "(by reason: not in metrics)"
        else:
            refused, other = sum(r.errors.values()), str(sum(r.other_replies.values()) + r.unanswered)
            reasons = dict(r.errors) | {f"answer:{k}": v for k, v in r.other_replies.items()}
        rows = str(r.dropped_rows) if r.socket == "data" else "-"
        lines.append(f"{r.socket:<13} {r.name:<19} {r.outcome.value:<9} {r.sent:>8} {refused:>8} {other:>6} "
                     f"{rows:>9}  {reasons}")
    totals = Counter()
    for r in seen.classes:
        totals[r.socket] += r.sent
    lines.append("messages per socket: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    control = seen.control_rejected_by_reason
    lines.append(f"learner control rejections (metrics): {control if control is not None else 'not in metrics'}")
    lines.append(f"learner log: {seen.learner_log_bytes / 1e6:.1f} MB")
    lines.append("")
    for check in checks:
        lines.append(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    failed = sum(not c.passed for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} checks passed")
    return "\n".join(lines)
