"""A Prometheus histogram that takes a whole array of observations at once.

prometheus-client's ``Histogram.observe`` takes one value per call; the learner's policy-lag histogram gets one
observation per accepted row, thousands a second, which arrive as one array per message. ``BulkHistogram``
counts an array with one ``searchsorted`` and ``bincount`` and exposes the same ``_bucket``/``_sum``/``_count``
series (cumulative ``le`` buckets, ``+Inf`` last) through a collector on the process's registry.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class BulkHistogram(Collector):
    """Cumulative counts of observations in buckets with upper bounds ``buckets`` (ascending, +Inf added)."""

    def __init__(self, name: str, documentation: str, *, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be strictly ascending, got {list(buckets)}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(bounds)
        self.lock = threading.Lock()
        self.counts = np.zeros(len(bounds), dtype=np.int64)
        """Observations per bucket, not cumulative: counts[i] fell in (bounds[i-1], bounds[i]]."""
        self.sum = 0.0
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        """Count every value of ``values`` (any shape); NaN values are ignored."""
        flat = np.asarray(values, dtype=np.float64).ravel()
        flat = flat[~np.isnan(flat)]
        if not len(flat):
            return
        per_bucket = np.bincount(np.searchsorted(self.bounds, flat, side="left"), minlength=len(self.bounds))
        with self.lock:
            self.counts += per_bucket[:len(self.bounds)]
            self.sum += float(flat.sum())

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            cumulative = np.cumsum(self.counts)
            total = self.sum
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], [(_bound_text(b), float(c)) for b, c in zip(self.bounds, cumulative)], total)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation)


def _bound_text(bound: float) -> str:
    """An ``le`` label value as prometheus-client writes it (``+Inf``, ``4.0``)."""
    return "+Inf" if bound == math.inf else repr(float(bound))
