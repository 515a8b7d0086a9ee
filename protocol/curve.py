"""CurveZMQ on every socket: key files, the server and client socket settings, and the ZAP authenticator.

Everything cryptographic is ZeroMQ's own (CurveZMQ, RFC 26) through pyzmq; the allow-list is pyzmq's ZAP
authenticator (``zmq.auth.thread.ThreadAuthenticator``) with a credentials callback that checks a client's
public key against a directory of allowed ``*.key`` files. Key files are pyzmq's certificate format
(``zmq.auth.load_certificate`` reads them); ``python -m protocol.keys`` writes them.

A server (learner, pool server) holds its key pair and the allowed-clients directory; a client (actor host)
holds the server's public key and its own pair. A refused client is logged once per key and counted.

``AllowList`` watches the directory: every ZAP request reads its listing first, so a removed key is refused at
once, and a thread checks it every ``ALLOW_LIST_POLL_S`` so that ``take_revoked`` hands a server the keys removed
since it last asked (to drop hosts already connected under them). A secret key file that group or others can
read is warned about, or refused with ``strict_keys`` (``--strict-keys``), as ssh refuses such a private key.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = ["AllowList", "ClientCurve", "CurveKeyError", "ServerCurve", "ZapGuard", "load_client_curve",
           "load_server_curve"]

LOG = logging.getLogger("sluice.protocol.curve")
Z85_KEY_CHARS = 40
"""A CurveZMQ key (32 bytes) in z85 text."""
REFUSED_KEYS_REMEMBERED = 4096
"""Distinct refused keys logged once each; past this the memory starts over (bounded under a flood)."""
ALLOW_LIST_POLL_S = 0.5
"""Seconds between the allow-list watcher's looks at the allowed clients directory (a listing and one stat per file)."""
PRIVATE_MODE_BITS = 0o077
"""Permission bits a secret key file must not have: any access by group or others (what ssh checks)."""


class CurveKeyError(ValueError):
    """A key file or key directory cannot be used; the message names the file and what to do."""


def _check_private(path: Path, *, what: str, strict: bool) -> None:
    """A secret key file open to group or others: one warning line on stderr naming it, its mode and the chmod that
    fixes it, or (``strict``) a CurveKeyError saying the same."""
    if os.name != "posix":
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & PRIVATE_MODE_BITS:
        return
    problem = (f"{what} {str(path)!r} has mode {mode:04o}, open to group or others: run chmod 600 "
               f"{shlex.quote(str(path))}")
    if strict:
        raise CurveKeyError(f"{problem} (refused under --strict-keys)")
    print(f"WARNING: {problem} (--strict-keys refuses such a file)", file=sys.stderr, flush=True)


def _read_pair(path: Path, *, what: str, need_secret: bool, strict_keys: bool = False) -> tuple[bytes, bytes | None]:
    """A certificate file's (public, secret) keys, checked; CurveKeyError naming ``what`` otherwise. With
    ``need_secret`` the file's mode is checked too (``_check_private``)."""
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
        _check_private(path, what=what, strict=strict_keys)
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
    """Directory of ``*.key`` files of the clients allowed to connect (watched: see ``AllowList``)."""

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


def load_server_curve(secret_file: str | os.PathLike, allowed_clients: str | os.PathLike, *,
                      strict_keys: bool = False) -> ServerCurve:
    """A server's settings from its ``.key_secret`` file and the allowed clients' directory (``strict_keys``: a
    secret key file open to group or others is an error, not a warning)."""
    public, secret = _read_pair(Path(secret_file), what="server secret key file", need_secret=True,
                                strict_keys=strict_keys)
    directory = Path(allowed_clients)
    if not _allowed_keys(directory):
        LOG.warning("allowed clients directory %s holds no *.key file yet: every actor host is refused until one "
                    "is added", directory)
    assert secret is not None
    return ServerCurve(public=public, secret=secret, allowed_clients=directory)


def load_client_curve(server_public_file: str | os.PathLike, client_secret_file: str | os.PathLike, *,
                      strict_keys: bool = False) -> ClientCurve:
    """A client's settings from the server's public ``.key`` file and its own ``.key_secret`` file (``strict_keys``:
    a secret key file open to group or others is an error, not a warning)."""
    server_public, _ = _read_pair(Path(server_public_file), what="server public key file", need_secret=False)
    public, secret = _read_pair(Path(client_secret_file), what="client secret key file", need_secret=True,
                                strict_keys=strict_keys)
    assert secret is not None
    return ClientCurve(server_public=server_public, public=public, secret=secret)


@dataclass(frozen=True, kw_only=True)
class KeyFileStamp:
    """What tells that an allowed ``*.key`` file changed since it was read (then it is read again)."""

    inode: int
    """The file's inode (a file replaced by another has a new one)."""
    size: int
    """The file's size in bytes."""
    mtime_ns: int
    """The file's modification time, in nanoseconds."""


def _listing(directory: Path) -> dict[str, KeyFileStamp] | None:
    """The ``*.key`` files in ``directory`` and their stamps; None when the directory cannot be listed."""
    found = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(".key"):
                    continue
                try:
                    if not entry.is_file():
                        continue
                    info = entry.stat()
                except OSError:  # removed since the listing, or a link to nothing
                    continue
                found[entry.name] = KeyFileStamp(inode=info.st_ino, size=info.st_size, mtime_ns=info.st_mtime_ns)
    except OSError:
        return None
    return found


class AllowList:
    """The allowed clients' public keys (z85 text), kept in step with their directory; every method is thread-safe.

    pyzmq's ZAP handler calls ``callback`` for each client that connects; it looks at the directory first, so a key
    whose file was removed is refused from that moment on. ``is_allowed`` and ``take_revoked`` look again when the
    last look is ``poll_s`` old; the watcher thread (``start``) looks every ``poll_s``, so a removal is logged and
    queued for ``take_revoked`` while nothing asks. A look lists the directory and stats each ``*.key`` file; only a
    file whose stamp changed is read. A key file that cannot be read keeps the key it held (a file caught
    half-written revokes no one); removing the file revokes its key. A directory that cannot be listed allows no one
    until it can be again.
    """

    def __init__(self, directory: Path, *, poll_s: float = ALLOW_LIST_POLL_S) -> None:
        self.directory = directory
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._files: dict[str, tuple[KeyFileStamp, str | None]] = {}
        self._keys: frozenset[str] = frozenset()
        self._revoked: set[str] = set()
        self._looked_at = 0.0
        self._unlisted = False
        self._refused: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        with self._lock:
            self._look()

    def _look(self) -> None:
        """Bring the keys in step with the directory; log and queue each key no longer there (hold the lock)."""
        listing = _listing(self.directory)
        self._looked_at = time.monotonic()
        if listing is None and not self._unlisted:
            LOG.warning("curve: allowed clients directory %s cannot be listed: every client is refused until it can",
                        self.directory)
        self._unlisted = listing is None
        files = {}
        for name, stamp in (listing or {}).items():
            known = self._files.get(name)
            if known is not None and known[0] == stamp:
                files[name] = known
            else:
                files[name] = (stamp, self._read_key(name, previous=None if known is None else known[1]))
        keys = frozenset(key for _, key in files.values() if key is not None)
        for key in sorted(self._keys - keys):
            LOG.warning("curve: client key %s removed from %s: refused from now on", key, self.directory)
        self._revoked = (self._revoked | (self._keys - keys)) - keys
        self._files, self._keys = files, keys

    def _read_key(self, name: str, *, previous: str | None) -> str | None:
        """The key in file ``name``; when it cannot be read, a warning and ``previous`` (what the file held)."""
        try:
            public, _ = _read_pair(self.directory / name, what="allowed client key", need_secret=False)
        except CurveKeyError as err:
            LOG.warning("curve: %s; %s", err, "ignored until it is fixed" if previous is None
                        else f"its key {previous} stays allowed until the file is fixed or removed")
            return previous
        return public.decode("ascii")

    def _look_if_stale(self) -> None:
        if time.monotonic() - self._looked_at >= self.poll_s:
            self._look()

    def refresh(self) -> None:
        """Look at the directory now."""
        with self._lock:
            self._look()

    def is_allowed(self, key: str | bytes) -> bool:
        """Whether the z85 public ``key`` is allowed, as of a look at most ``poll_s`` old (cheap enough per message)."""
        text = key.decode("ascii", "replace") if isinstance(key, bytes) else key
        with self._lock:
            self._look_if_stale()
            return text in self._keys

    def take_revoked(self) -> set[str]:
        """The z85 keys removed from the directory since the last call and not allowed again since, each once (as
        of a look at most ``poll_s`` old)."""
        with self._lock:
            self._look_if_stale()
            revoked, self._revoked = self._revoked, set()
            return revoked

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's ZAP credentials hook: True when ``key`` (z85) is in the directory now; a refusal is counted, and
        logged once per key."""
        text = key.decode("ascii", "replace")[:Z85_KEY_CHARS]
        with self._lock:
            self._look()
            if text in self._keys:
                return True
            self._refused[text] += 1
            if len(self._logged) >= REFUSED_KEYS_REMEMBERED:
                self._logged.clear()
            if text not in self._logged:
                self._logged.add(text)
                LOG.warning("refused a CURVE client with public key %s: not in %s (add its .key file there to "
                            "allow it)", text, self.directory)
            return False

    def refusals(self) -> tuple[int, int]:
        """(connection attempts refused, distinct keys refused) so far."""
        with self._lock:
            return sum(self._refused.values()), len(self._refused)

    def start(self) -> None:
        """Start the watcher thread (once)."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="curve-allow-list", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.refresh()

    def stop(self) -> None:
        """Stop the watcher thread (idempotent)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)


HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
"""Monitor events of a CURVE server socket whose peer did not complete the handshake: a client without keys
(plaintext) or with the wrong server key. Refused keys arrive through ZAP instead (EVENT_HANDSHAKE_FAILED_AUTH)."""
WATCH_POLL_MS = 100
FAILURE_LOG_INTERVAL_S = 60.0
"""Handshake failures are logged at most once per socket per this many seconds (a plaintext client retries)."""


class ZapGuard:
    """The ZAP authenticator of one context: every CURVE server socket of that context asks it about each client.

    ``watch`` adds a server socket's handshake failures (clients without keys, or with the wrong server key) to
    the count. ``is_allowed`` and ``take_revoked`` are its ``AllowList``'s, for a server that drops hosts whose key
    was removed. Use as a context manager around the sockets' life, and stop it before the context terminates.
    """

    def __init__(self, context: zmq.Context, curve: ServerCurve, *, poll_s: float = ALLOW_LIST_POLL_S) -> None:
        self.allow_list = AllowList(curve.allowed_clients, poll_s=poll_s)
        """The allowed keys, watched (its thread runs from here until ``stop``)."""
        self.allow_list.start()
        self.authenticator = ThreadAuthenticator(context, log=logging.getLogger("sluice.protocol.zap"))
        self.authenticator.start()
        self.authenticator.configure_curve_callback(domain="*", credentials_provider=self.allow_list)
        self.handshake_failures: Counter[str] = Counter()
        self._lock = threading.Lock()
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
        with self._lock:
            self.handshake_failures[name] += 1
            count = self.handshake_failures[name]
        now = time.monotonic()
        if now - self._last_logged.get(name, -FAILURE_LOG_INTERVAL_S) >= FAILURE_LOG_INTERVAL_S:
            self._last_logged[name] = now
            LOG.warning("%s socket: a client failed the CURVE handshake (no keys, or not this server's public key); "
                        "%d so far", name, count)

    def is_allowed(self, key: str | bytes) -> bool:
        """Whether the z85 public ``key`` (a message's ``User-Id``) is allowed now (``AllowList.is_allowed``)."""
        return self.allow_list.is_allowed(key)

    def take_revoked(self) -> set[str]:
        """The z85 keys removed from the allowed directory since the last call (``AllowList.take_revoked``)."""
        return self.allow_list.take_revoked()

    def refused(self) -> int:
        """Connection attempts refused so far: keys not allowed, and clients that failed the handshake."""
        with self._lock:
            failures = sum(self.handshake_failures.values())
        return self.allow_list.refusals()[0] + failures

    def refused_keys(self) -> int:
        """Distinct public keys refused so far."""
        return self.allow_list.refusals()[1]

    def stop(self) -> None:
        """Stop the monitor reader, the allow-list watcher and the authenticator thread, close the monitors
        (idempotent)."""
        self._stop.set()
        self.allow_list.stop()
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
