"""Each learner rank's background thread to the others (issue 15): heartbeats, the registered actor hosts, batch fill.

Every TICK_S the thread counts one heartbeat on the board (learner/ranks/store.py). Rank 0's copies its control
server's registered hosts to the board whenever they change; a follower's copies them from the board into its own
``SenderRegistry`` (so its data socket accepts exactly the hosts rank 0 registered) and writes how full its batch is.
Rank 0's thread watches the followers' heartbeats, a follower's watches rank 0's: ``gone`` names the ranks whose
process ended (on this machine) or whose heartbeat stopped, which is how a dead or hung rank is named rather than
waited for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from learner.ranks.context import RankContext
from learner.ranks.sender_codec import decode_senders, encode_senders
from learner.serve.senders import SenderRegistry

LOG = logging.getLogger("sluice.learner.ranks")
TICK_S = 0.1
"""Seconds between heartbeats (and registry checks)."""
SILENT_S = 3.0
"""A rank whose heartbeat did not move for this long counts as gone (hung, or dead on another machine)."""


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` on this machine still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell (no /proc): heartbeats still tell


class RankLink(threading.Thread):
    """The rank's heartbeat, registry copy and (rank 0) watch over the other ranks."""

    def __init__(self, ranks: RankContext, registry: SenderRegistry, *, fill: Callable[[], float],
                 stop: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        """``fill``: the fraction of this rank's batch filled so far."""
        super().__init__(name="rank-link", daemon=True)
        self.ranks = ranks
        self.registry = registry
        self.fill = fill
        self.stop = stop
        self.clock = clock
        self._published = -1
        self._copied = 0
        self._lock = threading.Lock()
        self._beats: dict[int, tuple[int, float]] = {}
        self.error: BaseException | None = None
        """What ended the thread early (the store went away), None while it runs."""

    def run(self) -> None:
        board, rank = self.ranks.board, self.ranks.rank
        try:
            while not self.stop.wait(TICK_S):
                board.beat(rank)
                if self.ranks.is_leader:
                    self._publish_senders()
                else:
                    self._copy_senders()
                    board.set_text("fill", rank, f"{self.fill():.3f}")
                self._watch_beats()
        except Exception as err:  # the store (torchrun's agent) is gone: the run is ending
            self.error = err
            LOG.debug("rank link stopped: %s", err)

    def _publish_senders(self) -> None:
        changes, senders = self.registry.snapshot()
        if changes != self._published:
            self.ranks.board.publish_senders(encode_senders(senders))
            self._published = changes

    def _copy_senders(self) -> None:
        version = self.ranks.board.senders_version()
        if version == self._copied:
            return
        payload = self.ranks.board.senders()
        if payload is not None:
            self.registry.replace_all(decode_senders(payload))
        self._copied = version

    def watched(self) -> range:
        """The ranks this one watches: every follower from rank 0, rank 0 from a follower."""
        return range(1, self.ranks.world_size) if self.ranks.is_leader else range(0, 1)

    def _watch_beats(self) -> None:
        now = self.clock()
        for rank in self.watched():
            count = self.ranks.board.beats(rank)
            with self._lock:
                previous = self._beats.get(rank)
                if previous is None or previous[0] != count:
                    self._beats[rank] = (count, now)

    def fills(self) -> dict[int, float]:
        """Rank 0: how full each follower's batch was at its last report (missing before the first)."""
        fills = {}
        for rank in range(1, self.ranks.world_size):
            text = self.ranks.board.text("fill", rank)
            if text is not None:
                fills[rank] = float(text)
        return fills

    def gone(self) -> list[str]:
        """A line for each watched rank whose process ended (same machine) or whose heartbeat stopped for SILENT_S;
        [] when all answer."""
        lines, now = [], self.clock()
        for rank in self.watched():
            process = self.ranks.process_of(rank)
            if process is not None and process[0] == self.ranks.host_name and not process_alive(process[1]):
                lines.append(f"learner rank {rank} (pid {process[1]}) has ended")
                continue
            with self._lock:
                beat = self._beats.get(rank)
            if beat is not None and now - beat[1] > SILENT_S:
                lines.append(f"learner rank {rank} ({process[0] if process else '?'}) has sent no heartbeat for "
                             f"{now - beat[1]:.1f} s")
        return lines

