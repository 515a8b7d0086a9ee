"""The learner's control socket: registration, heartbeats, weights on request, errors, shutdown.

A ROUTER socket served by its own thread, so actor hosts get answers while the trainer is busy.
Every request is validated; a bad one gets an ERROR reply naming the problem and is counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from learner.pool_server import POOL_REQUESTS, PoolService
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode

LOG = logging.getLogger("sluice.learner.control")
POLL_MS = 100
ENV_ERROR_CHARS = 2000
"""Longest env error message (from an actor host's heartbeat) the learner prints."""
ENV_ERRORS_REMEMBERED = 1000
"""Distinct env errors remembered so each is printed once (past this, the memory starts over)."""


@dataclass(kw_only=True)
class RegisteredHost:
    """The control server's record of an actor host that registered (the process itself: actors/host.py)."""

    name: str
    """Host name it reported plus its identity."""
    num_workers: int
    """Env worker processes it runs."""
    last_seen: float
    """Monotonic time of its last message."""


class ControlServer(threading.Thread):
    """ROUTER bound at ``endpoint``; the only thread that touches it."""

    def __init__(self, *, context: zmq.Context, endpoint: str, registration: dict[str, Any],
                 peer_timeout_s: float, limits: Limits, stop: threading.Event,
                 pool: PoolService | None = None) -> None:
        super().__init__(name="control", daemon=True)
        self.pool = pool
        self.registration = registration
        self.peer_timeout_s = peer_timeout_s
        self.limits = limits
        self.stop = stop
        self.lock = threading.Lock()
        self.hosts: dict[bytes, RegisteredHost] = {}
        self.rejected: Counter = Counter()
        self.hosts_lost = 0
        self.env_errors_seen: set[tuple[str, str, str]] = set()
        self._weights: tuple[int, dict[str, np.ndarray]] = (0, {})
        self._shutdown_reason: str | None = None
        self.socket = context.socket(zmq.ROUTER)
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
        with self.lock:
            return len(self.hosts)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.socket.poll(POLL_MS):
                    self._serve(self.socket.recv_multipart(copy=False))
                self._expire()
        finally:
            self.socket.close(linger=0)

    def _serve(self, frames: list) -> None:
        identity, payload = frames[0].bytes, frames[1:]
        try:
            message = decode(payload, self.limits)
            reply = self._handle(identity, message)
        except ProtocolError as err:
            with self.lock:
                self.rejected[err.reason] += 1
            LOG.warning("rejected control message from %r: %s", identity, err)
            reply = Message(type=MessageType.ERROR, sender="learner",
                            fields={"reason": err.reason, "message": str(err)})
        if reply is not None:
            self.socket.send_multipart([identity, *encode(reply)], copy=False)

    def _handle(self, identity: bytes, message: Message) -> Message | None:
        now = time.monotonic()
        with self.lock:
            version, weights = self._weights
            shutdown = self._shutdown_reason
            known = self.hosts.get(identity)
            if known is not None:
                known.last_seen = now
        if message.type is MessageType.BYE:
            with self.lock:
                self.hosts.pop(identity, None)
            return None
        if shutdown is not None:
            return Message(type=MessageType.SHUTDOWN, sender="learner", fields={"reason": shutdown})
        if message.type in POOL_REQUESTS:  # read-only: a host's pool client need not be registered
            if self.pool is None:
                raise ProtocolError("unexpected_type", f"{message.type.value}: self-play is off on this learner "
                                                       "(selfplay.enabled: false)")
            return self.pool.handle(message)
        if message.type is MessageType.REGISTER:
            host = RegisteredHost(name=f"{message.fields['host']}", num_workers=message.fields["num_workers"],
                                  last_seen=now)
            with self.lock:
                self.hosts[identity] = host
            LOG.info("actor host %s registered with %d workers", host.name, host.num_workers)
            return Message(type=MessageType.REGISTERED, sender="learner", version=version,
                           fields=self.registration, arrays=weights)
        if known is None:
            raise ProtocolError("not_registered", f"{message.type.value} before register")
        if message.type is MessageType.HEARTBEAT:
            self._log_env_error(known.name, message.fields.get("env_error"))
            return Message(type=MessageType.HEARTBEAT_ACK, sender="learner", version=version,
                           fields={"run_id": self.registration["run_id"]})
        if message.type is MessageType.GET_WEIGHTS:
            return Message(type=MessageType.WEIGHTS, sender="learner", version=version,
                           fields={"names": list(weights)}, arrays=weights)
        raise ProtocolError("unexpected_type", f"control socket does not accept {message.type.value}")

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
        LOG.warning("actor host %s: env error %s%s: %s", host, kind, f" at {where}" if where else "", text)

    def _expire(self) -> None:
        deadline = time.monotonic() - self.peer_timeout_s
        with self.lock:
            gone = [k for k, h in self.hosts.items() if h.last_seen < deadline]
            for key in gone:
                LOG.warning("actor host %s silent for %.0f s: forgotten", self.hosts[key].name,
                            self.peer_timeout_s)
                del self.hosts[key]
                self.hosts_lost += 1
