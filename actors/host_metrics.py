"""An actor host's Prometheus metrics (``sluice_actor_*``), served at ``/metrics`` on ``--metrics-port``.

The host's loop feeds them at two points: ``rows_shipped`` with every ROWS message (the counts and seconds its
``RowsReport`` carries, and the message's size) and ``step_timed`` after every inference step (its seconds, the
forward pass's and the batch size reached). The inference steps' three figures wait in a small array and reach
their histograms with the next message (``BulkHistogram``: one count per array, not a Python call per value). What
the host holds now (policy version, workers, rows waiting, groups waiting for actions, worker restarts) is read from
the ``HostView`` when Prometheus scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.rows_report import RowsReport
from telemetry.buckets import MESSAGE_BYTES, SHORT_SECONDS
from telemetry.bulk_histogram import BulkHistogram

BATCH_AGENTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PENDING_STEPS = 1024
"""Inference steps whose figures wait to be counted at most (then they are counted at once)."""
COUNT_STEPS_EVERY_S = 1.0
"""Waiting inference steps are counted with the first message this long after they were last counted (counting
costs about 30 us, a few percent of a small-observation host's time at one count per message)."""


@dataclass(frozen=True, kw_only=True)
class HostView:
    """What the running host holds now, as read at a scrape."""

    policy_version: int
    """Version of the weights the inference step uses."""
    workers: int
    """Env worker processes."""
    worker_restarts: int
    """Times a worker process died and was respawned, since the host was built."""
    rows_waiting: int
    """Full rows in the assembler, not yet shipped (back-pressure shows here)."""
    ready_groups: int
    """Env groups that stepped and wait for actions."""


class _HostViewCollector(Collector):
    """Gauges (and the restart counter) read from the current host's ``HostView`` at each scrape."""

    GAUGES = {
        "policy_version": ("sluice_actor_policy_version", "Version of the weights this host acts with."),
        "workers": ("sluice_actor_workers", "Env worker processes on this host."),
        "rows_waiting": ("sluice_actor_rows_waiting", "Full rows in the assembler waiting to be shipped."),
        "ready_groups": ("sluice_actor_ready_groups", "Env groups that stepped and wait for actions."),
    }

    def __init__(self, registry: CollectorRegistry) -> None:
        self.read: Callable[[], HostView | None] = lambda: None
        self.restarts_before = 0
        """Worker restarts of hosts built before the current one (a config change rebuilds the host)."""
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        view = self.read()
        for field, (name, doc) in self.GAUGES.items():
            family = GaugeMetricFamily(name, doc)
            if view is not None:
                family.add_metric([], getattr(view, field))
            yield family
        restarts = CounterMetricFamily("sluice_actor_worker_restarts", "Env worker processes that died and were "
                                                                       "respawned.")
        restarts.add_metric([], self.restarts_before + (view.worker_restarts if view is not None else 0))
        yield restarts

    def describe(self) -> Iterator[Metric]:
        yield from (GaugeMetricFamily(name, doc) for name, doc in self.GAUGES.values())
        yield CounterMetricFamily("sluice_actor_worker_restarts", "")


class HostMetrics:
    """Every actor host metric, on ``registry`` (from ``telemetry.registry.new_registry("actor_host")``)."""

    def __init__(self, registry: CollectorRegistry, *, count_steps_every_s: float = COUNT_STEPS_EVERY_S) -> None:
        """``count_steps_every_s``: how long inference steps' figures may wait for a message to count them."""
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, registry=registry)

        self.registry = registry
        self.env_steps = counter("sluice_actor_env_steps", "Env steps this host took (one env, all its agents).")
        self.agent_steps = counter("sluice_actor_agent_steps", "Agent steps this host recorded.")
        self.episodes = counter("sluice_actor_episodes", "Episodes that ended on this host.")
        self.rows_sent = counter("sluice_actor_rows_sent", "Rows shipped to the learner.")
        self.sent_bytes = counter("sluice_actor_sent_bytes", "Bytes of ROWS messages shipped to the learner.")
        self.env_restarts = counter("sluice_actor_env_restarts", "Env groups that raised and were rebuilt.")
        self.worker_wait = counter("sluice_actor_worker_wait_seconds", "Seconds env workers waited for actions "
                                                                       "(all workers summed).")
        self.worker_step = counter("sluice_actor_worker_step_seconds", "Seconds env workers spent stepping their "
                                                                       "envs (all workers summed).")
        self.send_blocked = counter("sluice_actor_send_blocked", "Times rows were due but the data socket was full "
                                                                 "(the learner's back-pressure).")
        self.registrations = counter("sluice_actor_registrations", "Registrations with the learner.")
        self.last_ack = Gauge("sluice_actor_last_heartbeat_ack_timestamp_seconds", "Unix time the learner last "
                                                                                   "answered this host.",
                              registry=registry)
        self.inference_step = BulkHistogram("sluice_actor_inference_step_seconds", "Seconds of one inference step "
                                            "(gather, policy, record in the assembler).", buckets=SHORT_SECONDS,
                                            registry=registry)
        self.forward_pass = BulkHistogram("sluice_actor_forward_pass_seconds", "Seconds of one policy forward pass "
                                          "(sampling included).", buckets=SHORT_SECONDS, registry=registry)
        self.batch_agents = BulkHistogram("sluice_actor_inference_batch_agents", "Agents decided for in one "
                                          "forward pass.", buckets=BATCH_AGENTS_BUCKETS, registry=registry)
        self.pending = np.zeros((PENDING_STEPS, 3))
        """Each inference step's (seconds, forward-pass seconds, agents) since they were last counted."""
        self.pending_steps = 0
        self.count_steps_every_s = count_steps_every_s
        self.counted_at = time.monotonic()
        """When the waiting steps were last counted (time.monotonic)."""
        self.message_bytes = Histogram("sluice_actor_message_bytes", "Size of each ROWS message shipped.",
                                       buckets=MESSAGE_BYTES, registry=registry)
        self.view = _HostViewCollector(registry)

    def attach(self, read: Callable[[], HostView]) -> None:
        """Read the host's state from ``read`` from now on (a rebuilt host attaches itself again; the worker
        restarts of the one before stay counted)."""
        previous = self.view.read()
        if previous is not None:
            self.view.restarts_before += previous.worker_restarts
        self.view.read = read

    def registered(self) -> None:
        """The learner accepted a registration."""
        self.registrations.inc()
        self.learner_answered()

    def learner_answered(self) -> None:
        """A reply came on the control socket."""
        self.last_ack.set(time.time())

    def step_timed(self, *, step_s: float, forward_s: float, agents: int) -> None:
        """One inference step took ``step_s`` seconds, its forward pass ``forward_s``, for ``agents`` agents (counted
        with a message ``count_steps_every_s`` after the last count, or once ``PENDING_STEPS`` wait)."""
        self.pending[self.pending_steps] = step_s, forward_s, agents
        self.pending_steps += 1
        if self.pending_steps == PENDING_STEPS:
            self.count_steps()

    def count_steps(self) -> None:
        """Count the waiting inference steps' figures in their histograms."""
        steps = self.pending[:self.pending_steps]
        for column, histogram in enumerate((self.inference_step, self.forward_pass, self.batch_agents)):
            histogram.observe_many(steps[:, column])
        self.pending_steps = 0
        self.counted_at = time.monotonic()

    def rows_shipped(self, report: RowsReport, *, rows: int, nbytes: int) -> None:
        """A ROWS message of ``rows`` rows and ``nbytes`` bytes went out with ``report``."""
        self.env_steps.inc(report.env_steps)
        self.agent_steps.inc(report.agent_steps)
        self.episodes.inc(len(report.returns))
        self.env_restarts.inc(report.env_restarts)
        self.worker_wait.inc(report.worker_wait_s)
        self.worker_step.inc(report.worker_step_s)
        self.rows_sent.inc(rows)
        self.sent_bytes.inc(nbytes)
        self.message_bytes.observe(nbytes)
        if time.monotonic() - self.counted_at >= self.count_steps_every_s:
            self.count_steps()
