"""The learner's Prometheus metrics (``sluice_*``), served at ``/metrics`` on network.metrics_port.

The run's counts (steps, episodes, rows and messages received and dropped, hosts registered, lost and failed,
CURVE refusals) are read from the ingest and the control server when Prometheus scrapes (``RunCounts``), so
they move even while no update happens; a resumed run's step counters start from its checkpoint's totals, so
``sluice_agent_steps_total`` is the run's progress. ``observe_update`` records each update (its duration, the
algorithm's metrics, its skipped steps and the rows it dropped as non-finite); the ingest thread feeds the
per-message histograms directly (``IngestObserver``). Steps per second is ``rate(sluice_agent_steps_total[1m])``,
never a gauge. Labels are of low cardinality only: a drop reason, a host name, a request type.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from learner.serve.control import ControlCounts
from learner.monitor.health import ValueHealth
from learner.serve.ingest_counters import IngestTotals
from telemetry.buckets import MESSAGE_BYTES
from telemetry.bulk_histogram import BulkHistogram

UPDATE_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
ROW_DROP_REASONS = ("stale", "future")
COMMON_DROP_REASONS = ("not_registered", "identity_mismatch", "too_large", "bad_field", "non_finite", "absurd_value",
                       "bad_action", "bad_flag", "unexpected_type", "host_left", "bad_shared")
"""Drop reasons whose counters exist at 0 from the start (others appear when first counted), so rate() over
them works before the first drop."""
UPDATE_GAUGES = {
    "policy_loss": ("sluice_policy_loss", "Policy (clipped surrogate) loss of the last update."),
    "value_loss": ("sluice_value_loss", "Value loss of the last update."),
    "entropy": ("sluice_entropy", "Mean policy entropy of the last update."),
    "approx_kl": ("sluice_approx_kl", "Approximate KL between behaviour and updated policy (last update)."),
    "clipfrac": ("sluice_clip_fraction_ratio", "Fraction of samples whose ratio was clipped (last update)."),
    "explained_variance": ("sluice_explained_variance_ratio", "Explained variance of the value function."),
    "learning_rate": ("sluice_learning_rate", "Learning rate of the last update."),
    "grad_norm": ("sluice_grad_norm", "Mean gradient norm before clipping (last update)."),
    "first_layer_frozen_frac": ("sluice_first_layer_frozen_ratio", "Fraction of the policy's first-layer "
                                "activations that did not vary over the batch's observations (last update)."),
    "critic_loss": ("sluice_coma_critic_loss", "COMA: mean TD loss of the centralised critic (last update)."),
    "q_mean": ("sluice_coma_q_mean", "COMA: mean Q(s, u) of the replayed transitions (last update)."),
    "action_std": ("sluice_coma_action_std", "COMA: mean pre-tanh standard deviation of the actors (last update)."),
    "buffer_fill": ("sluice_coma_replay_fill_ratio", "COMA: replay buffer fill, stored / capacity."),
}
"""Algorithm metrics (as ``Algorithm.update`` names them) exported as gauges of the last update."""


class RunCounts(Collector):
    """The counters read at every scrape from the ingest's and the control server's cumulative counts (and the
    CURVE refusals), and the gauges that go with them: they move while no update happens (every row dropped,
    the last host lost), when an alert needs them most."""

    def __init__(self, *, ingest: Callable[[], IngestTotals], control: Callable[[], ControlCounts],
                 clients_refused: Callable[[], int], ingest_fill: Callable[[], Mapping[str, float]],
                 host_heartbeats: Callable[[], Mapping[str, float]]) -> None:
        self.ingest, self.control, self.clients_refused = ingest, control, clients_refused
        self.ingest_fill, self.host_heartbeats = ingest_fill, host_heartbeats

    @classmethod
    def empty(cls) -> "RunCounts":
        """Counts of a learner that has seen nothing (what a process exports before anything happens; tests)."""
        totals = IngestTotals(env_steps=0, agent_steps=0, episodes=0, env_restarts=0, rows_received=0,
                              rows_dropped={}, messages_dropped={}, bytes_received=0)
        hosts = ControlCounts(actor_hosts=0, actor_hosts_lost=0, actor_hosts_failed=0, rejected_by_reason={})
        return cls(ingest=lambda: totals, control=lambda: hosts, clients_refused=lambda: 0,
                   ingest_fill=lambda: {"filling": 0.0, "ready": 0.0}, host_heartbeats=dict)

    def collect(self) -> Iterator[Metric]:
        totals, hosts = self.ingest(), self.control()
        yield _counter("sluice_env_steps", "Env steps reported by actor hosts (one env, all its agents).",
                       totals.env_steps)
        yield _counter("sluice_agent_steps", "Agent steps reported by actor hosts (what trainer.total_timesteps "
                                             "counts).", totals.agent_steps)
        yield _counter("sluice_episodes", "Episodes finished.", totals.episodes)
        yield _counter("sluice_rows_received", "Rows accepted into a batch.", totals.rows_received)
        yield _counter("sluice_rows_dropped", "Rows dropped: stale (older than max_policy_lag) or future (newer than "
                                              "the learner's weights).",
                       {**dict.fromkeys(ROW_DROP_REASONS, 0), **totals.rows_dropped}, label="reason")
        yield _counter("sluice_messages_dropped", "ROWS messages rejected, by reason.",
                       {**dict.fromkeys(COMMON_DROP_REASONS, 0), **totals.messages_dropped}, label="reason")
        yield _counter("sluice_received_bytes", "Bytes of ROWS messages received (accepted or not).",
                       totals.bytes_received)
        yield _counter("sluice_env_restarts", "Env groups that raised and were rebuilt on actor hosts.",
                       totals.env_restarts)
        yield _counter("sluice_control_rejected", "Control messages refused, by reason.", hosts.rejected_by_reason,
                       label="reason")
        yield _counter("sluice_actor_host_registrations", "Actor host registrations accepted.", hosts.registrations)
        yield _counter("sluice_actor_hosts_lost", "Actor hosts forgotten after network.peer_timeout_s of silence.",
                       hosts.actor_hosts_lost)
        yield _counter("sluice_actor_hosts_failed", "Actor hosts that left naming a failure.",
                       hosts.actor_hosts_failed)
        yield _counter("sluice_clients_refused", "CURVE connections refused (unknown key, no key, wrong server "
                                                 "key).", self.clients_refused())
        yield _gauges("sluice_actor_hosts", "Actor hosts registered and alive.", hosts.actor_hosts)
        yield _gauges("sluice_ingest_batches", "Learner batch buffers by state (filling: rows in the one being "
                                               "filled, as a fraction; ready: filled, waiting for the trainer).",
                      self.ingest_fill(), label="state")
        yield _gauges("sluice_actor_host_last_heartbeat_timestamp_seconds", "Unix time each registered actor host "
                      "was last heard from.", self.host_heartbeats(), label="host")

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def _family(kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, documentation: str,
            value: float | Mapping[str, float], *, label: str | None = None) -> Metric:
    """A counter or gauge family (``kind``): one value, or one per value of ``label``."""
    if label is None:
        return kind(name, documentation, value=value)
    family = kind(name, documentation, labels=[label])
    for key, number in sorted(value.items()):
        family.add_metric([key], number)
    return family


def _counter(name: str, documentation: str, value: float | Mapping[str, float], *,
             label: str | None = None) -> Metric:
    return _family(CounterMetricFamily, name, documentation, value, label=label)


def _gauges(name: str, documentation: str, value: float | Mapping[str, float], *,
            label: str | None = None) -> Metric:
    return _family(GaugeMetricFamily, name, documentation, value, label=label)


class LearnerMetrics:
    """Every learner metric, on ``registry`` (from ``telemetry.registry.new_registry("learner")``); the counts
    read at scrape time are there once ``watch`` names where to read them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=registry)

        self.registry = registry
        self.updates = Counter("sluice_updates", "Learner updates done.", registry=registry)
        self.samples = Counter("sluice_samples", "Agent steps trained on (rows x bptt_horizon per update).",
                               registry=registry)
        self.skipped_steps = Counter("sluice_skipped_steps", "Optimizer steps skipped for a non-finite loss or "
                                                             "gradient.", registry=registry)
        self.rows_dropped_nonfinite = Counter("sluice_rows_dropped_nonfinite", "Rows an update left out because "
                                              "their advantage, return or start-of-update log-ratio was non-finite "
                                              "or exploding (learner/ppo/update.py).", registry=registry)
        self.message_bytes = Histogram("sluice_received_message_bytes", "Size of each ROWS message received.",
                                       buckets=MESSAGE_BYTES, registry=registry)
        self.policy_lag = BulkHistogram("sluice_policy_lag_versions", "Policy lag of each accepted row: the "
                                        "learner's version minus the version that acted.", buckets=LAG_BUCKETS,
                                        registry=registry)
        self.update_duration = Histogram("sluice_update_duration_seconds", "Seconds one learner update takes.",
                                         buckets=UPDATE_SECONDS_BUCKETS, registry=registry)
        self.policy_version = gauge("sluice_policy_version", "Version of the learner's current weights.")
        self.return_mean = gauge("sluice_episode_return_mean", "Mean return of the last 100 episodes.")
        self.length_mean = gauge("sluice_episode_length_mean", "Mean length of the last 100 episodes.")
        self.update_gauges = {key: gauge(name, doc) for key, (name, doc) in UPDATE_GAUGES.items()}
        self.max_policy_lag = gauge("sluice_max_policy_lag_versions", "trainer.max_policy_lag: rows older are "
                                                                      "dropped.")
        self.target_agent_steps = gauge("sluice_target_agent_steps", "trainer.total_timesteps: agent steps at "
                                                                     "which the run stops.")
        self.last_update = gauge("sluice_last_update_timestamp_seconds", "Unix time of the last update (the "
                                                                         "learner's start before the first).")
        self.value_low_streak = gauge("sluice_value_low_explained_variance_updates", "Consecutive updates with the "
                                      "value head's explained variance low while episode returns vary "
                                      "(learner/monitor/health.py).")
        self.value_stalled = gauge("sluice_value_stalled", "1 while the value-health warning is in force (explained "
                                                           "variance low for many updates, not recovered), else 0.")
        self.value_health_warnings = Counter("sluice_value_health_warnings", "Value-health warnings logged (each a "
                                             "stall of the value head that began).", registry=registry)
        self.outcomes = Gauge("sluice_selfplay_outcome_ratio", "Self-play: share of the last 100 episodes won, "
                                                               "drawn and lost against the pool.", ["outcome"],
                              registry=registry)
        self.eval_score = Gauge("sluice_eval_score", "Evaluation during training: the newest evaluated snapshot's "
                                "score against a baseline, (wins + draws / 2) / games.", ["baseline"],
                                registry=registry)
        self.eval_best_update = gauge("sluice_eval_best_update", "Evaluation during training: the update of the best "
                                                                 "snapshot so far (kept in <run dir>/best/).")
        self.rank_rows_wait = Gauge("sluice_learner_rank_rows_wait_seconds", "Several learner ranks: seconds each rank "
                                    "waited for its share of the last batch's rows.", ["rank"], registry=registry)
        self.rank_batch_fill = Gauge("sluice_learner_rank_batch_fill_ratio", "Several learner ranks: how full each "
                                     "rank's next batch is (updated while rank 0 waits for the others).", ["rank"],
                                     registry=registry)
        self.ranks_wait = gauge("sluice_learner_ranks_wait_seconds", "Several learner ranks: seconds rank 0 waited, "
                                                                     "its own batch full, for the other ranks' rows.")
        self.stalled = gauge("sluice_learner_stalled", "1 while the learner is stalled: actor hosts registered, yet no "
                             "update for run.stall_factor times the usual interval (learner/monitor/stall_watch.py), else 0.")
        self.seconds_since_update = gauge("sluice_learner_seconds_since_update", "Seconds since the last update, "
                                          "updated while the learner waits for a batch.")
        self.last_update.set(time.time())

    def observe_rank_waits(self, rows_wait_s: Mapping[int, float], followers_wait_s: float) -> None:
        """Several learner ranks, after each update: every rank's wait for its rows, and rank 0's for the others."""
        for rank, seconds in rows_wait_s.items():
            self.rank_rows_wait.labels(str(rank)).set(seconds)
        self.ranks_wait.set(followers_wait_s)

    def observe_rank_fills(self, fills: Mapping[int, float]) -> None:
        """Several learner ranks, while rank 0 waits: how full each follower's batch is."""
        for rank, fill in fills.items():
            self.rank_batch_fill.labels(str(rank)).set(fill)

    def observe_stall(self, *, stalled: bool, seconds_since_update: float) -> None:
        """While the learner waits for a batch, and after each update: the stall watch's state."""
        self.stalled.set(1.0 if stalled else 0.0)
        self.seconds_since_update.set(seconds_since_update)

    def set_run(self, *, max_policy_lag: int, total_agent_steps: int, policy_version: int) -> None:
        """The run's settings that alerts and dashboards compare against, and the version it starts from."""
        self.max_policy_lag.set(max_policy_lag)
        self.target_agent_steps.set(total_agent_steps)
        self.policy_version.set(policy_version)

    def watch(self, counts: RunCounts) -> None:
        """Read the run's cumulative counts from ``counts`` at every scrape (once, when the sockets are bound)."""
        self.registry.register(counts)

    def message_received(self, nbytes: int) -> None:
        """The ingest thread got one ROWS message of ``nbytes`` (accepted or not)."""
        self.message_bytes.observe(nbytes)

    def rows_accepted(self, lags: np.ndarray) -> None:
        """The ingest thread accepted rows with these policy lags."""
        self.policy_lag.observe_many(lags)

    def observe_update(self, *, record: Mapping[str, Any], update_metrics: Mapping[str, float], update_s: float,
                       samples: int) -> None:
        """After each update: ``record`` is its metrics.jsonl record (policy version, the last 100 episodes' means,
        self-play rates); ``samples`` the agent steps trained on."""
        self.updates.inc()
        self.samples.inc(samples)
        self.skipped_steps.inc(update_metrics.get("skipped_steps", 0.0))
        self.rows_dropped_nonfinite.inc(update_metrics.get("rows_dropped_nonfinite", 0.0))
        self.update_duration.observe(update_s)
        self.policy_version.set(record["policy_version"])
        _set_finite(self.return_mean, record.get("episode_return_mean"))
        _set_finite(self.length_mean, record.get("episode_length_mean"))
        for key, metric in self.update_gauges.items():
            _set_finite(metric, update_metrics.get(key))
        for outcome in ("win", "draw", "loss"):
            _set_finite(self.outcomes.labels(outcome), record.get(f"{outcome}_rate"))
        self.last_update.set(time.time())

    def observe_evaluation(self, figures: Mapping[str, float]) -> None:
        """An evaluation's figures (learner/monitor/evaluation_results.py: ``eval_score_<baseline>``, ``eval_best_update``)."""
        for key, value in figures.items():
            if key.startswith("eval_score_"):
                _set_finite(self.eval_score.labels(key.removeprefix("eval_score_")), value)
        _set_finite(self.eval_best_update, figures.get("eval_best_update"))

    def observe_value_health(self, health: ValueHealth) -> None:
        """After each update: the value-health check's state (learner/monitor/health.py)."""
        self.value_low_streak.set(health.low_streak)
        self.value_stalled.set(float(health.stalled))
        if health.warning is not None:
            self.value_health_warnings.inc()


def _set_finite(gauge: Gauge, value: float | None) -> None:
    """Set ``gauge`` to ``value`` unless there is none yet (None) or it is NaN/inf (the gauge keeps its last)."""
    if value is not None and math.isfinite(value):
        gauge.set(value)
