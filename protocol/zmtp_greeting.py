"""Which security mechanism a ZeroMQ peer speaks, read from its ZMTP 3 greeting.

When a CURVE client meets a server without CURVE, libzmq reports either a mechanism mismatch or, depending on which
side writes first, only a connection the peer closed (EPIPE): the same event a CURVE server gives a client that holds
the wrong server key. The greeting tells them apart: each side sends 64 bytes (signature, version, mechanism name)
before any handshake (RFC 23, ZMTP 3.0). A probe sends only the signature and major version, as libzmq itself does
first; the server answers with its whole greeting (sent whole, a greeting that names another mechanism makes libzmq
close the connection before it answers).
"""

from __future__ import annotations

import socket

from protocol.endpoints import Endpoint

GREETING_BYTES = 64
_SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
_MECHANISM = slice(12, 32)
_OPENING = _SIGNATURE + bytes([3])
"""The signature and major version 3: what a ZMTP 3 peer sends before it reads the other side's."""


def peer_mechanism(endpoint: Endpoint, timeout_s: float = 2.0) -> str | None:
    """The mechanism name (``"NULL"``, ``"PLAIN"``, ``"CURVE"``) the ZeroMQ peer at ``endpoint`` announces, or None
    when it cannot be read (not TCP, nothing listening, not ZMTP 3, no answer within ``timeout_s``)."""
    if endpoint.scheme != "tcp" or endpoint.port is None:
        return None
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s) as conn:
            conn.sendall(_OPENING)
            greeting = b""
            while len(greeting) < GREETING_BYTES:
                chunk = conn.recv(GREETING_BYTES - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except OSError:
        return None
    return parse_mechanism(greeting)


def parse_mechanism(greeting: bytes) -> str | None:
    """The mechanism of a ZMTP 3 greeting's first 32 bytes, or None when they are not one."""
    if len(greeting) < _MECHANISM.stop or greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
        return None
    name = greeting[_MECHANISM].rstrip(b"\x00")
    if not name or not name.isalnum() or not name.isascii():
        return None
    return name.decode("ascii")
