"""``python -m learner --print-prometheus-config``: a Prometheus config that scrapes one run at its actual ports.

It is the shipped ``ops/prometheus/prometheus.yml`` (its jobs, intervals, alert rules and pool-server file) pointed at
the run's learner: its /metrics at network.metrics_host:metrics_port and its actor hosts through the learner's HTTP
service discovery route (``DISCOVERY_PATH``), every target labelled with the run.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from configs.schema import NetworkSection, RunConfig
from learner.monitor.metrics_endpoint import DISCOVERY_PATH
from learner.serve.addresses import metrics_port
from telemetry.exporter import WILDCARD_HOSTS, url_host


class ScrapeConfigError(ValueError):
    """The scrape config cannot be made (the shipped one is missing, the metrics port is chosen at start)."""


SHIPPED_SCRAPE_CONFIG = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "prometheus.yml"
"""The scrape config the printed one is made from (its jobs, intervals, rules)."""

WILDCARD_TARGETS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "::1"}
"""Where Prometheus on the learner's machine reaches a learner bound to every interface."""


def learner_metrics_target(network: NetworkSection) -> str:
    """host:port Prometheus scrapes the learner at; ScrapeConfigError for metrics_port 0 (known only at start)."""
    port = metrics_port(network)
    if port == 0:
        raise ScrapeConfigError("network.metrics_port is 0 (a free port chosen at start, unknown until then): give "
                                "the run a fixed one with --set network.metrics_port=PORT")
    host = WILDCARD_TARGETS.get(network.metrics_host, network.metrics_host)
    return f"{url_host(host)}:{port}"


def scrape_config(config: RunConfig, *, run: str, shipped: Path = SHIPPED_SCRAPE_CONFIG) -> dict[str, Any]:
    """``--print-prometheus-config``: the shipped ops/prometheus/prometheus.yml (its jobs, intervals, alert rules,
    pool-server file) pointed at ``config``'s learner: its /metrics at network.metrics_host:metrics_port, its actor
    hosts through the learner's HTTP service discovery route (DISCOVERY_PATH). Every target is labelled ``run``;
    each job's name carries the run (sluice_learner-<run>) while its ``job`` label stays the catalogue name the
    alerts and the Grafana dashboard query, so the scrape_configs of two runs go into one Prometheus config and the
    dashboard's run and instance variables keep them apart. Paths are made absolute (the file works anywhere)."""
    if not shipped.is_file():
        raise ScrapeConfigError(f"{shipped} not found: --print-prometheus-config builds on the source checkout's "
                                "ops/prometheus/ (install Sluice editable from a checkout)")
    document = yaml.safe_load(shipped.read_text())
    shipped_target = learner_metrics_target(NetworkSection())
    target = learner_metrics_target(config.network)
    base = shipped.parent
    result = copy.deepcopy(document)
    result["rule_files"] = [str(base / name) for name in document.get("rule_files", [])]
    jobs = []
    for job in document["scrape_configs"]:
        job = copy.deepcopy(job)
        name = job["job_name"]
        for static in job.get("static_configs", []):
            static["targets"] = [target if item == shipped_target else item for item in static["targets"]]
        for sd in job.get("http_sd_configs", []):
            if sd["url"] == f"http://{shipped_target}{DISCOVERY_PATH}":
                sd["url"] = f"http://{target}{DISCOVERY_PATH}"
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(base / file) for file in sd["files"]]
        job["job_name"] = f"{name}-{run}"
        job["relabel_configs"] = [*job.get("relabel_configs", []),
                                  {"target_label": "job", "replacement": name},
                                  {"target_label": "run", "replacement": run}]
        jobs.append(job)
    result["scrape_configs"] = jobs
    return result


def format_scrape_config(config: RunConfig, *, run: str, shipped: Path = SHIPPED_SCRAPE_CONFIG) -> str:
    """``scrape_config`` as YAML, after comment lines saying what it is and how to start Prometheus with it."""
    target = learner_metrics_target(config.network)
    header = [
        f"# Prometheus config for Sluice run {run!r}: the learner's metrics at {target}, its actor hosts through",
        f"# http://{target}{DISCOVERY_PATH}; made from {shipped}.",
        "# Save it, then: prometheus --config.file=FILE --storage.tsdb.path=DIR",
        "# Another run on the same Prometheus: append its scrape_configs (job names carry the run; the job labels",
        "# stay the ones the alerts and the Grafana dashboard query, its run and instance variables tell them apart).",
    ]
    if config.network.metrics_host in WILDCARD_HOSTS:
        header.append(f"# The learner binds every interface ({config.network.metrics_host or '*'}): from another "
                      f"machine, replace {target.rsplit(':', 1)[0]} with its address.")
    return "\n".join(header) + "\n" + yaml.safe_dump(scrape_config(config, run=run, shipped=shipped),
                                                     sort_keys=False)
