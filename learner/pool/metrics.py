"""The opponent pool's Prometheus metrics (``sluice_pool_*``): requests by type, their duration, refusals by
reason, snapshot bytes sent, and the pool's size. The standalone pool server (``python -m learner.pool.server
--metrics-port``) serves them; inside the learner they go on the learner's registry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from telemetry.buckets import SHORT_SECONDS

REQUEST_TYPES = ("get_opponents", "get_snapshot")


class PoolMetrics:
    """Every pool metric, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("sluice_pool_requests", "Pool requests answered, by type.", ["type"],
                                registry=registry)
        self.rejected = Counter("sluice_pool_rejected", "Pool requests refused, by reason.", ["reason"],
                                registry=registry)
        self.sent_bytes = Counter("sluice_pool_sent_bytes", "Snapshot file bytes sent to actor hosts.",
                                  registry=registry)
        self.duration = Histogram("sluice_pool_request_duration_seconds", "Seconds to answer one pool request.",
                                  ["type"], buckets=SHORT_SECONDS, registry=registry)
        self.snapshots = Gauge("sluice_pool_snapshots", "Snapshots in the opponent pool.", registry=registry)
        for kind in REQUEST_TYPES:
            self.requests.labels(kind)
            self.duration.labels(kind)

    def watch_size(self, size: Callable[[], int]) -> None:
        """Read the pool's size from ``size`` at every scrape."""
        self.snapshots.set_function(lambda: float(size()))

    def answered(self, kind: str, *, seconds: float, sent_bytes: int) -> None:
        """A request of type ``kind`` was answered in ``seconds``, with ``sent_bytes`` of snapshot data."""
        self.requests.labels(kind).inc()
        self.duration.labels(kind).observe(seconds)
        if sent_bytes:
            self.sent_bytes.inc(sent_bytes)

    def refused(self, reason: str) -> None:
        """A request was refused with ``reason``."""
        self.rejected.labels(reason).inc()
