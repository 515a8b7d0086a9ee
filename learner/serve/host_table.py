"""The registered actor hosts and the rules over them, without a socket: who is registered under which identity,
session, token, CURVE key and size; what a REGISTER repeated, a HEARTBEAT, a BYE and silence do to that; the counts
and the Prometheus targets read from it.

``ControlServer`` (learner/serve/control.py) owns one table, feeds it what arrives on its socket with the time it
arrived (``now``, monotonic seconds: a test drives the table with any clock) and turns the answers (frozen
dataclasses, enums) into replies, sender registry and routing changes, and log lines. Only the control thread
changes the table; every method takes the table's own lock, so the metrics HTTP thread and the training loop may
read its counts, heartbeats and targets at any time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from learner.serve.senders import new_token

MAX_HOSTS = 4096
"""Actor hosts registered at once, at most; beyond, a new registration is refused (too_many_hosts)."""
OWN_PAUSE_S = 2.0
"""A gap this long between two turns of the control loop (normally 100 ms apart) is this process being paused."""


@dataclass(frozen=True, kw_only=True)
class RegisteredHost:
    """One registration of an actor host (the process itself: actors/host.py), as the table holds it."""

    identity: bytes
    """The ZeroMQ identity of the host's control socket (the table's key)."""
    name: str
    """Host name it reported (already cleaned for printing by the caller)."""
    num_workers: int
    """Env worker processes it runs."""
    token: str
    """The token its registration was handed (the key of its Sender in the registry)."""
    metrics_address: str | None = None
    """Where Prometheus scrapes it (host:port; None: it reported none, or one Prometheus cannot reach)."""
    session: str | None = None
    """The session name its REGISTER carried (a repeat REGISTER of the same session gets the same token)."""
    curve_key: str | None = None
    """The z85 CURVE key its registration arrived under (None without CURVE)."""

    def repeats(self, *, session: Any, curve_key: str | None, num_workers: int) -> bool:
        """Whether a REGISTER with these values is this registration asked for again (queued during a pause or a
        partition, or resent while its answer was on the way): same session, key and size."""
        return (self.session is not None and session == self.session and curve_key == self.curve_key
                and num_workers == self.num_workers)


class Joined(Enum):
    """What a registration that was not a repeat did to the table."""

    NEW = "new"
    """An identity not registered before: a new host."""
    AGAIN = "again"
    """A registered identity registered anew: a new token, the old registration's token no longer counts."""
    FULL = "full"
    """Refused: max_hosts hosts are registered and this identity is not one of them."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """The table's answer to a registration (``HostTable.register``)."""

    joined: Joined
    """New host, the same identity again, or refused for lack of room."""
    host: RegisteredHost | None
    """The registration now held (None when FULL)."""
    replaced: RegisteredHost | None
    """The identity's previous registration, whose token is to be dropped (None unless AGAIN)."""
    registered: int
    """Hosts registered once this was decided (when FULL: the count that refused it)."""


class Heartbeat(Enum):
    """The table's answer to a HEARTBEAT (``HostTable.heartbeat``)."""

    ACK = "ack"
    """A registered identity, with its registration's token or none."""
    NOT_REGISTERED = "not_registered"
    """The identity is not registered (never, or forgotten): it must register."""
    STALE_TOKEN = "stale_token"
    """Registered, but the token is not its current registration's (registered again, or forgotten): re-register."""


@dataclass(frozen=True, kw_only=True)
class HostCounts:
    """The hosts registered now and what the table counted since it was made."""

    actor_hosts: int
    """Actor hosts registered and alive now."""
    lost: int
    """Hosts forgotten after peer_timeout_s of silence."""
    failed: int
    """Hosts that left with a BYE naming a failure."""
    registrations: int
    """Registrations accepted (an identity that registers anew counts again; a repeat does not)."""


@dataclass(slots=True)
class _Entry:
    """A registration and when its identity was last heard from (the one thing of a host that changes)."""

    host: RegisteredHost
    """The registration."""
    last_seen: float
    """Monotonic time of its last message (moved on by the learner's own pauses)."""


class HostTable:
    """The registered actor hosts, by identity. Thread-safe: each method holds the table's lock; none blocks."""

    def __init__(self, *, peer_timeout_s: float, max_hosts: int = MAX_HOSTS, own_pause_s: float = OWN_PAUSE_S,
                 tokens: Callable[[], str] = new_token) -> None:
        """``peer_timeout_s``: silence after which a host is forgotten; ``max_hosts``: hosts registered at once, at
        most; ``own_pause_s``: the gap between two turns of the caller's loop excused as its own pause;
        ``tokens``: makes each new registration's token."""
        self.peer_timeout_s = peer_timeout_s
        self.max_hosts = max_hosts
        self.own_pause_s = own_pause_s
        self.tokens = tokens
        self._lock = threading.Lock()
        self._entries: dict[bytes, _Entry] = {}
        self._lost = 0
        self._failed = 0
        self._registrations = 0

    def seen(self, identity: bytes, now: float) -> RegisteredHost | None:
        """A message from ``identity`` arrived at ``now``: a registered host is alive until now + peer_timeout_s.
        Returns its registration (None: not registered)."""
        with self._lock:
            entry = self._entries.get(identity)
            if entry is None:
                return None
            entry.last_seen = now
            return entry.host

    def get(self, identity: bytes) -> RegisteredHost | None:
        """The registration ``identity`` holds now, if any (nothing is marked seen)."""
        with self._lock:
            entry = self._entries.get(identity)
            return None if entry is None else entry.host

    def repeat_of(self, identity: bytes, *, session: Any, curve_key: str | None,
                  num_workers: int) -> RegisteredHost | None:
        """The registration a REGISTER from ``identity`` with these values asks for again (its answer carries the
        same token); None when it is a registration of its own (``register``)."""
        host = self.get(identity)
        if host is not None and host.repeats(session=session, curve_key=curve_key, num_workers=num_workers):
            return host
        return None

    def register(self, identity: bytes, *, name: str, num_workers: int, now: float, session: str | None = None,
                 curve_key: str | None = None, metrics_address: str | None = None) -> Registration:
        """Record a registration of ``identity`` with a new token (replacing the identity's previous one), unless
        max_hosts hosts are registered and ``identity`` is not among them. A repeat is the caller's to spot first
        (``repeat_of``): this always hands out a new token."""
        with self._lock:
            previous = self._entries.get(identity)
            if previous is None and len(self._entries) >= self.max_hosts:
                return Registration(joined=Joined.FULL, host=None, replaced=None, registered=len(self._entries))
            host = RegisteredHost(identity=identity, name=name, num_workers=num_workers, token=self.tokens(),
                                  metrics_address=metrics_address, session=session, curve_key=curve_key)
            self._entries[identity] = _Entry(host=host, last_seen=now)
            self._registrations += 1
            return Registration(joined=Joined.NEW if previous is None else Joined.AGAIN, host=host,
                                replaced=None if previous is None else previous.host, registered=len(self._entries))

    def heartbeat(self, identity: bytes, token: Any = None) -> Heartbeat:
        """Whether a HEARTBEAT from ``identity`` carrying ``token`` (None: it sent none) is answered (``seen``
        marks it alive; this only judges it)."""
        host = self.get(identity)
        if host is None:
            return Heartbeat.NOT_REGISTERED
        if token is not None and token != host.token:
            return Heartbeat.STALE_TOKEN
        return Heartbeat.ACK

    def leave(self, identity: bytes, *, failed: bool) -> RegisteredHost | None:
        """``identity`` said BYE (``failed``: naming a failure, counted): its registration is removed and returned
        (None: it was not registered, and nothing is counted)."""
        with self._lock:
            entry = self._entries.pop(identity, None)
            if entry is None:
                return None
            if failed:
                self._failed += 1
            return entry.host

    def excuse_pause(self, paused_s: float) -> bool:
        """The caller's loop turned ``paused_s`` after its last turn. From own_pause_s on, that is this process
        frozen (SIGSTOP, VM migration, swapping, a long collection), not its hosts silent: the pause is added to
        every host's allowance. Returns whether it was excused."""
        if paused_s < self.own_pause_s:
            return False
        with self._lock:
            for entry in self._entries.values():
                entry.last_seen += paused_s
        return True

    def expire(self, now: float) -> tuple[RegisteredHost, ...]:
        """Forget the hosts not heard from for more than peer_timeout_s before ``now`` (counted as lost)."""
        deadline = now - self.peer_timeout_s
        with self._lock:
            gone = self._pop(lambda entry: entry.last_seen < deadline)
            self._lost += len(gone)
        return gone

    def drop_keys(self, curve_keys: set[str]) -> tuple[RegisteredHost, ...]:
        """Forget the hosts registered under any of ``curve_keys`` (removed from the allow-list; not counted)."""
        if not curve_keys:
            return ()
        with self._lock:
            return self._pop(lambda entry: entry.host.curve_key in curve_keys)

    def counts(self) -> HostCounts:
        """The hosts registered now and the counts since the table was made."""
        with self._lock:
            return HostCounts(actor_hosts=len(self._entries), lost=self._lost, failed=self._failed,
                              registrations=self._registrations)

    def silences(self, now: float) -> dict[str, float]:
        """Each registered host's name and the seconds since it was last heard from, as of ``now``."""
        with self._lock:
            return {entry.host.name: now - entry.last_seen for entry in self._entries.values()}

    def metrics_targets(self) -> list[dict[str, Any]]:
        """The registered hosts' metrics addresses in Prometheus' HTTP service discovery format: one target group
        per host, labelled with its name, sorted by name."""
        with self._lock:
            hosts = sorted((entry.host.name, entry.host.metrics_address) for entry in self._entries.values()
                           if entry.host.metrics_address is not None)
        return [{"targets": [address], "labels": {"host": name}} for name, address in hosts]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _pop(self, which: Callable[[_Entry], bool]) -> tuple[RegisteredHost, ...]:
        """Remove the entries ``which`` picks and return their hosts (the lock held by the caller)."""
        picked = [identity for identity, entry in self._entries.items() if which(entry)]
        return tuple(self._entries.pop(identity).host for identity in picked)
