"""The actor host's sockets to the learner: control (DEALER), rows (PUSH), weights (SUB).

Registration waits for a learner that is not up yet; heartbeats keep both sides aware of each other;
rows are sent only when the PUSH socket has room (the high-water mark is the back-pressure signal).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol import Limits, Message, MessageType, PackedArrays, ProtocolError, decode, encode
from protocol.curve import ClientCurve
from protocol.endpoints import Endpoint, parse_endpoint
from protocol.same_machine import ipc_routes, machine_identity, owned_by_this_user
from protocol.sending import send_nonblocking
from protocol.zmtp_greeting import peer_mechanism

LOG = logging.getLogger("sluice.actors.link")
WAITING_NOTICE_S = 5.0
"""Seconds from the line that says where the host waits and what to check to the first short "still waiting"
line; each later gap doubles, up to ``WAITING_NOTICE_MAX_S``."""
WAITING_NOTICE_MAX_S = 60.0
"""Longest gap between two "still waiting" lines."""
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)
"""The control socket's monitor events under CURVE: how each handshake with the learner ended."""
HANDSHAKE_FAILURES_TO_STOP = 3
"""Failed CURVE handshakes in a row, each after the TCP connection was made, that stop the host: a learner that
cannot decrypt the host's HELLO (the wrong server key) drops the connection, which the host sees as a failure
without detail; one such failure alone may be a learner that stopped mid-handshake."""
REGISTER_RETRY_MAX_S = 4.0
"""Longest wait between two REGISTERs to a learner that does not answer (the wait doubles from ``retry_s``), so a
learner frozen for minutes finds a few queued REGISTERs, not hundreds."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """What the learner hands a host at registration."""

    config: dict[str, Any]
    """The resolved run config."""
    run_id: str
    """Identity of the learner run (changes when the learner restarts)."""
    version: int
    """Policy version of ``weights``."""
    weights: dict[str, np.ndarray]
    """Current policy weights."""
    data_port: int
    """Learner's data (PULL) port."""
    weights_port: int
    """Learner's weights (PUB) port."""
    token: str | None = None
    """The secret the learner handed this registration, sent back in every ROWS message (None from a learner
    that hands out none)."""
    data_endpoints: tuple[str, ...] = ()
    """With several learner ranks: the data endpoints to push rows to (() : the one at ``data_port``)."""
    data_endpoint: str = ""
    """The learner's data endpoint as it announced it (the key of its route in ``ipc_routes``)."""
    ipc_routes: dict[str, str] = dataclasses.field(default_factory=dict)
    """Data endpoints as announced -> the ipc endpoint this host reaches the same socket at (the learner's rank on
    this machine and network namespace: protocol/same_machine.py); the others are reached over TCP."""
    packed_rows: bool = False
    """The learner reads ROWS messages with every array in one frame (REGISTERED's ``packed_rows``)."""
    shared_rows: bool = False
    """The learner reads a ROWS message's payload from the host's shared memory (REGISTERED's ``shared_rows``)."""


MAX_DATA_ENDPOINTS = 1024
"""Most data endpoints (learner ranks) a host accepts in one routing."""


def read_data_endpoints(value: Any) -> tuple[str, ...] | None:
    """A REGISTERED / HEARTBEAT_ACK ``data_endpoints`` field as endpoint URLs; None when absent or malformed
    (then logged): a host never connects to something it cannot parse."""
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_DATA_ENDPOINTS:
        LOG.warning("learner sent a data_endpoints field that is not a list of 1..%d endpoints; ignored",
                    MAX_DATA_ENDPOINTS)
        return None
    try:
        return tuple(parse_endpoint(url, "data endpoint").url for url in value)
    except (TypeError, ValueError) as err:
        LOG.warning("learner sent a bad data endpoint (%s); ignored", err)
        return None


def waiting_notice(learner: Endpoint, *, waited_s: float, curve: bool) -> str:
    """The line an unregistered host prints while no learner answers: where, how long, and what to check."""
    checks = ["is the learner started?"]
    if learner.scheme == "tcp":
        checks.append(f"is {learner.port} the network.port of the learner's config?")
        if not learner.is_loopback:
            checks.append(f"does {learner.host}'s firewall let ports {learner.port}-{learner.port + 2} through?")
    else:
        checks.append(f"does the learner listen on {learner.url}?")
    checks.append("with CURVE: --curve-server-key must be that learner's server.key" if curve
                  else "a learner with CURVE keys needs --curve-server-key and --curve-client-key")
    return f"actors: waiting for the learner at {learner.url} ... ({waited_s:.0f} s so far; {'; '.join(checks)})"


def still_waiting_notice(learner: Endpoint, *, waited_s: float) -> str:
    """The short line that follows ``waiting_notice`` while the learner still does not answer."""
    return f"actors: still waiting for the learner at {learner.url} ({waited_s:.0f} s so far)"


def notice_gaps(first_s: float = WAITING_NOTICE_S, max_s: float = WAITING_NOTICE_MAX_S):
    """Seconds between one waiting line and the next: ``first_s``, then doubling, at most ``max_s``."""
    gap = first_s
    while True:
        yield gap
        gap = min(2 * gap, max_s)


def refuses_register(error: Message) -> bool:
    """Whether an ERROR reply refuses this host's REGISTER, not an earlier heartbeat or rows message: it names
    ``register`` as the refused type, or names none (a message the learner could not decode) and is not the
    ``not_registered`` answer that only ever goes to a message other than REGISTER."""
    refused = error.fields.get("refused")
    if refused is not None:
        return refused == MessageType.REGISTER.value
    return error.fields.get("reason") != "not_registered"


class LearnerRefused(RuntimeError):
    """The learner refused this host (its CURVE key is not allowed); the message says what to do."""


class LearnerLink:
    """Owns the three sockets; used from the host's main thread only."""

    def __init__(self, learner: Endpoint, *, num_workers: int, limits: Limits,
                 curve: ClientCurve | None = None, metrics_address: str | None = None) -> None:
        self.learner = learner
        self.metrics_address = metrics_address
        """Where this host's Prometheus endpoint listens (host:port), sent with every REGISTER (None: not sent)."""
        self.curve = curve
        """CURVE on all three sockets (None: plaintext)."""
        self.num_workers = num_workers
        self.limits = limits
        self.context = zmq.Context()
        self.control = self._control_socket()
        self.data: zmq.Socket | None = None
        self.packed_rows = False
        """Whether ROWS go packed (every array in one frame): the learner said it reads them (set per registration)."""
        self.shared_rows = False
        """Whether the learner reads ROWS payloads from this host's shared memory (set per registration)."""
        self.data_endpoint = ""
        """The learner's data endpoint as it announced it (set per registration)."""
        self.weights: zmq.Socket | None = None
        self.seq = 0
        self.name = f"{socket.gethostname()}:{os.getpid()}-{secrets.token_hex(2)}"
        """This host in the learner's log and Prometheus labels: machine, process, and a random part (two links of
        one process differ; an object's address did not, across two hosts started alike)."""
        self.session = secrets.token_hex(8)
        """Sent with every REGISTER: the learner answers REGISTERs of one session with one token (idempotent)."""
        self.token: str | None = None
        """The current registration's token (each registration replaces it)."""
        self.registered_at_seq = 0
        """The ``seq`` of the last control message sent before the current registration's answer came."""
        self.data_routes: tuple[str, ...] = ()
        """The learner ranks' data endpoints the data socket is connected to, as announced (() : one learner)."""
        self.ipc_routes: dict[str, str] = {}
        """The current registration's ``ipc_routes``: announced data endpoints this host reaches over ipc://."""
        self.shutdown_reason: str | None = None
        """The reason of a SHUTDOWN that answered a REGISTER (the learner ended its run meanwhile), else None."""

    def _control_socket(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        self.refusals = None if self.curve is None else sock.get_monitor_socket(HANDSHAKE_EVENTS)
        self.failed_handshakes = 0
        """CURVE handshakes with the learner that failed since the last one that succeeded."""
        self._secure(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        sock.connect(self.learner.url)
        return sock

    def _secure(self, sock: zmq.Socket) -> None:
        if self.curve is not None:
            self.curve.apply(sock)

    def _check_not_refused(self) -> None:
        """CURVE: a learner that refused this host's key, that runs without CURVE, or whose handshakes keep failing
        (the wrong server key) is an error that says what to do."""
        while self.refusals is not None and self.curve is not None and self.refusals.poll(0):
            event = recv_monitor_message(self.refusals)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failed_handshakes = 0
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise LearnerRefused(f"the learner at {self.learner.url} refused this host's CURVE key "
                                     f"{self.curve.public.decode('ascii')}: copy this host's public .key file into "
                                     f"the learner's allowed clients directory (--curve-allowed-clients)")
            elif (event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  and event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
                raise self._without_curve()
            else:
                self.failed_handshakes += 1
        if self.curve is not None and self.failed_handshakes >= HANDSHAKE_FAILURES_TO_STOP:
            if peer_mechanism(self.learner) == "NULL":  # its connection closed before the mismatch was read
                raise self._without_curve()
            raise LearnerRefused(f"the learner at {self.learner.url} refused the handshake: wrong server key? "
                                 f"--curve-server-key must be the learner's server.key (the one given holds "
                                 f"{self.curve.server_public.decode('ascii')})")

    def _without_curve(self) -> LearnerRefused:
        return LearnerRefused(f"the learner at {self.learner.url} does not use CURVE: start it with "
                              f"--curve-secret-key and --curve-allowed-clients, or run this host without "
                              f"--curve-server-key and --curve-client-key")

    def send_control(self, type_: MessageType, fields: dict[str, Any] | None = None) -> bool:
        """Send a control message; silently skipped while no learner is connected. Returns whether it was queued."""
        self.seq += 1
        message = Message(type=type_, sender=self.name, seq=self.seq, fields=fields or {})
        try:
            self.control.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv_control(self) -> Message | None:
        """One pending control reply, or None; malformed replies are logged and skipped."""
        if not self.control.poll(0):
            return None
        frames = self.control.recv_multipart(copy=False)
        try:
            return decode(frames, self.limits)
        except ProtocolError as err:
            LOG.warning("bad control reply from learner: %s", err)
            return None

    def register(self, *, retry_s: float, should_stop, first_notice_s: float = 0.0) -> Registration | None:
        """Register, retrying until the learner answers; None if ``should_stop()`` becomes true first (or a
        SHUTDOWN answers: ``shutdown_reason`` says why).

        While no learner answers, one line (after ``first_notice_s``) says where the host waits and what to check,
        so a wrong address or port is never a silent wait; then short lines say how long it has waited, the gap
        between them doubling from ``WAITING_NOTICE_S`` to ``WAITING_NOTICE_MAX_S``."""
        wait_s = 0.2
        late_refusals = 0
        started = time.monotonic()
        next_notice = started + first_notice_s
        gaps = notice_gaps()
        notices = 0
        self.shutdown_reason = None
        while not should_stop():
            queued = self.send_control(MessageType.REGISTER, self._register_fields())
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not should_stop():
                if not self.control.poll(100):
                    continue
                reply = self.recv_control()
                if reply is None:
                    continue
                if reply.type is MessageType.REGISTERED:
                    return self._registration(reply)
                if reply.type is MessageType.SHUTDOWN:
                    self.shutdown_reason = str(reply.fields.get("reason", "shutdown"))
                    return None
                if reply.type is MessageType.ERROR and refuses_register(reply):
                    raise LearnerRefused(f"learner refused registration: {reply.fields['message']}")
                if reply.type is MessageType.ERROR and not late_refusals:  # answers a message sent before
                    LOG.info("while registering, the learner refused an earlier %s: %s",
                             reply.fields.get("refused", "message"), reply.fields["message"])
                late_refusals += reply.type is MessageType.ERROR
            self._check_not_refused()
            if queued:  # connected, yet no answer: a paused or cut-off learner; ask less often
                wait_s = retry_s if wait_s < retry_s else min(2 * wait_s, max(retry_s, REGISTER_RETRY_MAX_S))
            else:  # nothing queued (no connection yet): keep asking at the usual pace
                wait_s = retry_s
            now = time.monotonic()
            if now >= next_notice and not should_stop():
                print(still_waiting_notice(self.learner, waited_s=now - started) if notices else
                      waiting_notice(self.learner, waited_s=now - started, curve=self.curve is not None), flush=True)
                notices += 1
                next_notice = now + next(gaps)
        return None

    def _register_fields(self) -> dict[str, Any]:
        """The REGISTER message's fields."""
        fields: dict[str, Any] = {"host": self.name, "num_workers": self.num_workers, "session": self.session}
        if self.metrics_address is not None:
            fields["metrics_address"] = self.metrics_address
        return fields

    def send_heartbeat(self, fields: dict[str, Any]) -> None:
        """A HEARTBEAT with the token rows go out with, so a learner that no longer holds it says so."""
        self.send_control(MessageType.HEARTBEAT, fields if self.token is None else {**fields, "token": self.token})

    @contextmanager
    def heartbeats_meanwhile(self, interval_s: float) -> Iterator[None]:
        """Send a HEARTBEAT every ``interval_s`` from a thread while the block runs (building a host: worker start,
        numba compiling the assembler's kernels on a cold cache), so the learner does not forget a host that is
        only slow to start. The block must not use the control socket (ZeroMQ sockets are single-threaded)."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(interval_s):
                self.send_heartbeat({})

        thread = threading.Thread(target=beat, name="sluice-heartbeats", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def refuses_an_earlier_registration(self, error: Message) -> bool:
        """Whether an ERROR refuses a message sent before this host's current registration (a heartbeat queued
        while the learner was paused): it says nothing about the registration now."""
        refused_seq = error.fields.get("refused_seq")
        return refused_seq is not None and refused_seq <= self.registered_at_seq

    def adopt_late_registration(self, reply: Message, run_id: str) -> bool:
        """A REGISTERED that answers an earlier REGISTER of this session (queued during a pause): its token is the
        learner's current one for this host, so rows go out with it. Returns False for a reply of another learner
        run (the caller registers again)."""
        if reply.fields.get("run_id") != run_id:
            return False
        token = reply.fields.get("token")
        if token is not None and token != self.token:
            LOG.info("a late registration reply replaced this host's token")
            self.token = token
        return True

    def _registration(self, reply: Message) -> Registration:
        fields = reply.fields
        data_endpoint = parse_endpoint(fields["data_endpoint"], "data endpoint")
        weights_port = parse_endpoint(fields["weights_endpoint"], "weights endpoint").port
        self.token = fields.get("token")
        self.registered_at_seq = self.seq
        return Registration(config=fields["config"], run_id=fields["run_id"], version=reply.version,
                            weights={k: np.array(v) for k, v in reply.arrays.items()},
                            data_port=data_endpoint.port, weights_port=weights_port, token=self.token,
                            data_endpoints=read_data_endpoints(fields.get("data_endpoints")) or (),
                            data_endpoint=data_endpoint.url,
                            ipc_routes=ipc_routes(fields.get("data_ipc"), machine=machine_identity()),
                            packed_rows=fields.get("packed_rows", False),
                            shared_rows=fields.get("shared_rows", False))

    def open_streams(self, registration: Registration, *, hwm: int, buffer_bytes: int) -> None:
        """Connect the data and weights sockets to the ports the learner advertised; the data socket over ipc:// to
        a learner rank on this machine that offers it (one line says so), over TCP otherwise."""
        self.close_streams()
        self.data = self.context.socket(zmq.PUSH)
        self._secure(self.data)
        self.data.setsockopt(zmq.SNDHWM, hwm)
        self.data.setsockopt(zmq.SNDBUF, buffer_bytes)
        self.data.setsockopt(zmq.LINGER, 0)
        self.data.setsockopt(zmq.IMMEDIATE, 1)
        self.data_routes: tuple[str, ...] = ()
        self.ipc_routes = dict(registration.ipc_routes)
        self.packed_rows = registration.packed_rows
        self.shared_rows = (registration.shared_rows and registration.packed_rows  # and the learner can open them:
                            and all(owned_by_this_user(ipc) for ipc in self.ipc_routes.values()))
        self.data_endpoint = registration.data_endpoint
        if registration.data_endpoints:
            self.route_data(registration.data_endpoints)
            over_ipc = [self.ipc_routes[url] for url in registration.data_endpoints if url in self.ipc_routes]
        else:
            over_ipc = [url for url in [self.ipc_routes.get(registration.data_endpoint)] if url is not None]
            self.data.connect(over_ipc[0] if over_ipc else self.learner.with_port(registration.data_port).url)
        if over_ipc:
            print(f"actors: rows go to the learner over {', '.join(over_ipc)} (same machine)", flush=True)
        self.weights = self.context.socket(zmq.SUB)
        self._secure(self.weights)
        self.weights.setsockopt(zmq.RCVHWM, 4)
        self.weights.setsockopt(zmq.LINGER, 0)
        self.weights.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        self.weights.setsockopt(zmq.SUBSCRIBE, b"")
        self.weights.connect(self.learner.with_port(registration.weights_port).url)

    def resolve(self, url: str) -> str:
        """A data endpoint the learner announced, as this host connects to it: its ipc route when it has one,
        ``tcp://*:PORT`` as the learner's own address at PORT."""
        if url in self.ipc_routes:
            return self.ipc_routes[url]
        endpoint = parse_endpoint(url, "data endpoint")
        if endpoint.host == "*":
            return self.learner.with_port(endpoint.port).url
        return endpoint.url

    def route_data(self, endpoints: tuple[str, ...]) -> bool:
        """Push rows to exactly these learner ranks' data endpoints (ZeroMQ deals messages round-robin among
        them): connects the new ones before disconnecting the old (rows queued for a dropped one are lost). Returns
        whether anything changed."""
        assert self.data is not None
        if endpoints == self.data_routes:
            return False
        old = {self.resolve(url) for url in self.data_routes}
        new = {self.resolve(url) for url in endpoints}
        for url in sorted(new - old):
            self.data.connect(url)
        for url in sorted(old - new):
            self.data.disconnect(url)
        self.data_routes = endpoints
        return True

    @property
    def rows_through_memory(self) -> bool:
        """Whether ROWS payloads go through this host's shared memory: the learner reads them so, and every learner
        rank the data socket pushes to is on this machine (reached over ipc://)."""
        if not self.shared_rows:
            return False
        if self.data_routes:
            return all(url in self.ipc_routes for url in self.data_routes)
        return self.data_endpoint in self.ipc_routes

    def latest_broadcast(self) -> Message | None:
        """Drain the weights socket; returns SHUTDOWN if one came, else the newest WEIGHTS, else None."""
        newest = None
        while self.weights is not None and self.weights.poll(0):
            frames = self.weights.recv_multipart(copy=False)
            try:
                message = decode(frames, self.limits)
            except ProtocolError as err:
                LOG.warning("bad broadcast from learner: %s", err)
                continue
            if message.type is MessageType.SHUTDOWN:
                return message
            if message.type is MessageType.WEIGHTS and (newest is None or message.version > newest.version):
                newest = message
        return newest

    def can_send_rows(self) -> bool:
        """True when the data socket will take a message without blocking."""
        return self.data is not None and bool(self.data.poll(0, zmq.POLLOUT))

    def send_rows(self, message: Message, packed: PackedArrays | None = None) -> int | None:
        """Queue one ROWS message, with this registration's token in its fields; returns its size in bytes, or None
        when the data socket took nothing (no learner rank connected, or every one's queue full). ``packed``: the
        buffer the message's arrays are views of, sent as one frame when the learner reads packed rows.

        Never blocks: a rank that stops between ``can_send_rows`` and this call leaves a socket with no peer, and a
        blocking send would wait for one forever (deaf to SIGTERM, which only sets the stop flag)."""
        assert self.data is not None
        if self.token is not None:
            message = dataclasses.replace(message, fields={**message.fields, "token": self.token})
        return send_nonblocking(self.data, encode(message, packed=packed if self.packed_rows else None))

    def close_streams(self) -> None:
        """Close data and weights sockets."""
        for sock in (self.data, self.weights):
            if sock is not None:
                sock.close(linger=0)
        self.data = self.weights = None

    def close(self, reason: str | None = None) -> None:
        """Say goodbye (best effort) and close everything; ``reason`` says why when the host stops because
        something failed (the learner counts it as a failed host), None for a normal stop.

        The data socket closes first (rows it still queues are dropped), then the BYE goes out: no row leaves this
        host after its BYE, so the learner drops this host's token only after the last row was sent (rows still in
        the network then reach a learner that knows the host left)."""
        self.close_streams()
        self.send_control(MessageType.BYE, None if reason is None else {"reason": reason})
        self.control.close(linger=100)
        if self.refusals is not None:
            self.refusals.close(linger=0)
        self.context.term()
