"""What a follower learner rank's ingest counted between two updates, carried to rank 0 (issue 15).

Actor hosts report env steps, episodes and timings in the ROWS messages they send, and those go to whichever rank
the host is routed to. Rank 0 owns the run's counters (stop rules, metrics, checkpoints), so every follower sends it
the difference since its previous report with each "ready" mark (learner/ranks/store.py), and rank 0 merges it into
its own ingest's counters as if its socket had received those messages. The report also carries how long the
follower waited for its rows (its ``rows_wait_s``), which rank 0 shows per rank.

Encoded as msgpack (no pickle); decoding checks the shape and fails loudly on anything else.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import msgpack

from learner.serve.ingest import IngestStats

RECENT = 100
"""The ingest keeps the last 100 episodes' figures; a report carries at most that many new ones."""


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """A follower rank's counts since its previous report."""

    rows_wait_s: float
    """Seconds the rank waited for its batch's rows since its previous update ended."""
    env_steps: int = 0
    """Env steps reported by the hosts whose rows it received."""
    agent_steps: int = 0
    """Agent steps reported."""
    env_restarts: int = 0
    """Env groups rebuilt on those hosts."""
    episodes: int = 0
    """Episodes finished."""
    returns: list[float] = field(default_factory=list)
    """Returns of the newest of those episodes (at most RECENT)."""
    lengths: list[int] = field(default_factory=list)
    """Their lengths."""
    named_stats: dict[str, list[float]] = field(default_factory=dict)
    """The env's named episode statistics, newest values (at most RECENT each)."""
    host_stats: dict[str, float] = field(default_factory=dict)
    """Hosts' timing counters (protocol.rows.HOST_STATS)."""
    rows_received: int = 0
    """Rows accepted into its batches."""
    rows_dropped: dict[str, int] = field(default_factory=dict)
    """Rows dropped, by reason."""
    messages_dropped: dict[str, int] = field(default_factory=dict)
    """Messages rejected, by reason."""
    bytes_received: int = 0
    """Bytes of data messages received."""
    lag_sum: int = 0
    """Sum of the accepted rows' policy lag."""
    lag_max: int = 0
    """Largest policy lag of an accepted row."""
    lag_rows: int = 0
    """Rows behind lag_sum."""

    def encode(self) -> bytes:
        """msgpack bytes."""
        return msgpack.packb(asdict(self), use_bin_type=True)

    @classmethod
    def decode(cls, payload: bytes) -> RankReport:
        """The report ``encode`` wrote; ValueError when the payload is not one."""
        fields = msgpack.unpackb(payload, raw=False)
        if not isinstance(fields, dict):
            raise ValueError(f"rank report must be a map, got {type(fields).__name__}")
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"rank report: {err}") from err


@dataclass(kw_only=True)
class ReportCursor:
    """A follower's position in its ingest's cumulative counters: what it already reported."""

    counts: dict[str, int] = field(default_factory=dict)
    """The cumulative counters at the previous report."""
    by_reason: dict[str, Counter] = field(default_factory=dict)
    """The cumulative per-reason counters at the previous report."""

    def take(self, stats: IngestStats, *, rows_wait_s: float) -> RankReport:
        """The report of what ``stats`` counted since the previous take; resets its since-last-take figures (policy
        lag, host timing), which this rank then no longer shows itself."""
        with stats.lock:
            now = {"env_steps": stats.env_steps, "agent_steps": stats.agent_steps,
                   "env_restarts": stats.env_restarts, "episodes": stats.episodes,
                   "rows_received": stats.rows_received, "bytes_received": stats.bytes_received}
            reasons = {"rows_dropped": Counter(stats.rows_dropped), "messages_dropped": Counter(stats.messages_dropped)}
            delta = {name: value - self.counts.get(name, 0) for name, value in now.items()}
            new = min(delta["episodes"], RECENT)
            report = RankReport(
                rows_wait_s=rows_wait_s, **delta,
                returns=[float(v) for v in list(stats.recent_returns)[len(stats.recent_returns) - new:]],
                lengths=[int(v) for v in list(stats.recent_lengths)[len(stats.recent_lengths) - new:]],
                named_stats={name: [float(v) for v in list(values)[len(values) - min(new, len(values)):]]
                             for name, values in stats.recent_stats.items()},
                host_stats={name: float(value) for name, value in stats.host_stats.items()},
                rows_dropped=dict(reasons["rows_dropped"] - self.by_reason.get("rows_dropped", Counter())),
                messages_dropped=dict(reasons["messages_dropped"] - self.by_reason.get("messages_dropped", Counter())),
                lag_sum=stats.lag_sum, lag_max=stats.lag_max, lag_rows=stats.lag_rows)
            stats.lag_sum = stats.lag_max = stats.lag_rows = 0
            stats.host_stats.clear()
        self.counts, self.by_reason = now, reasons
        return report


def merge_report(stats: IngestStats, report: RankReport) -> None:
    """Add a follower's report to rank 0's ingest counters."""
    with stats.lock:
        stats.env_steps += report.env_steps
        stats.agent_steps += report.agent_steps
        stats.env_restarts += report.env_restarts
        stats.episodes += report.episodes
        stats.recent_returns.extend(report.returns)
        stats.recent_lengths.extend(report.lengths)
        for name, values in report.named_stats.items():
            stats.recent_stats.setdefault(name, type(stats.recent_returns)(maxlen=RECENT)).extend(values)
        stats.host_stats.update(report.host_stats)
        stats.rows_received += report.rows_received
        stats.rows_dropped.update(report.rows_dropped)
        stats.messages_dropped.update(report.messages_dropped)
        stats.bytes_received += report.bytes_received
        stats.lag_sum += report.lag_sum
        stats.lag_max = max(stats.lag_max, report.lag_max)
        stats.lag_rows += report.lag_rows
