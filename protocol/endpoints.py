"""Parsing and describing ZeroMQ endpoints (``tcp://HOST:PORT``, ``ipc://PATH``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Endpoint", "is_loopback", "parse_endpoint"]

_HOST_RE = re.compile(r"^(\*|[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?)$")
_BARE_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.*-]+):\d+$")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost``, in 127.0.0.0/8 or ``::1`` (brackets allowed)."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True)
class Endpoint:
    """A parsed ZeroMQ endpoint.

    For ``tcp``, ``host`` is a hostname, IPv4/IPv6 address (IPv6 without
    brackets) or ``*`` (bind to all interfaces) and ``port`` is 1..65535. For
    ``ipc``, ``host`` is the socket path and ``port`` is ``None``.
    """

    scheme: Literal["tcp", "ipc"]
    host: str
    port: int | None = None

    @property
    def url(self) -> str:
        """The endpoint as ZeroMQ expects it, e.g. ``tcp://[::1]:5555``."""
        if self.scheme == "ipc":
            return f"ipc://{self.host}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Whether traffic stays on this machine (``ipc`` or a loopback host)."""
        return self.scheme == "ipc" or is_loopback(self.host)

    def with_port(self, port: int) -> "Endpoint":
        """A copy with another port (``ValueError`` for ``ipc`` or a bad port)."""
        if self.scheme != "tcp":
            raise ValueError(f"endpoint {self.url!r} is {self.scheme}, which has no port")
        _check_port(port, f"port {port!r}")
        return replace(self, port=port)

    def __str__(self) -> str:
        return self.url


def _check_port(port: object, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what} is not a valid TCP port: expected an integer 1..65535")


def parse_endpoint(text: str, what: str = "learner address") -> Endpoint:
    """Parse ``tcp://HOST:PORT`` or ``ipc://PATH`` into an :class:`Endpoint`.

    ``what`` names the value in error messages, which are ``ValueError`` s
    such as ``learner address 'foo' is not a ZeroMQ endpoint: expected
    tcp://HOST:PORT``.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} {text!r} is not a ZeroMQ endpoint: expected a string tcp://HOST:PORT")
    raw = text.strip()
    prefix = f"{what} {text!r} is not a ZeroMQ endpoint"
    scheme, sep, rest = raw.partition("://")
    if not sep:
        hint = f" (did you mean 'tcp://{raw}'?)" if _BARE_HOST_PORT_RE.match(raw) else ""
        raise ValueError(f"{prefix}: expected tcp://HOST:PORT{hint}")
    scheme = scheme.lower()
    if scheme == "ipc":
        if not rest or any(c.isspace() or c == "\0" for c in rest):
            raise ValueError(f"{prefix}: expected ipc://PATH with a non-empty path")
        return Endpoint("ipc", rest, None)
    if scheme != "tcp":
        raise ValueError(f"{prefix}: scheme {scheme!r} is not supported, expected tcp://HOST:PORT or ipc://PATH")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0 or rest[close + 1 : close + 2] != ":":
            raise ValueError(f"{prefix}: expected tcp://[IPv6]:PORT")
        host, port_text = rest[1:close], rest[close + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{prefix}: {host!r} is not an IPv6 address") from None
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise ValueError(f"{prefix}: missing port, expected tcp://HOST:PORT")
        if ":" in host:
            raise ValueError(f"{prefix}: IPv6 addresses need brackets, expected tcp://[ADDRESS]:PORT")
        if not host:
            raise ValueError(f"{prefix}: missing host, expected tcp://HOST:PORT")
        if not _HOST_RE.match(host):
            raise ValueError(f"{prefix}: {host!r} is not a valid host name or address")
    if not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"{prefix}: port {port_text!r} is not a number, expected tcp://HOST:PORT")
    port = int(port_text)
    _check_port(port, f"{prefix}: port {port}")
    return Endpoint("tcp", host, port)
