"""The HTTP endpoint of one process: ``/metrics`` (prometheus-client's WSGI app over the process's registry) and
optional JSON routes beside it (the learner serves its actor hosts' metrics addresses at
``/discovery/actor_hosts`` for Prometheus' HTTP service discovery).

Served by a small threaded WSGI server in a daemon thread; ``MetricsEndpoint.close`` stops it. Binding is
loopback by default everywhere: the endpoint is plain HTTP without authentication, so a wider address is the
user's explicit choice (``is_loopback`` tells the callers when to warn).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

JsonRoute = Callable[[], Any]
"""A route's handler: returns what the route answers, encoded as JSON."""
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")
"""Bind addresses that mean every interface of the machine."""


class MetricsBindError(OSError):
    """The metrics endpoint cannot bind the address asked for; the message names it and the setting to change."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """``host`` as it goes in a URL or a Prometheus target (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr for every scrape."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        return


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per request, never waited for at exit."""

    daemon_threads = True
    address_family = socket.AF_INET


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def _app(registry: CollectorRegistry, routes: Mapping[str, JsonRoute]) -> Callable[..., Iterable[bytes]]:
    """WSGI app: the JSON routes by exact path, everything else prometheus-client's exposition (which answers
    /metrics and / alike, with gzip and OpenMetrics when asked)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return metrics(environ, start_response)
        body = json.dumps(route()).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    return app


class MetricsEndpoint:
    """A bound, serving metrics endpoint; ``address`` is ``host:port`` with the port actually bound."""

    def __init__(self, *, host: str, port: int, registry: CollectorRegistry,
                 routes: Mapping[str, JsonRoute] | None = None, setting: str) -> None:
        """Bind ``host:port`` (port 0: a free one) and start serving; MetricsBindError names ``setting`` (the
        option or config key that chooses the port) when the address cannot be bound."""
        bind_host = "0.0.0.0" if host in ("", "*") else host
        server_class = _ThreadingServer6 if ":" in bind_host else _ThreadingServer
        try:
            self.server = make_server(bind_host, port, _app(registry, routes or {}), server_class=server_class,
                                      handler_class=_QuietHandler)
        except OSError as err:
            raise MetricsBindError(f"cannot bind the Prometheus endpoint at {url_host(bind_host)}:{port}: "
                                   f"{err.strerror or err} (choose another port with {setting}; 0 takes a free "
                                   "one)") from err
        self.host = bind_host
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="metrics-http", daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        """``host:port`` as bound (a Prometheus target; the host may be a wildcard)."""
        return f"{url_host(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        """The /metrics URL (a wildcard bind shown as loopback, where it can be read from this machine)."""
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else url_host(self.host)
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
