"""The learner's stall detector: actor hosts are registered, yet no update has come for far longer than usual.

A run can stop making progress without anything failing: every ROWS message refused (a token the learner no
longer holds, an env that writes NaN), rows too old to use, hosts that are registered but send nothing (a paused
host, a hung env, a blocked data port). ``StallWatch`` tells such a stall from a slow run by the usual time between
updates (the median of the recent ones): no update for ``run.stall_factor`` times that, and at least
``run.stall_min_s``, while hosts are registered, is a stall. It is said in ONE line that names the likely cause,
from what the ingest counted since the last update (``IngestTotals``), and once more when updates resume; the
``sluice_learner_stalled`` gauge and the ``SluiceLearnerStalled`` alert carry it to Prometheus.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from learner.serve.ingest_counters import IngestTotals

RECENT_INTERVALS = 20
"""Intervals between updates the usual one is the median of."""
FIRST_UPDATE_FACTOR = 5.0
"""Before the first update there is no usual interval: the stall bound is this many times run.stall_min_s, from
the moment hosts first registered (the first batch also waits for compilation and for hosts to start)."""
REASON_HINTS = {
    "not_registered": "rows from a registration the learner no longer holds; such hosts register again at their "
                      "next heartbeat",
    "non_finite": "an env or policy emits NaN or inf",
    "identity_mismatch": "rows arrive under another CURVE key than their registration's",
    "bad_shared": "a host's rows in shared memory cannot be read (set network.shared_memory_rows=false to send them "
                  "in the messages)",
}
"""What a refusal reason usually means, for the stall line."""
QUIET_SHARE = 0.5
"""Rows last received this share of the wait ago, or longer, is rows that stopped coming, not a slow trickle."""


@dataclass(frozen=True, kw_only=True)
class StallRule:
    """When no update is a stall (from the run section of the config)."""

    factor: float
    """No update for this many times the usual interval between updates (the recent median) is a stall."""
    min_s: float
    """Never a stall before this many seconds without an update."""


def describe_cause(before: IngestTotals, now: IngestTotals, *, hosts: int, filling: float, waited_s: float,
                   quiet_s: float = 0.0) -> str:
    """Why no batch filled, from what the ingest counted between ``before`` (the last update) and ``now``, and
    ``quiet_s``, the seconds since the last byte arrived (rows that stopped coming early in the wait, such as the
    last rows a host had queued when its envs stopped, are not a slow trickle)."""
    refused = {reason: now.messages_dropped.get(reason, 0) - before.messages_dropped.get(reason, 0)
               for reason in now.messages_dropped}
    refused = {reason: count for reason, count in refused.items() if count > 0}
    accepted = now.rows_received - before.rows_received
    stale = now.rows_dropped.get("stale", 0) - before.rows_dropped.get("stale", 0)
    no_rows = (f"no rows arrived from the {hosts} registered actor host{'s' if hosts != 1 else ''} "
               f"(hosts paused or stuck, envs hanging, or the data port unreachable)")
    if now.bytes_received == before.bytes_received:
        return no_rows
    if quiet_s >= QUIET_SHARE * waited_s:
        return f"{no_rows}; the last came {quiet_s:.1f} s ago, {accepted} rows accepted before"
    if refused and accepted == 0:
        ranked = sorted(refused.items(), key=lambda item: -item[1])
        worst = ranked[0][0]
        listed = ", ".join(f"{reason} {count}" for reason, count in ranked[:3])
        hint = REASON_HINTS.get(worst)
        return f"every ROWS message was refused ({listed}){f': {hint}' if hint else ''}"
    if stale > accepted:
        return f"rows arrive too old to train on ({stale} dropped as stale, {accepted} accepted; see max_policy_lag)"
    return f"rows arrive slowly: the batch is {filling:.0%} full after {waited_s:.0f} s ({accepted} rows accepted)"


class StallWatch:
    """Fed by the update loop: ``waiting`` while it waits for a batch, ``updated`` after each update. It reads the
    ingest's totals and the registered hosts' count itself, says its lines through ``say`` and sets the gauges
    through ``gauges(stalled=..., seconds_since_update=...)``."""

    def __init__(self, rule: StallRule, *, totals: Callable[[], IngestTotals], hosts: Callable[[], int],
                 filling: Callable[[], float], say: Callable[[str], None], gauges: Callable[..., None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule
        self.totals, self.hosts, self.filling, self.say, self.gauges, self.clock = (totals, hosts, filling, say,
                                                                                    gauges, clock)
        self.intervals: deque[float] = deque(maxlen=RECENT_INTERVALS)
        self.last_update = clock()
        """Monotonic time of the last update (the start, before the first)."""
        self.updates = 0
        self.hosts_since: float | None = None
        """Monotonic time hosts were first seen registered, before the first update (None: none yet)."""
        self.totals_at_update = totals()
        self.stall_began: float | None = None
        self.cause = ""
        self.bytes_seen = self.totals_at_update.bytes_received
        """The ingest's byte count at the last look."""
        self.bytes_changed_at = self.last_update
        """Monotonic time the byte count was last seen to change."""

    def bound_s(self) -> float:
        """Seconds without an update that make a stall now."""
        if not self.intervals:
            return FIRST_UPDATE_FACTOR * self.rule.min_s
        return max(self.rule.min_s, self.rule.factor * statistics.median(self.intervals))

    def updated(self) -> None:
        """An update finished: says that updates resumed when a stall was reported."""
        now = self.clock()
        if self.updates > 0:
            self.intervals.append(now - self.last_update)
        if self.stall_began is not None:
            self.say(f"learner: updates resumed after {now - self.last_update:.0f} s without one (stalled: "
                     f"{self.cause})")
        self.updates += 1
        self.last_update = now
        self.totals_at_update = self.totals()
        self.stall_began = None
        self.gauges(stalled=False, seconds_since_update=0.0)

    def waiting(self) -> None:
        """While waiting for a batch: says the one line when a stall begins (nothing while it lasts)."""
        now = self.clock()
        hosts = self.hosts()
        self.gauges(stalled=self.stall_began is not None, seconds_since_update=now - self.last_update)
        totals = self.totals()
        if totals.bytes_received != self.bytes_seen:
            self.bytes_seen, self.bytes_changed_at = totals.bytes_received, now
        if hosts == 0:
            self.hosts_since = None
            return
        if self.hosts_since is None:
            self.hosts_since = now
        waited_s = now - (self.last_update if self.updates else self.hosts_since)
        if self.stall_began is not None or waited_s < self.bound_s():
            return
        self.stall_began = now
        self.cause = describe_cause(self.totals_at_update, totals, hosts=hosts, filling=self.filling(),
                                    waited_s=waited_s, quiet_s=now - max(self.bytes_changed_at, self.last_update))
        usual = f"usually every {statistics.median(self.intervals):.1f} s" if self.intervals else "none yet"
        self.say(f"learner: stalled: no update for {waited_s:.0f} s ({usual}) with {hosts} actor "
                 f"host{'s' if hosts != 1 else ''} registered: {self.cause}")
        self.gauges(stalled=True, seconds_since_update=now - self.last_update)
