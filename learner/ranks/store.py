"""The learner ranks' shared notice board: torch.distributed's key-value store (under torchrun, its agent's store).

The ranks' lockstep (which update runs, or that the run stops), the registered actor hosts (so every rank's data
socket checks the same tokens), each rank's counters for rank 0's metrics, heartbeats and the data endpoints all go
through it; tensors go through the process group's collectives (learner/ranks/distributed.py). Store operations are
short and polled with timeouts, so a rank waiting here still sees signals and stop requests: nothing blocks in a
collective until every rank is known to be ready for it.

Keys live under ``sluice/<attempt>/`` (torchrun's restart count), so a restarted group never reads an older one's.
Values are bytes or text; nothing is pickled.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch.distributed as dist

STORE_TIMEOUT = datetime.timedelta(seconds=60)
"""How long one store operation may wait for the store's server (not for a key: keys are polled)."""
UPDATE = "update"
"""Rank 0's decision that update N runs on every rank."""
STOP_PREFIX = "stop:"
"""Rank 0's decision that the run stops before update N, followed by the reason."""


def open_store(*, rank: int, timeout: datetime.timedelta = STORE_TIMEOUT) -> dist.Store:
    """The store torchrun describes (MASTER_ADDR, MASTER_PORT): a client of torchrun's agent store when it offers
    one (TORCHELASTIC_USE_AGENT_STORE), else hosted by rank 0."""
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=rank == 0 and not agent_store, timeout=timeout)


@dataclass(frozen=True, kw_only=True)
class RankStore:
    """Typed access to the ranks' keys in a c10d ``Store``."""

    store: dist.Store
    """The underlying store (dist.TCPStore under torchrun; dist.HashStore in tests)."""
    prefix: str = "sluice/0/"
    """Every key's prefix."""

    def _key(self, *parts: object) -> str:
        return self.prefix + "/".join(str(part) for part in parts)

    def _read(self, key: str) -> bytes | None:
        """The value under ``key``, None when it is not set (never blocks on a missing key)."""
        if not self.store.check([key]):
            return None
        return self.store.get(key)

    # Lockstep: followers mark themselves ready for an update; rank 0 decides whether it runs.
    def mark_ready(self, update: int, report: bytes, *, rank: int) -> None:
        """Rank ``rank`` has its batch for ``update``; ``report`` is what its ingest counted since its last one."""
        self.store.set(self._key("report", update, rank), report)
        self.store.add(self._key("ready", update), 1)

    def ready_count(self, update: int) -> int:
        """How many follower ranks are ready for ``update``."""
        return self.store.add(self._key("ready", update), 0)

    def take_report(self, update: int, *, rank: int) -> bytes:
        """Rank ``rank``'s report for ``update`` (set before it counted as ready), removed from the store."""
        key = self._key("report", update, rank)
        value = self.store.get(key)
        self.store.delete_key(key)
        return value

    def decide(self, update: int, decision: str) -> None:
        """Rank 0: ``UPDATE`` or ``STOP_PREFIX + reason`` for ``update``; set once per update."""
        self.store.set(self._key("decision", update), decision)

    def decision(self, update: int) -> str | None:
        """Rank 0's decision for ``update``, None while there is none."""
        value = self._read(self._key("decision", update))
        return None if value is None else value.decode()

    # A follower that must stop (a signal, a failed ingest) asks rank 0, which decides for everyone.
    def request_stop(self, reason: str, *, rank: int) -> None:
        """Rank ``rank`` asks the run to stop, saying why."""
        self.store.set(self._key("stop_request", rank), reason)

    def stop_request(self, rank: int) -> str | None:
        """Why rank ``rank`` asked to stop, None when it did not."""
        value = self._read(self._key("stop_request", rank))
        return None if value is None else value.decode()

    # Liveness and where each rank listens.
    def beat(self, rank: int) -> int:
        """One heartbeat of ``rank``; returns its count."""
        return self.store.add(self._key("beat", rank), 1)

    def beats(self, rank: int) -> int:
        """Heartbeats of ``rank`` so far."""
        return self.store.add(self._key("beat", rank), 0)

    def set_text(self, name: str, rank: int, text: str) -> None:
        """A per-rank fact (its process, its data endpoint, its batch fill) under ``name``."""
        self.store.set(self._key(name, rank), text)

    def text(self, name: str, rank: int) -> str | None:
        """The per-rank fact ``name`` of ``rank``, None while unset."""
        value = self._read(self._key(name, rank))
        return None if value is None else value.decode()

    def wait_text(self, name: str, rank: int, timeout: datetime.timedelta) -> str:
        """The per-rank fact ``name`` of ``rank``, waiting up to ``timeout`` for it (RuntimeError past it)."""
        key = self._key(name, rank)
        self.store.wait([key], timeout)
        return self.store.get(key).decode()

    # The registered actor hosts, as rank 0's control server has them.
    def publish_senders(self, payload: bytes) -> int:
        """Rank 0: the registered hosts now; returns the new version."""
        self.store.set(self._key("senders"), payload)
        return self.store.add(self._key("senders_version"), 1)

    def senders_version(self) -> int:
        """How many times rank 0 published the hosts (0: never)."""
        return self.store.add(self._key("senders_version"), 0)

    def senders(self) -> bytes | None:
        """The hosts rank 0 published last, None before the first."""
        return self._read(self._key("senders"))
