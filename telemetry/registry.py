"""One Prometheus registry per process: ``sluice_build_info`` and the process, platform and GC collectors of
prometheus-client, on a registry of its own (never the library's global one, so two parts of a test process do
not collide)."""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import (CollectorRegistry, GCCollector, Gauge, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.metrics_core import Metric

ROLES = ("learner", "actor_host", "pool_server")
"""The kinds of Sluice process, as ``sluice_build_info``'s ``role`` label names them."""


def sluice_version() -> str:
    """The installed ``sluice`` package's version ('unknown' in a source tree that was never installed)."""
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def torch_version() -> str:
    """torch's version without importing it ('none' where it is not installed)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def new_registry(role: str) -> CollectorRegistry:
    """A registry with ``sluice_build_info{version,role,python,torch} 1`` and the process, platform and GC
    collectors; ValueError for a role not in ROLES."""
    if role not in ROLES:
        raise ValueError(f"unknown process role {role!r}; allowed: {', '.join(ROLES)}")
    disable_created_metrics()  # no *_created series beside every counter and histogram (process-wide setting)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Gauge("sluice_build_info", "Sluice build: always 1, the labels say which version and role.",
                 ["version", "role", "python", "torch"], registry=registry)
    info.labels(version=sluice_version(), role=role, python=platform.python_version(), torch=torch_version()).set(1)
    return registry


SAMPLE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", ""),
    "info": ("_info",),
}
"""The sample names a metric family of each type exposes, as suffixes of the family's name (default: the name)."""


def family_sample_names(family: Metric) -> set[str]:
    """Every sample name ``family`` can expose, whether or not it has samples yet (a labelled metric before its
    first labels has none)."""
    return {family.name + suffix for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}


def metric_names(registry: CollectorRegistry) -> set[str]:
    """The sample names the registry exports (counters with _total, histograms with _bucket/_sum/_count), what
    a PromQL query may name."""
    return {name for family in registry.collect() for name in family_sample_names(family)}
