"""The learner's control socket: registration, heartbeats, weights on request, errors, shutdown.

A ROUTER socket served by its own thread, so actor hosts get answers while the trainer is busy.
Every request is validated; a bad one gets an ERROR reply naming the problem and is counted.

Registration hands the host a token and adds it to the ``SenderRegistry`` the ingest checks rows against;
BYE, silence for peer_timeout_s and registering again take the token away. Only a registered identity may
ask for anything but REGISTER (pool requests aside); the requests answered with the weights (REGISTER,
GET_WEIGHTS) are rate-limited per identity, and at most ``max_hosts`` hosts are registered at once.

A host's HEARTBEAT after it said BYE or was forgotten for its silence (a message already on its way, or a host
that stalled) is answered ``not_registered`` and counted under that reason like any refusal, but logged as the
normal event it is (INFO, rate-limited); a message from an identity that never registered stays a refusal
(a WARNING naming it as ``peer <hex>``, not its raw bytes).

Who is registered, and the rules over that (repeats, tokens, silence, the learner's own pauses, counts), live in
a socket-free ``HostTable`` (learner/serve/host_table.py); this module decodes, rate-limits, answers and logs.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from learner.serve.host_routing import HostRouting
from learner.serve.host_sizing import HostSize, HostSizing
from learner.serve.host_table import MAX_HOSTS, Heartbeat, HostTable, Joined, RegisteredHost
from learner.pool.server import POOL_REQUESTS, PoolService
from learner.serve.request_rate import PeerRateLimiter, RateLimit, TokenBucket
from learner.serve.senders import Sender, SenderRegistry
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode
from protocol.curve import ServerCurve, ZapGuard
from protocol.reject_log import DETAIL_CHARS, RejectLog, peer_text
from telemetry.exporter import WILDCARD_HOSTS, is_loopback, url_host

LOG = logging.getLogger("sluice.learner.control")
POLL_MS = 100
ENV_ERROR_CHARS = 2000
"""Longest env error message (from an actor host's heartbeat) the learner prints."""
ENV_ERRORS_REMEMBERED = 1000
"""Distinct env errors remembered so each is printed once (past this, the memory starts over)."""
HOST_NAME_CHARS = 64
"""Longest host name kept from a REGISTER (printable characters only)."""
WEIGHT_REQUESTS = RateLimit(per_second=2.0, burst=5)
"""How often one identity may REGISTER or GET_WEIGHTS (each answer carries the whole model)."""
EXPIRE_EVERY_S = 0.25
"""How often the registered hosts are checked for silence."""
TARGET_HOST = re.compile(r"[A-Za-z0-9._:-]{1,253}|\*|")
"""A metrics address's host part: a host name, an IPv4 or IPv6 literal, or a wildcard (empty, ``*``)."""
DEPARTED_REMEMBERED = 1024
"""Identities of hosts that left or were forgotten, remembered so their late messages read as a normal event."""
HOST_LINES = RateLimit(per_second=0.1, burst=10)
"""Log lines about hosts (left with a failure, forgotten, env errors): 10 at once, then one per 10 s."""


@dataclass(frozen=True, kw_only=True)
class ControlCounts:
    """What the control server has counted since the learner started, as ``ControlServer.counts`` hands it out."""

    actor_hosts: int
    """Actor hosts registered and alive now."""
    actor_hosts_lost: int
    """Hosts forgotten after peer_timeout_s of silence."""
    actor_hosts_failed: int
    """Hosts that left with a BYE naming a failure."""
    rejected_by_reason: dict[str, int]
    """Control messages refused, by reason (protocol errors, not_registered, rate_limited, too_many_hosts, ...)."""
    registrations: int = 0
    """Registrations accepted (a host that registers again counts again)."""


def printable(text: str, limit: int) -> str:
    """Peer-supplied text as the logs show it: printable characters only, at most ``limit`` of them."""
    return "".join(char for char in text[:4 * limit] if char.isprintable())[:limit]


def peer_address_of(frame: zmq.Frame) -> str | None:
    """The IP address a received message came from (ZMQ's ``Peer-Address``; None where the transport has none)."""
    try:
        return frame.get("Peer-Address") or None
    except zmq.ZMQError:
        return None


def curve_key_of(frame: zmq.Frame) -> str | None:
    """The z85 CURVE public key a received message arrived under (its ZMQ ``User-Id`` property), None without
    CURVE."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:  # EINVAL: no ZAP handler set one (no CURVE)
        return None
    return user_id or None


def scrape_target(reported: Any, peer: str | None) -> str | None:
    """The Prometheus target for a host whose metrics endpoint reported binding ``reported`` (host:port), as seen
    from ``peer`` (its IP address; None where the transport has none): None when there is no valid address or
    the host bound loopback on another machine."""
    if not isinstance(reported, str) or len(reported) > 300:
        return None
    host, _, port_text = reported.rpartition(":")
    host = host.strip("[]")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or not TARGET_HOST.fullmatch(host):
        return None
    if host in WILDCARD_HOSTS:
        host = peer or "127.0.0.1"
    elif is_loopback(host) and peer is not None and not is_loopback(peer):
        return None
    return f"{url_host(host)}:{int(port_text)}"


class ControlServer(threading.Thread):
    """ROUTER bound at ``endpoint``; the only thread that touches it."""

    def __init__(self, *, context: zmq.Context, endpoint: str, registration: dict[str, Any],
                 peer_timeout_s: float, limits: Limits, stop: threading.Event, registry: SenderRegistry,
                 sizing: HostSizing, pool: PoolService | None = None, curve: ServerCurve | None = None,
                 max_hosts: int = MAX_HOSTS, weight_requests: RateLimit = WEIGHT_REQUESTS,
                 clock: Callable[[], float] = time.monotonic, announce: Callable[[str], None] | None = None,
                 routing: HostRouting | None = None, zap: ZapGuard | None = None) -> None:
        """``announce``: where the short lines about hosts joining and leaving go (default: the log); ``routing``:
        with several learner ranks, which ranks' data sockets each host pushes to (REGISTERED and every
        HEARTBEAT_ACK carry its ``data_endpoints``); ``zap``: with CURVE, the allow-list a REGISTER's key must be
        in, and whose removed keys drop their registered hosts."""
        super().__init__(name="control", daemon=True)
        self.zap = zap
        self.routing = routing
        self.announce = announce or LOG.info
        self.pool = pool
        self.registration = registration
        self.peer_timeout_s = peer_timeout_s
        self.limits = limits
        self.stop = stop
        self.registry = registry
        self.sizing = sizing
        self.max_hosts = max_hosts
        self.clock = clock
        self.weight_requests = PeerRateLimiter(weight_requests, max_peers=2 * max_hosts, clock=clock)
        self.reject_log = RejectLog(LOG, what="control message", clock=clock)
        self.host_lines = TokenBucket(HOST_LINES, now=clock())
        self.host_lines_left_out = 0
        self.lock = threading.Lock()  # guards the weights, the shutdown reason and the refusal counts
        self.hosts = HostTable(peer_timeout_s=peer_timeout_s, max_hosts=max_hosts)  # locks itself
        self.rejected: Counter = Counter()
        self.last_expiry = 0.0
        self.env_errors_seen: set[tuple[str, str, str]] = set()
        self.departed: OrderedDict[bytes, str] = OrderedDict()
        """Identities whose host said BYE or was forgotten, and how (DEPARTED_REMEMBERED newest; this thread's)."""
        self._weights: tuple[int, dict[str, np.ndarray]] = (0, {})
        self._shutdown_reason: str | None = None
        self.socket = context.socket(zmq.ROUTER)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        self.socket.bind(endpoint)

    def set_weights(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """The weights handed to registering hosts and GET_WEIGHTS requests."""
        with self.lock:
            self._weights = (version, arrays)

    def begin_shutdown(self, reason: str) -> None:
        """From now on every request is answered with SHUTDOWN."""
        with self.lock:
            self._shutdown_reason = reason

    def host_count(self) -> int:
        """Actor hosts currently registered and alive."""
        return len(self.hosts)

    def counts(self) -> ControlCounts:
        """The hosts alive now and what was counted since the learner started (safe from any thread: the refusals
        under this server's lock, the host counts under the table's, taken inside it, never the other way round)."""
        with self.lock:
            hosts = self.hosts.counts()
            return ControlCounts(actor_hosts=hosts.actor_hosts, actor_hosts_lost=hosts.lost,
                                 actor_hosts_failed=hosts.failed, rejected_by_reason=dict(self.rejected),
                                 registrations=hosts.registrations)

    def host_heartbeats(self) -> dict[str, float]:
        """Each registered host's name and the Unix time it was last heard from (safe from any thread)."""
        now_wall, now = time.time(), self.clock()
        return {name: now_wall - silent_s for name, silent_s in self.hosts.silences(now).items()}

    def metrics_targets(self) -> list[dict[str, Any]]:
        """The registered hosts' metrics addresses in Prometheus' HTTP service discovery format: one target group
        per host, labelled with its name (safe from any thread)."""
        return self.hosts.metrics_targets()

    def run(self) -> None:
        last_turn = self.clock()
        try:
            while not self.stop.is_set():
                if self.socket.poll(POLL_MS):
                    self._serve(self.socket.recv_multipart(copy=False))
                now = self.clock()
                if self.hosts.excuse_pause(now - last_turn):
                    LOG.warning("learner: the control thread did not run for %.1f s (paused or starved); actor "
                                "hosts get that time back before they count as silent", now - last_turn)
                last_turn = now
                if now - self.last_expiry >= EXPIRE_EVERY_S:
                    self._expire(now)
                    self._drop_revoked()
                    self.last_expiry = now
        finally:
            self.socket.close(linger=0)

    def _serve(self, frames: list) -> None:
        identity, payload = frames[0].bytes, frames[1:]
        message: Message | None = None
        try:
            message = decode(payload, self.limits)
            reply = self._handle(identity, message, curve_key=curve_key_of(frames[0]), peer=peer_address_of(frames[0]))
        except ProtocolError as err:
            with self.lock:
                self.rejected[err.reason] += 1
            gone = self.departed.get(identity) if err.reason == "not_registered" else None
            if gone is not None and message is not None:
                self.reject_log.expected(f"{message.type.value} {gone}",
                                         f"late {message.type.value} from {gone}: answered not_registered")
            else:
                self.reject_log.reject(err.reason, str(err), peer=identity)
            fields = {"reason": err.reason, "message": str(err)}
            if message is not None:
                fields["refused"] = message.type.value
                fields["refused_seq"] = message.seq
            reply = Message(type=MessageType.ERROR, sender="learner", fields=fields)
        if reply is not None:
            self.socket.send_multipart([identity, *encode(reply)], copy=False)

    def _handle(self, identity: bytes, message: Message, *, curve_key: str | None,
                peer: str | None = None) -> Message | None:
        now = self.clock()
        with self.lock:
            version, weights = self._weights
            shutdown = self._shutdown_reason
        known = self.hosts.seen(identity, now)  # only this thread changes the table: ``known`` holds till it does
        if message.type is MessageType.BYE:
            self._leave(identity, message.fields.get("reason"))
            return None
        if shutdown is not None:
            return Message(type=MessageType.SHUTDOWN, sender="learner", fields={"reason": shutdown})
        if message.type in POOL_REQUESTS:  # read-only: a host's pool client need not be registered
            if self.pool is None:
                raise ProtocolError("unexpected_type", f"{message.type.value}: self-play is off on this learner "
                                                       "(selfplay.enabled: false)")
            return self.pool.handle(message)
        if message.type is MessageType.REGISTER:
            size = self.sizing.for_workers(message.fields["num_workers"])
            if curve_key is not None and self.zap is not None and not self.zap.is_allowed(curve_key):
                raise ProtocolError("key_revoked", f"register: this host's CURVE key {curve_key} is no longer in the "
                                                   "learner's allowed clients directory")
            host = self.hosts.repeat_of(identity, session=message.fields.get("session"), curve_key=curve_key,
                                        num_workers=size.num_workers)
            if host is not None:  # a repeat of the current registration keeps its token
                if not self.weight_requests.allow(identity):
                    return None  # the same registration asked for again too often: its earlier answers stand
            else:
                self._check_rate(identity, message.type)
                host = self._register(identity, message, size=size, curve_key=curve_key, peer=peer, now=now)
            return Message(type=MessageType.REGISTERED, sender="learner", version=version,
                           fields={**self.registration, "token": host.token, **self._routes(identity)},
                           arrays=weights)
        if known is None:
            raise ProtocolError("not_registered", f"{message.type.value} before register: an unregistered "
                                                  "identity may only send register (or pool requests)")
        if message.type is MessageType.HEARTBEAT:
            if self.hosts.heartbeat(identity, message.fields.get("token")) is Heartbeat.STALE_TOKEN:
                raise ProtocolError("not_registered", "heartbeat: the token this host sends rows with is no longer "
                                                      "its registration's (registered again or forgotten); "
                                                      "register again")
            self._log_env_error(known.name, message.fields.get("env_error"))
            return Message(type=MessageType.HEARTBEAT_ACK, sender="learner", version=version,
                           fields={"run_id": self.registration["run_id"], **self._routes(identity)})
        if message.type is MessageType.GET_WEIGHTS:
            self._check_rate(identity, message.type)
            return Message(type=MessageType.WEIGHTS, sender="learner", version=version,
                           fields={"names": list(weights)}, arrays=weights)
        raise ProtocolError("unexpected_type", f"control socket does not accept {message.type.value}")

    def _routes(self, identity: bytes) -> dict[str, list[str]]:
        """With several learner ranks: the data endpoints the host ``identity`` pushes to ({} with one)."""
        if self.routing is None:
            return {}
        return {"data_endpoints": self.routing.endpoints_of(identity)}

    def _check_rate(self, identity: bytes, type_: MessageType) -> None:
        """Refuse a request answered with the weights when ``identity`` asks for them too often."""
        if not self.weight_requests.allow(identity):
            limit = self.weight_requests.limit
            raise ProtocolError("rate_limited", f"{type_.value}: one identity may ask for the weights "
                                                f"{limit.burst} times at once and {limit.per_second:g} times a "
                                                "second after; ask again later")

    def _register(self, identity: bytes, message: Message, *, size: HostSize, curve_key: str | None,
                  peer: str | None, now: float) -> RegisteredHost:
        """Record a host that registered and hand its registration a new token (an identity that registers again
        loses its old one)."""
        name = printable(message.fields["host"], HOST_NAME_CHARS)
        address = self._scrape_address(name, message.fields.get("metrics_address"), peer)
        registration = self.hosts.register(identity, name=name, num_workers=size.num_workers, now=now,
                                           session=message.fields.get("session"), curve_key=curve_key,
                                           metrics_address=address)
        if registration.host is None:
            raise ProtocolError("too_many_hosts", f"register: {registration.registered} actor hosts are registered, "
                                                  f"the most this learner takes (max_hosts {self.max_hosts})")
        host = registration.host
        self.departed.pop(identity, None)
        if registration.replaced is not None:
            self.registry.remove(registration.replaced.token)
        if self.routing is not None:
            self.routing.add(identity, size.agent_slots)
        self.registry.add(Sender(name=host.name, token=host.token, curve_key=curve_key, num_envs=size.num_envs,
                                 agent_slots=size.agent_slots))
        if registration.joined is Joined.NEW:
            ranks = "" if self.routing is None else f", rows to learner ranks {list(self.routing.ranks_of(identity))}"
            self.announce(f"actor host {host.name} joined with {host.num_workers} workers{ranks}")
        return host

    def _scrape_address(self, name: str, reported: Any, peer: str | None) -> str | None:
        """Where Prometheus can scrape a host that reported ``reported`` (host:port) from ``peer``: a wildcard
        bind is scraped at the peer's address; a loopback bind of a host on another machine cannot be scraped
        (said once, left out of discovery); an address that is not host:port is ignored."""
        target = scrape_target(reported, peer)
        if target is None and reported is not None:
            self._host_line(f"actor host {name}: its /metrics at {printable(str(reported), 80)} cannot be scraped "
                            f"from here (the host is at {peer}); start it with --metrics-host 0.0.0.0 or its address")
        return target

    def _leave(self, identity: bytes, reason: str | None) -> None:
        """A host said BYE: a normal leave, or a failure when it names a ``reason`` (counted and logged)."""
        host = self.hosts.leave(identity, failed=reason is not None)
        if host is None:
            return
        self.registry.remove(host.token)
        self._remember_departed(identity, f"actor host {peer_text(host.name)}, which left")
        if self.routing is not None:
            self.routing.remove(identity)
        if reason is None:
            self.announce(f"actor host {host.name} left")
        else:
            self._host_line(f"actor host {host.name} left: {printable(reason, DETAIL_CHARS)}")

    def _log_env_error(self, host: str, report: Any) -> None:
        """Print an env error an actor host's worker reported (type, message, file:line), once per distinct one."""
        if not isinstance(report, dict):
            return
        error = tuple(str(report.get(key, ""))[:ENV_ERROR_CHARS] for key in ("type", "message", "where"))
        if error in self.env_errors_seen:
            return
        if len(self.env_errors_seen) >= ENV_ERRORS_REMEMBERED:
            self.env_errors_seen.clear()
        self.env_errors_seen.add(error)
        kind, text, where = error
        self._host_line(f"actor host {host}: env error {kind}{f' at {where}' if where else ''}: {text}")

    def _expire(self, now: float) -> None:
        """Forget the hosts silent for peer_timeout_s (counted as lost); their rows are refused from now on."""
        for host in self._forget(self.hosts.expire(now)):
            self._remember_departed(host.identity, f"actor host {peer_text(host.name)}, which was forgotten")
            self._host_line(f"actor host {host.name} silent for {self.peer_timeout_s:.0f} s: forgotten")

    def _drop_revoked(self) -> None:
        """Forget the registered hosts whose CURVE key was removed from the allow-list: their rows are refused from
        now on, their next heartbeat is answered not_registered, and their REGISTER key_revoked, which stops them."""
        revoked = set() if self.zap is None else self.zap.take_revoked()
        for host in self._forget(self.hosts.drop_keys(revoked)):
            self._host_line(f"actor host {host.name}: its CURVE key was removed from the allowed clients: dropped")

    def _remember_departed(self, identity: bytes, how: str) -> None:
        """The host at ``identity`` left or was forgotten (``how``, for the lines about its late messages)."""
        self.departed[identity] = how
        self.departed.move_to_end(identity)
        while len(self.departed) > DEPARTED_REMEMBERED:
            self.departed.popitem(last=False)

    def _forget(self, gone: tuple[RegisteredHost, ...]) -> tuple[RegisteredHost, ...]:
        """Take the routes and the tokens of the hosts the table just forgot; returns them."""
        for host in gone:
            if self.routing is not None:
                self.routing.remove(host.identity)
        for host in gone:
            self.registry.remove(host.token)
        return gone

    def _host_line(self, text: str) -> None:
        """A warning about a host, unless HOST_LINES were already logged lately (those left out are counted and
        the next line says how many)."""
        if not self.host_lines.allow(self.clock()):
            self.host_lines_left_out += 1
            return
        left_out, self.host_lines_left_out = self.host_lines_left_out, 0
        LOG.warning("%s%s", text, f" ({left_out} lines about hosts left out before this one)" if left_out else "")
