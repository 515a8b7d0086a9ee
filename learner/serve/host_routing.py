"""Which learner ranks' data sockets each actor host pushes its rows to (issue 15; rank 0's control server owns it).

Every rank fills its own share of the batch (segments / K rows), so each should receive rows at the same rate. The
routing balances *agents* per rank (a host's agent slots, ``learner.serve.host_sizing``):

- with at least as many hosts as ranks, each host pushes to one rank: a new host goes to the rank with the fewest
  agents; after a host leaves, hosts move from the most to the least loaded rank while a move narrows the gap;
- with fewer hosts than ranks, every host pushes to several ranks (host i to the ranks r with r % H == i) and its
  ZeroMQ PUSH socket deals its messages round-robin among them, so no rank is left without rows;
- a rank that keeps waiting for rows while another does not (``relieve``: a rank that "falls behind") gets one host
  moved to it from the rank that waited least, when that rank has a host to spare.

A host learns its ranks in REGISTERED and, after any change, in its next HEARTBEAT_ACK (``data_endpoints``). Thread
safe: the control thread adds and removes hosts, the update loop relieves ranks.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable


class HostRouting:
    """The hosts' ranks; ``endpoints[r]`` is what a host is told to connect to for rank r."""

    def __init__(self, endpoints: list[str]) -> None:
        if not endpoints:
            raise ValueError("HostRouting needs at least one rank endpoint")
        self.endpoints = list(endpoints)
        """Rank r's data endpoint as actor hosts are told it."""
        self._lock = threading.Lock()
        self._agents: dict[Hashable, int] = {}
        self._ranks: dict[Hashable, tuple[int, ...]] = {}
        self.moves = 0
        """Hosts moved to another rank after they joined (rebalancing), since the learner started."""

    @property
    def world_size(self) -> int:
        """Learner ranks K."""
        return len(self.endpoints)

    def add(self, host: Hashable, agents: int) -> tuple[int, ...]:
        """A host (re)registered with ``agents`` agent slots; returns its ranks."""
        with self._lock:
            self._agents[host] = agents
            self._ranks.pop(host, None)
            self._balance()
            return self._ranks[host]

    def remove(self, host: Hashable) -> None:
        """A host left or was forgotten; the others are rebalanced."""
        with self._lock:
            if self._agents.pop(host, None) is None:
                return
            self._ranks.pop(host, None)
            self._balance()

    def ranks_of(self, host: Hashable) -> tuple[int, ...]:
        """The ranks ``host`` pushes to (() for a host not routed)."""
        with self._lock:
            return self._ranks.get(host, ())

    def endpoints_of(self, host: Hashable) -> list[str]:
        """The data endpoints ``host`` is told to connect to."""
        return [self.endpoints[rank] for rank in self.ranks_of(host)]

    def loads(self) -> list[float]:
        """Agents per rank (a host pushing to several ranks counts its agents split evenly among them)."""
        with self._lock:
            return self._loads()

    def relieve(self, starved: int, donor: int) -> bool:
        """Move the smallest host of rank ``donor`` to rank ``starved`` when the donor keeps another host; returns
        whether one moved."""
        with self._lock:
            hosts = [host for host, ranks in self._ranks.items() if ranks == (donor,)]
            if len(hosts) < 2 or starved == donor:
                return False
            host = min(hosts, key=lambda name: self._agents[name])
            self._ranks[host] = (starved,)
            self.moves += 1
            return True

    def _loads(self) -> list[float]:
        loads = [0.0] * self.world_size
        for host, ranks in self._ranks.items():
            for rank in ranks:
                loads[rank] += self._agents[host] / len(ranks)
        return loads

    def _balance(self) -> None:
        hosts = list(self._agents)
        if len(hosts) < self.world_size:
            self._share_ranks(hosts)
            return
        for host, ranks in list(self._ranks.items()):
            if len(ranks) != 1:  # shared while there were fewer hosts than ranks: placed again below
                del self._ranks[host]
        loads = self._loads()
        for host in sorted((h for h in hosts if h not in self._ranks), key=lambda h: -self._agents[h]):
            rank = loads.index(min(loads))
            self._ranks[host] = (rank,)
            loads[rank] += self._agents[host]
        self._narrow_gaps(loads)

    def _share_ranks(self, hosts: list[Hashable]) -> None:
        """Fewer hosts than ranks: host i pushes to every rank r with r % H == i."""
        for index, host in enumerate(hosts):
            ranks = tuple(range(index, self.world_size, len(hosts)))
            if self._ranks.get(host) not in (None, ranks):
                self.moves += 1
            self._ranks[host] = ranks

    def _narrow_gaps(self, loads: list[float]) -> None:
        """Move hosts to the least loaded rank while one from any rank narrows that rank's gap to it (each move lowers
        the sum of squared loads, so this ends; no rank stays without a host while another has two)."""
        while True:
            low = loads.index(min(loads))
            best: tuple[float, Hashable, int] | None = None
            for host, ranks in self._ranks.items():
                if len(ranks) != 1 or ranks[0] == low:
                    continue
                gap = loads[ranks[0]] - loads[low]
                if self._agents[host] < gap and (best is None or abs(gap / 2 - self._agents[host]) < best[0]):
                    best = (abs(gap / 2 - self._agents[host]), host, ranks[0])
            if best is None:
                return
            _, host, rank = best
            self._ranks[host] = (low,)
            loads[rank] -= self._agents[host]
            loads[low] += self._agents[host]
            self.moves += 1
