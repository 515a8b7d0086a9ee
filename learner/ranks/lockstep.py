"""How the learner ranks agree that an update runs (issue 15): every rank must enter an update's collectives, or none.

Per update N:

- a follower (rank >= 1) fills its batch, then marks itself ready on the board with an ``IngestDelta`` of what its
  ingest counted (learner/serve/ingest_counters.py) and waits for rank 0's decision for N;
- rank 0 fills its own batch, waits until every follower is ready, merges their reports into its counters and
  decides ``update``; every rank then runs update N (the collectives inside it find all ranks there);
- when the run stops (a stop rule, a signal, a follower's stop request, a rank that is gone), rank 0 decides
  ``stop: <reason>`` for the next update instead, and every rank leaves its loop at the same point.

Only rank 0 decides, so no two ranks can disagree. All waiting is polling of the board with short sleeps, never a
blocking collective: signals, stop requests and gone ranks are noticed while waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from learner.serve.host_routing import HostRouting
from learner.serve.ingest_counters import IngestCounters, IngestDelta
from learner.ranks.link import RankLink
from learner.serve.senders import SenderRegistry
from learner.ranks.store import STOP_PREFIX, UPDATE
from learner.ranks.context import RankContext

LOG = logging.getLogger("sluice.learner.ranks")
POLL_S = 0.002
"""Sleep between two looks at the board while waiting for the other ranks."""
CHECK_EVERY_S = 0.2
"""How often a waiting rank looks for stop requests and gone ranks."""
BEHIND_UPDATES = 3
"""Updates in a row one rank must wait longest for rows (while another barely waits) before a host is moved to it."""
BEHIND_MIN_S = 0.05
"""A rank counts as falling behind only when it waited this much longer for rows than the rank that waited least,
and at least twice as long."""

WAITING_NOTICE_S = 10.0
"""While rank 0 waits for the other ranks' rows, a console line every this many seconds says which."""
RANK_GONE_WAIT_S = 4.0
"""After a failed collective, how long rank 0 looks for the rank that is gone before stopping with the error."""
StopRequest = Callable[..., None]
"""``Learner.request_stop(reason, exit_code=...)``."""


@dataclass(frozen=True, kw_only=True)
class RankWaits:
    """Seconds each rank waited for its rows before update N (rank 0's included), and rank 0's wait for the others."""

    rows_wait_s: dict[int, float]
    """Rank -> seconds it waited for its batch's rows."""
    followers_wait_s: float
    """Seconds rank 0 waited, batch in hand, for the slowest follower."""


class LeaderLockstep:
    """Rank 0's side: wait for the followers, merge their reports, decide."""

    @classmethod
    def start(cls, ranks: RankContext, *, counters: IngestCounters, registry: SenderRegistry, routing: HostRouting,
              fill: Callable[[], float], stop: threading.Event, announce: Callable[[str], None],
              observe_fills: Callable[[dict[int, float]], None]) -> LeaderLockstep:
        """Rank 0's lockstep with its link to the other ranks (heartbeats, the registered hosts) started; ``fill``:
        rank 0's own batch fill; ``stop``: ends the link's thread."""
        link = RankLink(ranks, registry, fill=fill, stop=stop)
        link.start()
        return cls(ranks, link, counters=counters, routing=routing, announce=announce, observe_fills=observe_fills)

    def __init__(self, ranks: RankContext, link: RankLink, *, counters: IngestCounters, routing: HostRouting,
                 announce: Callable[[str], None], observe_fills: Callable[[dict[int, float]], None]) -> None:
        """``announce``: the console's event lines; ``observe_fills``: the followers' batch fill while rank 0 waits
        (Prometheus)."""
        self.ranks = ranks
        self.observe_fills = observe_fills
        self.link = link
        self.counters = counters
        self.routing = routing
        self.announce = announce
        self.last_check = 0.0
        self.behind: tuple[int, int] = (-1, 0)
        """The rank that waited longest for rows lately and for how many updates in a row."""

    def check_followers(self, request_stop: StopRequest) -> None:
        """Stop the run (through ``request_stop``) when a follower asked to, or one is gone (at most every
        CHECK_EVERY_S)."""
        now = time.monotonic()
        if now - self.last_check < CHECK_EVERY_S:
            return
        self.last_check = now
        gone = self.link.gone()
        if gone:
            request_stop("; ".join(gone), exit_code=1)
            return
        for rank in range(1, self.ranks.world_size):
            reason = self.ranks.board.stop_request(rank)
            if reason is not None:
                request_stop(f"learner rank {rank}: {reason}")
                return

    def wait_for_followers(self, update: int, *, stop: threading.Event, request_stop: StopRequest,
                           own_wait_s: float) -> RankWaits | None:
        """Once rank 0 has its batch for ``update``: wait until every follower is ready, merge their reports and
        return the ranks' waits; None when the run is to stop first."""
        started = time.monotonic()
        next_notice = started + WAITING_NOTICE_S
        followers = self.ranks.world_size - 1
        while self.ranks.board.ready_count(update) < followers:
            self.check_followers(request_stop)
            if stop.is_set():
                return None
            if time.monotonic() >= next_notice:
                self._waiting_notice(time.monotonic() - started)
                next_notice += WAITING_NOTICE_S
            time.sleep(POLL_S)
        waits = {0: own_wait_s}
        for rank in range(1, self.ranks.world_size):
            report = IngestDelta.decode(self.ranks.board.take_report(update, rank=rank))
            self.counters.merge(report)
            waits[rank] = report.rows_wait_s
        result = RankWaits(rows_wait_s=waits, followers_wait_s=time.monotonic() - started)
        self._relieve_behind(waits)
        return result

    def _waiting_notice(self, waited_s: float) -> None:
        """Rank 0 has waited long for the others: say which ranks lack rows and how full their batches are."""
        fills = self.link.fills()
        self.observe_fills(fills)
        lacking = ", ".join(f"rank {rank} {fill:.0%} full" for rank, fill in sorted(fills.items()) if fill < 1)
        self.announce(f"learner: waited {waited_s:.0f} s for the other ranks' rows ({lacking or 'no fill reported'}; "
                      "are actor hosts running and routed to them?)")

    def go(self, update: int) -> None:
        """Every rank runs ``update``."""
        self.ranks.board.decide(update, UPDATE)

    def next_update(self, update: int, *, stop: threading.Event, request_stop: StopRequest,
                    own_wait_s: float) -> RankWaits | None:
        """Once rank 0 has its batch: wait until every rank has its own, then tell them all to run ``update``;
        None when the run is to stop first (no rank runs it)."""
        waits = self.wait_for_followers(update, stop=stop, request_stop=request_stop, own_wait_s=own_wait_s)
        if waits is not None:
            self.go(update)
        return waits

    def failure_reason(self, error: Exception) -> str:
        """A collective failed mid-update: the line naming the rank that is gone, when it can be told within
        RANK_GONE_WAIT_S, else the error itself."""
        deadline = time.monotonic() + RANK_GONE_WAIT_S
        gone = self.link.gone()
        while not gone and time.monotonic() < deadline:
            time.sleep(0.1)
            gone = self.link.gone()
        return "; ".join(gone) if gone else str(error)

    def end(self, update: int, reason: str) -> None:
        """No rank runs ``update``: the run stops."""
        self.ranks.board.decide(update, STOP_PREFIX + reason)

    def _relieve_behind(self, waits: dict[int, float]) -> None:
        """A rank that waited longest for rows BEHIND_UPDATES updates in a row, clearly longer than the rank that
        waited least, gets one host moved to it from that rank (when it has one to spare)."""
        slowest = max(waits, key=waits.__getitem__)
        fastest = min(waits, key=waits.__getitem__)
        gap = waits[slowest] - waits[fastest]
        if gap < BEHIND_MIN_S or waits[slowest] < 2 * waits[fastest]:
            self.behind = (-1, 0)
            return
        rank, count = self.behind
        self.behind = (slowest, count + 1 if rank == slowest else 1)
        if self.behind[1] >= BEHIND_UPDATES and self.routing.relieve(slowest, fastest):
            self.announce(f"learner rank {slowest} keeps waiting for rows ({waits[slowest]:.2f} s against "
                          f"{waits[fastest]:.2f} s on rank {fastest}): one actor host moved to it")
            self.behind = (-1, 0)


class FollowerLockstep:
    """A follower's side: mark ready with a report, wait for rank 0's decision."""

    def __init__(self, ranks: RankContext, link: RankLink) -> None:
        self.ranks = ranks
        self.link = link
        self.stop_asked = False

    def ask_stop(self, reason: str) -> None:
        """Ask rank 0 to stop the run (once)."""
        if not self.stop_asked:
            self.ranks.board.request_stop(reason, rank=self.ranks.rank)
            self.stop_asked = True

    def stop_decided(self, update: int) -> str | None:
        """Rank 0's stop reason for ``update`` when it decided to stop; None otherwise (no decision yet, or
        ``update``)."""
        decision = self.ranks.board.decision(update)
        if decision is not None and decision.startswith(STOP_PREFIX):
            return decision.removeprefix(STOP_PREFIX)
        return None

    def ready(self, update: int, report: IngestDelta) -> None:
        """This rank has its batch for ``update``."""
        self.ranks.board.mark_ready(update, report.encode(), rank=self.ranks.rank)

    def wait_decision(self, update: int, *, local_stop: Callable[[], str | None]) -> str:
        """Rank 0's decision for ``update`` (``UPDATE`` or ``STOP_PREFIX + reason``); a local stop (a signal) is
        passed on to rank 0, which decides; a rank 0 that is gone ends the wait with a stop."""
        last_check = time.monotonic()
        while (decision := self.ranks.board.decision(update)) is None:
            reason = local_stop()
            if reason is not None:
                self.ask_stop(reason)
            if time.monotonic() - last_check > CHECK_EVERY_S:
                last_check = time.monotonic()
                gone = self.link.gone()
                if gone:
                    return STOP_PREFIX + "; ".join(gone)
            time.sleep(POLL_S)
        return decision


def rank_wait_metrics(waits: RankWaits) -> dict[str, float]:
    """Several ranks: the waits as metrics.jsonl keys (``rank<r>_rows_wait_s``, ``ranks_wait_s``); {} with one."""
    if len(waits.rows_wait_s) == 1:
        return {}
    metrics = {f"rank{rank}_rows_wait_s": seconds for rank, seconds in sorted(waits.rows_wait_s.items())}
    metrics["ranks_wait_s"] = waits.followers_wait_s
    return metrics
