"""The ingest's counters and their only writer.

Actor hosts report env steps, episodes and timings with every ROWS message (``protocol.rows.STEP_COUNTS``,
``HOST_STATS``); the ingest counts those and what it did with each message's rows. ``IngestCounters`` holds every
such counter behind one lock, and every change goes through one of its methods: a message accepted or refused, a
checkpoint's totals resumed, a follower rank's delta merged. Readers get frozen copies: ``totals`` (any thread, at
any time), ``take_snapshot`` (the update loop, once per update: the since-last-take figures start again) and
``take_delta`` (a follower rank, once per update: what it counted since its previous delta, for rank 0 to merge).

The cumulative counts are one table (``COUNTS``, ``COUNTS_BY_REASON``), which the totals, the deltas and the merge
all walk, so a new counter is one entry there and one field in the frozen views.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

import msgpack
import numpy as np

from learner.serve.row_checks import HostReport
from protocol.rows import STEP_COUNTS

RECENT = 100
"""Episodes whose returns, lengths and named statistics are kept (the console's and the stop rules' window)."""
COUNTS: tuple[str, ...] = (*STEP_COUNTS, "episodes", "rows_received", "bytes_received")
"""The cumulative counts: env steps, agent steps and env restarts as the hosts report them, episodes finished, rows
accepted into a batch, bytes of data messages (accepted or refused)."""
HOST_LEFT = "host_left"
"""The drop reason of rows a host sent before its registration ended (BYE, silence, a new registration): a normal
stop's rows in flight, not a refusal (the console's drop summary and the dropped-messages alert leave it out)."""
COUNTS_BY_REASON: tuple[str, ...] = ("rows_dropped", "messages_dropped")
"""The cumulative counts by reason: rows dropped (stale, future), messages refused (the protocol's and row_checks'
reasons, not_registered, identity_mismatch, too_large; each message under exactly one)."""


@dataclass(frozen=True, kw_only=True)
class IngestTotals:
    """The counters as they are now (``IngestCounters.totals``)."""

    env_steps: int
    """Env steps reported by actor hosts over the run (a resumed run's totals included)."""
    agent_steps: int
    """Agent steps reported by actor hosts over the run."""
    env_restarts: int
    """Env groups rebuilt on actor hosts, since this learner started."""
    episodes: int
    """Episodes finished over the run."""
    rows_received: int
    """Rows accepted into a batch, since this learner started."""
    bytes_received: int
    """Bytes of data messages received (accepted or not), since this learner started."""
    rows_dropped: dict[str, int]
    """Rows dropped by reason (stale, future), since this learner started."""
    messages_dropped: dict[str, int]
    """Messages rejected by reason, since this learner started."""
    lag_sum: int = 0
    """Sum of the policy lag of the rows accepted since the last take."""
    lag_max: int = 0
    """Largest policy lag of a row accepted since the last take (0 when none was)."""
    lag_rows: int = 0
    """Rows behind lag_sum."""
    host_stats: dict[str, float] = field(default_factory=dict)
    """Actor hosts' timing counters (protocol.rows.HOST_STATS) summed since the last take."""


@dataclass(frozen=True, kw_only=True)
class IngestSnapshot:
    """What the ingest has counted, as ``IngestCounters.take_snapshot`` hands it to the update loop."""

    env_steps: int
    """Env steps reported by actor hosts over the run (a resumed run's totals included)."""
    agent_steps: int
    """Agent steps reported by actor hosts over the run (what total_timesteps counts)."""
    episodes: int
    """Episodes finished over the run."""
    env_restarts: int
    """Env groups that raised and were rebuilt on actor hosts, since this learner started."""
    recent_returns: tuple[float, ...]
    """Returns of the last 100 episodes."""
    recent_lengths: tuple[int, ...]
    """Lengths of the last 100 episodes."""
    episode_stat_means: dict[str, float | None]
    """Mean of each of the env's named episode statistics over its last 100 values (None while there are none)."""
    rows_received: int
    """Rows accepted into a batch, since this learner started."""
    rows_dropped_stale: int
    """Rows dropped as older than max_policy_lag, since this learner started."""
    rows_dropped_future: int
    """Rows dropped as newer than the learner's weights, since this learner started."""
    messages_dropped: int
    """Messages rejected, all reasons together, since this learner started."""
    messages_dropped_by_reason: dict[str, int]
    """Messages rejected since this learner started, by reason (they add up to messages_dropped)."""
    policy_lag_mean: float
    """Mean policy lag of the rows accepted since the last take (0.0 when none were)."""
    policy_lag_max: int
    """Largest policy lag of the rows accepted since the last take (0 when none were)."""
    host_timing: dict[str, float | None]
    """Actor hosts' inference and worker figures since the last take (``host_timing`` of their host_stats)."""


@dataclass(frozen=True, kw_only=True)
class IngestDelta:
    """What one ingest counted between two ``take_delta`` calls: a follower learner rank's counts, which it carries
    to rank 0 with each "ready" mark (learner/ranks/lockstep.py) and rank 0 merges as if its own socket had received
    those messages. Encoded as msgpack (no pickle); decoding checks the shape and fails loudly on anything else."""

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
    def decode(cls, payload: bytes) -> IngestDelta:
        """The delta ``encode`` wrote; ValueError when the payload is not one."""
        fields = msgpack.unpackb(payload, raw=False)
        if not isinstance(fields, dict):
            raise ValueError(f"rank report must be a map, got {type(fields).__name__}")
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"rank report: {err}") from err


def _newest(values: deque, count: int) -> list:
    """The newest ``count`` of ``values`` (none for 0)."""
    count = min(count, len(values))
    return list(values)[len(values) - count:] if count else []


class IngestCounters:
    """Every counter of one ingest, behind one lock; the only code that changes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self._by_reason: dict[str, Counter] = {name: Counter() for name in COUNTS_BY_REASON}
        self._returns: deque = deque(maxlen=RECENT)
        self._lengths: deque = deque(maxlen=RECENT)
        self._named: dict[str, deque] = {}
        self._host_stats: Counter = Counter()
        self._lag_sum = self._lag_max = self._lag_rows = 0
        self._delivered: tuple[dict[str, int], dict[str, Counter]] = (dict.fromkeys(COUNTS, 0),
                                                                       {n: Counter() for n in COUNTS_BY_REASON})
        """The cumulative counts at the previous ``take_delta``."""

    def refused(self, reason: str, nbytes: int) -> None:
        """A data message of ``nbytes`` was refused for ``reason``."""
        with self._lock:
            self._by_reason["messages_dropped"][reason] += 1
            self._counts["bytes_received"] += nbytes

    def accepted(self, report: HostReport, *, nbytes: int, fresh_lags: np.ndarray, stale: int, future: int) -> None:
        """A data message of ``nbytes`` passed every check: its host's ``report``, the policy lags of the rows kept,
        and how many were dropped as ``stale`` or ``future``."""
        with self._lock:
            counts = self._counts
            for name in STEP_COUNTS:
                counts[name] += getattr(report, name)
            counts["bytes_received"] += nbytes
            counts["episodes"] += len(report.returns)
            counts["rows_received"] += len(fresh_lags)
            self._add_episodes(report.returns, report.lengths, report.named_stats)
            self._host_stats.update(report.host_stats)
            self._by_reason["rows_dropped"]["stale"] += stale
            self._by_reason["rows_dropped"]["future"] += future
            if len(fresh_lags):
                self._add_lags(int(fresh_lags.sum()), int(fresh_lags.max()), len(fresh_lags))

    def resume(self, *, env_steps: int, agent_steps: int, episodes: int, recent_returns: list[float]) -> None:
        """Continue counting from a checkpoint's totals."""
        with self._lock:
            self._counts.update(env_steps=env_steps, agent_steps=agent_steps, episodes=episodes)
            self._returns.extend(recent_returns)

    def merge(self, delta: IngestDelta) -> None:
        """Add a follower rank's delta (rank 0)."""
        with self._lock:
            for name in COUNTS:
                self._counts[name] += getattr(delta, name)
            for name in COUNTS_BY_REASON:
                self._by_reason[name].update(getattr(delta, name))
            self._add_episodes(delta.returns, delta.lengths, delta.named_stats)
            self._host_stats.update(delta.host_stats)
            self._add_lags(delta.lag_sum, delta.lag_max, delta.lag_rows)

    def totals(self) -> IngestTotals:
        """The counters as they are now, without starting the since-last-take figures again (safe from any thread;
        the metrics endpoint reads them at every scrape)."""
        with self._lock:
            return IngestTotals(**self._counts, **{name: dict(c) for name, c in self._by_reason.items()},
                                lag_sum=self._lag_sum, lag_max=self._lag_max, lag_rows=self._lag_rows,
                                host_stats=dict(self._host_stats))

    def take_snapshot(self) -> IngestSnapshot:
        """The counters as they are now; the since-last-take figures (policy lag, host timing) start again at zero,
        under the same lock. The update loop takes one per update."""
        with self._lock:
            counts = self._counts
            dropped, refused = self._by_reason["rows_dropped"], self._by_reason["messages_dropped"]
            snapshot = IngestSnapshot(
                env_steps=counts["env_steps"], agent_steps=counts["agent_steps"], episodes=counts["episodes"],
                env_restarts=counts["env_restarts"], recent_returns=tuple(self._returns),
                recent_lengths=tuple(self._lengths),
                episode_stat_means={name: float(np.mean(values)) if values else None
                                    for name, values in self._named.items()},
                rows_received=counts["rows_received"], rows_dropped_stale=dropped["stale"],
                rows_dropped_future=dropped["future"], messages_dropped=sum(refused.values()),
                messages_dropped_by_reason=dict(refused), policy_lag_mean=self._lag_sum / max(1, self._lag_rows),
                policy_lag_max=self._lag_max, host_timing=host_timing(self._host_stats))
            self._start_take()
        return snapshot

    def take_delta(self, *, rows_wait_s: float) -> IngestDelta:
        """What was counted since the previous ``take_delta`` (a follower rank, once per update); the since-last-take
        figures (policy lag, host timing) start again, and this rank no longer shows them itself."""
        with self._lock:
            counts, by_reason = dict(self._counts), {name: Counter(c) for name, c in self._by_reason.items()}
            before_counts, before_reasons = self._delivered
            delta = {name: counts[name] - before_counts[name] for name in COUNTS}
            new = min(delta["episodes"], RECENT)
            report = IngestDelta(
                rows_wait_s=rows_wait_s, **delta,
                **{name: dict(by_reason[name] - before_reasons[name]) for name in COUNTS_BY_REASON},
                returns=[float(v) for v in _newest(self._returns, new)],
                lengths=[int(v) for v in _newest(self._lengths, new)],
                named_stats={name: [float(v) for v in _newest(values, new)] for name, values in self._named.items()},
                host_stats={name: float(value) for name, value in self._host_stats.items()},
                lag_sum=self._lag_sum, lag_max=self._lag_max, lag_rows=self._lag_rows)
            self._delivered = (counts, by_reason)
            self._start_take()
        return report

    def _add_episodes(self, returns: list[float], lengths: list[int], named: dict[str, list[float]]) -> None:
        self._returns.extend(returns)
        self._lengths.extend(lengths)
        for name, values in named.items():
            self._named.setdefault(name, deque(maxlen=RECENT)).extend(values)

    def _add_lags(self, lag_sum: int, lag_max: int, lag_rows: int) -> None:
        self._lag_sum += lag_sum
        self._lag_max = max(self._lag_max, lag_max)
        self._lag_rows += lag_rows

    def _start_take(self) -> None:
        self._lag_sum = self._lag_max = self._lag_rows = 0
        self._host_stats.clear()


def host_timing(stats: dict[str, float]) -> dict[str, float | None]:
    """Inference and worker figures from summed ``host_stats``: batch size reached, ms per forward pass and
    per inference step, and the fraction of time env workers waited for actions (None where nothing came)."""
    batches = stats.get("inference_batches", 0.0)
    worker_s = stats.get("worker_wait_s", 0.0) + stats.get("worker_step_s", 0.0)
    return {
        "inference_batch_agents_mean": stats.get("inference_agents", 0.0) / batches if batches else None,
        "inference_ms_per_batch": 1000 * stats.get("inference_s", 0.0) / batches if batches else None,
        "act_ms_per_batch": 1000 * stats.get("act_s", 0.0) / batches if batches else None,
        "worker_wait_fraction": stats.get("worker_wait_s", 0.0) / worker_s if worker_s else None,
    }
