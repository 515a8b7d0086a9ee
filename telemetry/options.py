"""The ``--metrics-host`` and ``--metrics-port`` options of the processes started from the command line (actor
hosts and the standalone pool server; the learner takes network.metrics_host/metrics_port from its config)."""

from __future__ import annotations

import argparse

LOOPBACK = "127.0.0.1"


def add_metrics_options(parser: argparse.ArgumentParser, *, port_default: int | None, port_help: str) -> None:
    """Add ``--metrics-port`` (``port_help`` says what its default means) and ``--metrics-host`` (loopback)."""
    group = parser.add_argument_group("monitoring (Prometheus /metrics: plain HTTP, no authentication)")
    group.add_argument("--metrics-port", type=int, default=port_default, metavar="PORT", help=port_help)
    group.add_argument("--metrics-host", default=LOOPBACK, metavar="ADDR",
                       help=f"address /metrics binds (default {LOOPBACK}; 0.0.0.0 or this machine's address for a "
                            "Prometheus on another machine)")


def metrics_port_error(port: int) -> str | None:
    """What is wrong with a ``--metrics-port`` value (None: a port number, 0 meaning a free one)."""
    if 0 <= port <= 65535:
        return None
    return f"--metrics-port must be a port number in 0..65535 (0: a free port), got {port}"
