"""CurveZMQ on every socket: key files, the server and client socket settings, and the ZAP authenticator.

Everything cryptographic is ZeroMQ's own (CurveZMQ, RFC 26) through pyzmq; the allow-list is pyzmq's ZAP
authenticator (``zmq.auth.thread.ThreadAuthenticator``) with a credentials callback that checks a client's
public key against a directory of allowed ``*.key`` files. Key files are pyzmq's certificate format
(``zmq.auth.load_certificate`` reads them); ``python -m protocol.keys`` writes them.

A server (learner, pool server) holds its key pair and the allowed-clients directory; a client (actor host)
holds the server's public key and its own pair. A refused client is logged once per key and counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = ["ClientCurve", "CurveKeyError", "ServerCurve", "ZapGuard", "load_client_curve", "load_server_curve"]

LOG = logging.getLogger("sluice.protocol.curve")
Z85_KEY_CHARS = 40
"""A CurveZMQ key (32 bytes) in z85 text."""
REFUSED_KEYS_REMEMBERED = 4096
"""Distinct refused keys logged once each; past this the memory starts over (bounded under a flood)."""


class CurveKeyError(ValueError):
    """A key file or key directory cannot be used; the message names the file and what to do."""


def _read_pair(path: Path, *, what: str, need_secret: bool) -> tuple[bytes, bytes | None]:
    """A certificate file's (public, secret) keys, checked; CurveKeyError naming ``what`` otherwise."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as err:
        raise CurveKeyError(f"{what} {str(path)!r} is not a CURVE key file ({err}); make one with "
                            f"python -m protocol.keys") from None
    if len(public) != Z85_KEY_CHARS:
        raise CurveKeyError(f"{what} {str(path)!r}: public key is {len(public)} characters, expected "
                            f"{Z85_KEY_CHARS} (z85)")
    if need_secret:
        if secret is None:
            raise CurveKeyError(f"{what} {str(path)!r} holds only a public key; pass the .key_secret file")
        if len(secret) != Z85_KEY_CHARS:
            raise CurveKeyError(f"{what} {str(path)!r}: secret key is {len(secret)} characters, expected "
                                f"{Z85_KEY_CHARS} (z85)")
    return public, secret


def _allowed_keys(directory: Path) -> frozenset[bytes]:
    """The public keys of every ``*.key`` file in ``directory``."""
    if not directory.is_dir():
        raise CurveKeyError(f"allowed clients directory {str(directory)!r} does not exist; put each actor host's "
                            f"public .key file there")
    keys = set()
    for path in sorted(directory.glob("*.key")):
        public, _ = _read_pair(path, what="allowed client key", need_secret=False)
        keys.add(public)
    return frozenset(keys)


@dataclass(frozen=True, kw_only=True)
class ServerCurve:
    """A server's CURVE settings: its key pair and where the allowed clients' public keys are."""

    public: bytes
    """The server's public key (z85); clients need it."""
    secret: bytes
    """The server's secret key (z85)."""
    allowed_clients: Path
    """Directory of ``*.key`` files of the clients allowed to connect (read again when an unknown key knocks)."""

    def apply(self, socket: zmq.Socket) -> None:
        """Make ``socket`` a CURVE server (call before bind)."""
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True


@dataclass(frozen=True, kw_only=True)
class ClientCurve:
    """A client's CURVE settings: the server's public key and the client's own pair."""

    server_public: bytes
    """The public key of the server this client talks to."""
    public: bytes
    """The client's public key (what the server's allow-list holds)."""
    secret: bytes
    """The client's secret key."""

    def apply(self, socket: zmq.Socket) -> None:
        """Make ``socket`` a CURVE client of the server (call before connect)."""
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_serverkey = self.server_public


def load_server_curve(secret_file: str | os.PathLike, allowed_clients: str | os.PathLike) -> ServerCurve:
    """A server's settings from its ``.key_secret`` file and the allowed clients' directory."""
    public, secret = _read_pair(Path(secret_file), what="server secret key file", need_secret=True)
    directory = Path(allowed_clients)
    if not _allowed_keys(directory):
        LOG.warning("allowed clients directory %s holds no *.key file yet: every actor host is refused until one "
                    "is added", directory)
    assert secret is not None
    return ServerCurve(public=public, secret=secret, allowed_clients=directory)


def load_client_curve(server_public_file: str | os.PathLike, client_secret_file: str | os.PathLike) -> ClientCurve:
    """A client's settings from the server's public ``.key`` file and its own ``.key_secret`` file."""
    server_public, _ = _read_pair(Path(server_public_file), what="server public key file", need_secret=False)
    public, secret = _read_pair(Path(client_secret_file), what="client secret key file", need_secret=True)
    assert secret is not None
    return ClientCurve(server_public=server_public, public=public, secret=secret)


class _AllowList:
    """pyzmq's ZAP credentials provider: allowed keys from the directory, refusals counted and logged once per key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self.allowed = _allowed_keys(directory)
        self.refused: Counter[str] = Counter()
        self.logged: set[str] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        """True when ``key`` (z85) is allowed; the directory is read again for a key not seen before."""
        with self.lock:
            if key in self.allowed:
                return True
            try:
                self.allowed = _allowed_keys(self.directory)
            except CurveKeyError as err:
                LOG.warning("allowed clients: %s", err)
            if key in self.allowed:
                return True
            text = key.decode("ascii", "replace")[:Z85_KEY_CHARS]
            self.refused[text] += 1
            if len(self.logged) >= REFUSED_KEYS_REMEMBERED:
                self.logged.clear()
            if text not in self.logged:
                self.logged.add(text)
                LOG.warning("refused a CURVE client with public key %s: not in %s (add its .key file there to "
                            "allow it)", text, self.directory)
            return False


HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
"""Monitor events of a CURVE server socket whose peer did not complete the handshake: a client without keys
(plaintext) or with the wrong server key. Refused keys arrive through ZAP instead (EVENT_HANDSHAKE_FAILED_AUTH)."""
WATCH_POLL_MS = 100
FAILURE_LOG_INTERVAL_S = 60.0
"""Handshake failures are logged at most once per socket per this many seconds (a plaintext client retries)."""


class ZapGuard:
    """The ZAP authenticator of one context: every CURVE server socket of that context asks it about each client.

    ``watch`` adds a server socket's handshake failures (clients without keys, or with the wrong server key) to
    the count. Use as a context manager around the sockets' life, and stop it before the context terminates.
    """

    def __init__(self, context: zmq.Context, curve: ServerCurve) -> None:
        self.allow_list = _AllowList(curve.allowed_clients)
        self.authenticator = ThreadAuthenticator(context, log=logging.getLogger("sluice.protocol.zap"))
        self.authenticator.start()
        self.authenticator.configure_curve_callback(domain="*", credentials_provider=self.allow_list)
        self.handshake_failures: Counter[str] = Counter()
        self._monitors: dict[zmq.Socket, str] = {}
        self._last_logged: dict[str, float] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def watch(self, socket: zmq.Socket, name: str) -> None:
        """Count ``socket``'s failed handshakes under ``name`` (call from the thread that owns ``socket``, before
        that socket is used elsewhere; the monitor is read by the guard's own thread)."""
        if self._watcher is not None:
            raise RuntimeError("ZapGuard.watch() after the first watched socket started being read")
        self._monitors[socket.get_monitor_socket(HANDSHAKE_FAILURES)] = name

    def start_watching(self) -> None:
        """Start reading the watched sockets' monitors (once, after every ``watch``)."""
        if self._monitors and self._watcher is None:
            self._watcher = threading.Thread(target=self._read_monitors, name="curve-monitor", daemon=True)
            self._watcher.start()

    def _read_monitors(self) -> None:
        poller = zmq.Poller()
        for monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        while not self._stop.is_set():
            for monitor, _ in poller.poll(WATCH_POLL_MS):
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                if event["event"] & HANDSHAKE_FAILURES:
                    self._count_failure(self._monitors[monitor])

    def _count_failure(self, name: str) -> None:
        with self.allow_list.lock:
            self.handshake_failures[name] += 1
            count = self.handshake_failures[name]
        now = time.monotonic()
        if now - self._last_logged.get(name, -FAILURE_LOG_INTERVAL_S) >= FAILURE_LOG_INTERVAL_S:
            self._last_logged[name] = now
            LOG.warning("%s socket: a client failed the CURVE handshake (no keys, or not this server's public key); "
                        "%d so far", name, count)

    def refused(self) -> int:
        """Connection attempts refused so far: keys not allowed, and clients that failed the handshake."""
        with self.allow_list.lock:
            return sum(self.allow_list.refused.values()) + sum(self.handshake_failures.values())

    def refused_keys(self) -> int:
        """Distinct public keys refused so far."""
        with self.allow_list.lock:
            return len(self.allow_list.refused)

    def stop(self) -> None:
        """Stop the monitor reader and the authenticator thread, close the monitors (idempotent)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._monitors = {}
        if self.authenticator.is_alive():
            self.authenticator.stop()

    def __enter__(self) -> "ZapGuard":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
