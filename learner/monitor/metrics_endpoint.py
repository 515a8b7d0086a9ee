"""The learner's HTTP endpoint for Prometheus: /metrics, and the actor hosts' metrics addresses at DISCOVERY_PATH
(Prometheus HTTP service discovery), so one scrape config finds every process of a run."""

from __future__ import annotations

from collections.abc import Callable

from configs.schema import NetworkSection
from learner.monitor.prometheus_metrics import LearnerMetrics
from learner.serve.addresses import AddressError, metrics_port
from telemetry.exporter import WILDCARD_HOSTS, MetricsBindError, MetricsEndpoint, is_loopback

DISCOVERY_PATH = "/discovery/actor_hosts"
"""Where the learner's metrics endpoint lists its actor hosts' metrics addresses (Prometheus HTTP SD)."""


def open_metrics_endpoint(network: NetworkSection, prometheus: LearnerMetrics, *,
                          host_targets: Callable[[], object]) -> MetricsEndpoint:
    """Serve ``prometheus``' registry at network.metrics_host:metrics_port and ``host_targets`` (the control server's
    discovery list) at DISCOVERY_PATH; AddressError naming the setting when the port cannot be bound."""
    try:
        return MetricsEndpoint(host=network.metrics_host, port=metrics_port(network), registry=prometheus.registry,
                               routes={DISCOVERY_PATH: host_targets}, setting="--set network.metrics_port=PORT")
    except MetricsBindError as err:
        raise AddressError(str(err)) from err


def announce_metrics(endpoint: MetricsEndpoint) -> None:
    """Say where Prometheus finds the learner and its hosts, with a warning when that is beyond loopback."""
    print(f"learner: Prometheus metrics at {endpoint.url} (actor hosts: "
          f"{endpoint.url.removesuffix('/metrics')}{DISCOVERY_PATH})", flush=True)
    if endpoint.host in WILDCARD_HOSTS or not is_loopback(endpoint.host):
        print(f"learner: warning: /metrics and host discovery bind {endpoint.address}, beyond loopback: plain "
              "HTTP without authentication, readable by anyone who reaches that address", flush=True)
