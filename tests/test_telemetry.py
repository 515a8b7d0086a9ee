"""The Prometheus pieces: the bulk histogram against NumPy, the endpoint's routes and bind errors, what each
process's registry exports and how it reads the run's counts, the scrape address a host's registration gives,
and the command-line errors of the metrics options."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from actors.host_metrics import PENDING_STEPS, HostMetrics, HostView
from actors.rows_report import RowsReport
from learner.serve.control import ControlCounts, scrape_target
from learner.serve.ingest_counters import IngestTotals
from learner.pool.metrics import PoolMetrics
from learner.monitor.prometheus_metrics import LearnerMetrics, RunCounts
from telemetry.bulk_histogram import BulkHistogram
from telemetry.exporter import MetricsBindError, MetricsEndpoint
from telemetry.registry import metric_names, new_registry
from tests.processes import REPO


def samples(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the registry exposes, parsed back from the text format Prometheus reads."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.floats(min_value=-5, max_value=200, allow_nan=False), max_size=300),
       chunks=st.integers(min_value=1, max_value=5))
def test_bulk_histogram_counts_like_numpy(values, chunks):
    bounds = [0, 1, 2, 4, 8, 64]
    registry = new_registry("learner")
    histogram = BulkHistogram("sluice_test_values", "test", buckets=bounds, registry=registry)
    for part in np.array_split(np.asarray(values, dtype=np.float64), chunks):
        histogram.observe_many(part)
    got = samples(registry)
    data = np.asarray(values, dtype=np.float64)
    for bound in [*bounds, math.inf]:
        label = "+Inf" if bound == math.inf else repr(float(bound))
        assert got[("sluice_test_values_bucket", (("le", label),))] == np.count_nonzero(data <= bound)
    assert got[("sluice_test_values_count", ())] == len(data)
    assert got[("sluice_test_values_sum", ())] == pytest.approx(data.sum(), abs=1e-6)


def test_bulk_histogram_ignores_nan_and_refuses_unsorted_buckets():
    registry = new_registry("learner")
    histogram = BulkHistogram("sluice_test_nan", "test", buckets=[1, 2], registry=registry)
    histogram.observe_many(np.array([np.nan, 1.5]))
    assert samples(registry)[("sluice_test_nan_count", ())] == 1
    with pytest.raises(ValueError, match="strictly ascending"):
        BulkHistogram("sluice_test_bad", "test", buckets=[2, 1], registry=registry)


def test_every_registry_has_build_info_and_process_metrics_and_no_created_series():
    for role in ("learner", "actor_host", "pool_server"):
        registry = new_registry(role)
        got = samples(registry)
        info = [labels for (name, labels) in got if name == "sluice_build_info"]
        assert len(info) == 1 and dict(info[0])["role"] == role and dict(info[0])["version"]
        assert "process_resident_memory_bytes" in metric_names(registry)
        assert not any(name.endswith("_created") for name, _ in got)
    with pytest.raises(ValueError, match="unknown process role 'gpu'; allowed: learner, actor_host, pool_server"):
        new_registry("gpu")


def test_the_endpoint_serves_metrics_and_json_routes_and_names_the_setting_when_the_port_is_taken():
    registry = new_registry("learner")
    endpoint = MetricsEndpoint(host="127.0.0.1", port=0, registry=registry,
                               routes={"/discovery/actor_hosts": lambda: [{"targets": ["127.0.0.1:1"]}]},
                               setting="--set network.metrics_port=PORT")
    try:
        with urllib.request.urlopen(endpoint.url, timeout=5) as reply:
            assert b"sluice_build_info{" in reply.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/discovery/actor_hosts", timeout=5) as reply:
            assert reply.headers["Content-Type"] == "application/json"
            assert json.loads(reply.read()) == [{"targets": ["127.0.0.1:1"]}]
        with pytest.raises(MetricsBindError) as error:
            MetricsEndpoint(host="127.0.0.1", port=endpoint.port, registry=registry, setting="--metrics-port PORT")
        assert str(error.value) == (f"cannot bind the Prometheus endpoint at 127.0.0.1:{endpoint.port}: Address "
                                    "already in use (choose another port with --metrics-port PORT; 0 takes a free "
                                    "one)")
    finally:
        endpoint.close()
    with socket.socket() as probe:  # closed: the port can be listened on again (as a restarted learner would)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", endpoint.port))
        probe.listen()


def test_learner_counts_are_read_at_scrape_time_so_drops_show_while_no_update_happens():
    totals = {"value": IngestTotals(env_steps=10, agent_steps=20, episodes=1, env_restarts=0, rows_received=5,
                                    rows_dropped={"stale": 3}, messages_dropped={"not_registered": 2},
                                    bytes_received=999)}
    hosts = ControlCounts(actor_hosts=2, actor_hosts_lost=1, actor_hosts_failed=0, rejected_by_reason={"bad": 4},
                          registrations=3)
    registry = new_registry("learner")
    metrics = LearnerMetrics(registry)
    metrics.watch(RunCounts(ingest=lambda: totals["value"], control=lambda: hosts, clients_refused=lambda: 7,
                            ingest_fill=lambda: {"filling": 0.5, "ready": 1.0},
                            host_heartbeats=lambda: {"box:1": 1234.5}))
    got = samples(registry)
    assert got[("sluice_agent_steps_total", ())] == 20
    assert got[("sluice_rows_dropped_total", (("reason", "stale"),))] == 3
    assert got[("sluice_rows_dropped_total", (("reason", "future"),))] == 0  # there before the first drop
    assert got[("sluice_messages_dropped_total", (("reason", "not_registered"),))] == 2
    assert got[("sluice_messages_dropped_total", (("reason", "non_finite"),))] == 0
    assert got[("sluice_control_rejected_total", (("reason", "bad"),))] == 4
    assert got[("sluice_actor_hosts_lost_total", ())] == 1 and got[("sluice_actor_hosts", ())] == 2
    assert got[("sluice_actor_host_registrations_total", ())] == 3
    assert got[("sluice_clients_refused_total", ())] == 7
    assert got[("sluice_received_bytes_total", ())] == 999
    assert got[("sluice_ingest_batches", (("state", "filling"),))] == 0.5
    assert got[("sluice_actor_host_last_heartbeat_timestamp_seconds", (("host", "box:1"),))] == 1234.5
    totals["value"] = IngestTotals(env_steps=10, agent_steps=20, episodes=1, env_restarts=0, rows_received=5,
                                   rows_dropped={"stale": 50}, messages_dropped={}, bytes_received=999)
    assert samples(registry)[("sluice_rows_dropped_total", (("reason", "stale"),))] == 50  # no update in between


def test_an_update_sets_the_algorithm_gauges_and_skips_non_finite_values():
    registry = new_registry("learner")
    metrics = LearnerMetrics(registry)
    metrics.set_run(max_policy_lag=8, total_agent_steps=1000, policy_version=5)
    record = {"policy_version": 6, "episode_return_mean": 12.5, "episode_length_mean": None, "win_rate": 0.25}
    metrics.observe_update(record=record, update_s=0.3, samples=512,
                           update_metrics={"policy_loss": -0.1, "clipfrac": 0.2, "explained_variance": float("nan"),
                                           "skipped_steps": 2.0, "approx_kl": 0.01,
                                           "rows_dropped_nonfinite": 3.0})
    metrics.rows_accepted(np.array([0, 1, 1, 9]))
    metrics.message_received(3000)
    got = samples(registry)
    assert got[("sluice_updates_total", ())] == 1 and got[("sluice_samples_total", ())] == 512
    assert got[("sluice_skipped_steps_total", ())] == 2
    assert got[("sluice_rows_dropped_nonfinite_total", ())] == 3
    assert got[("sluice_policy_version", ())] == 6 and got[("sluice_max_policy_lag_versions", ())] == 8
    assert got[("sluice_episode_return_mean", ())] == 12.5 and got[("sluice_clip_fraction_ratio", ())] == 0.2
    assert got[("sluice_explained_variance_ratio", ())] == 0  # NaN is not exported: the gauge keeps its last
    assert got[("sluice_selfplay_outcome_ratio", (("outcome", "win"),))] == 0.25
    assert got[("sluice_policy_lag_versions_bucket", (("le", "1.0"),))] == 3
    assert got[("sluice_update_duration_seconds_count", ())] == 1
    assert got[("sluice_received_message_bytes_sum", ())] == 3000


def test_host_metrics_follow_shipped_reports_and_keep_restarts_across_a_rebuild():
    registry = new_registry("actor_host")
    metrics = HostMetrics(registry, count_steps_every_s=0.0)
    assert ("sluice_actor_policy_version", ()) not in samples(registry)  # no host attached yet
    metrics.attach(lambda: HostView(policy_version=3, workers=2, worker_restarts=1, rows_waiting=4, ready_groups=0))
    report = RowsReport(env_steps=100, agent_steps=200, env_restarts=1, returns=[1.0, 2.0], worker_wait_s=0.5,
                        worker_step_s=1.5)
    metrics.step_timed(step_s=0.002, forward_s=0.001, agents=64)
    assert samples(registry)[("sluice_actor_inference_batch_agents_count", ())] == 0  # counted with the next message
    metrics.rows_shipped(report, rows=8, nbytes=4096)
    metrics.attach(lambda: HostView(policy_version=9, workers=2, worker_restarts=0, rows_waiting=0, ready_groups=1))
    got = samples(registry)
    assert got[("sluice_actor_env_steps_total", ())] == 100 and got[("sluice_actor_agent_steps_total", ())] == 200
    assert got[("sluice_actor_episodes_total", ())] == 2 and got[("sluice_actor_rows_sent_total", ())] == 8
    assert got[("sluice_actor_worker_wait_seconds_total", ())] == 0.5
    assert got[("sluice_actor_worker_restarts_total", ())] == 1  # the rebuilt host's predecessor's restart stays
    assert got[("sluice_actor_policy_version", ())] == 9
    assert got[("sluice_actor_inference_batch_agents_bucket", (("le", "64.0"),))] == 1
    assert got[("sluice_actor_message_bytes_count", ())] == 1


def test_a_taken_report_keeps_what_was_counted_while_the_host_counts_afresh():
    """A message the data socket refused waits with its report; the host goes on counting into the same object."""
    report = RowsReport.for_stats(("score",))
    report.env_steps, report.returns, report.stats["score"], report.worker_wait_s = 5, [1.0], [2.0], 0.25
    taken = report.take()
    report.env_steps += 1
    report.returns.append(3.0)
    report.stats["score"].append(4.0)
    assert (taken.env_steps, taken.returns, taken.stats, taken.worker_wait_s) == (5, [1.0], {"score": [2.0]}, 0.25)
    assert (report.env_steps, report.returns, report.stats, report.worker_wait_s) == (1, [3.0], {"score": [4.0]}, 0.0)


def test_host_metrics_count_inference_steps_with_a_message_a_while_after_the_last_count_or_once_their_array_is_full():
    registry = new_registry("actor_host")
    metrics = HostMetrics(registry, count_steps_every_s=0.2)
    steps = np.random.default_rng(0).random(PENDING_STEPS + 5)
    for k, step_s in enumerate(steps):
        metrics.step_timed(step_s=float(step_s), forward_s=float(step_s) / 2, agents=k % 100)
    got = samples(registry)
    assert got[("sluice_actor_inference_step_seconds_count", ())] == PENDING_STEPS  # the full array, counted
    np.testing.assert_allclose(got[("sluice_actor_inference_step_seconds_sum", ())], steps[:PENDING_STEPS].sum())
    metrics.rows_shipped(RowsReport(), rows=1, nbytes=10)  # right after the full array's count: the rest wait
    assert samples(registry)[("sluice_actor_forward_pass_seconds_count", ())] == PENDING_STEPS
    time.sleep(0.25)
    metrics.rows_shipped(RowsReport(), rows=1, nbytes=10)
    got = samples(registry)
    assert got[("sluice_actor_forward_pass_seconds_count", ())] == PENDING_STEPS + 5
    np.testing.assert_allclose(got[("sluice_actor_forward_pass_seconds_sum", ())], steps.sum() / 2)
    agents = np.arange(PENDING_STEPS + 5) % 100
    assert got[("sluice_actor_inference_batch_agents_bucket", (("le", "16.0"),))] == (agents <= 16).sum()


def test_pool_metrics_count_answers_and_refusals_by_type():
    registry = new_registry("pool_server")
    metrics = PoolMetrics(registry)
    metrics.watch_size(lambda: 4)
    metrics.answered("get_snapshot", seconds=0.01, sent_bytes=1000)
    metrics.refused("not_found")
    got = samples(registry)
    assert got[("sluice_pool_requests_total", (("type", "get_snapshot"),))] == 1
    assert got[("sluice_pool_requests_total", (("type", "get_opponents"),))] == 0
    assert got[("sluice_pool_rejected_total", (("reason", "not_found"),))] == 1
    assert got[("sluice_pool_sent_bytes_total", ())] == 1000 and got[("sluice_pool_snapshots", ())] == 4


@pytest.mark.parametrize("reported, peer, target", [
    ("0.0.0.0:9100", "10.0.0.2", "10.0.0.2:9100"),      # a wildcard bind is scraped where the host is
    ("127.0.0.1:9100", "127.0.0.1", "127.0.0.1:9100"),  # same machine
    ("127.0.0.1:9100", "10.0.0.2", None),               # loopback on another machine: unreachable from here
    ("10.0.0.5:9100", "10.0.0.2", "10.0.0.5:9100"),     # a specific address the host chose
    ("[::]:9100", "::1", "[::1]:9100"),
    ("box name:9100", None, None), ("10.0.0.5:0", None, None), ("10.0.0.5", None, None), (9100, None, None),
    ("x" * 400 + ":1", None, None),
])
def test_the_scrape_target_of_a_registration(reported, peer, target):
    assert scrape_target(reported, peer) == target


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_actors_metrics_port_out_of_range_is_one_line():
    done = run_cli("actors", "--metrics-port", "70000")
    assert done.returncode == 2
    assert done.stderr == ("python -m actors: error: --metrics-port must be a port number in 0..65535 (0: a free "
                           "port), got 70000\n")


@pytest.mark.integration
def test_actors_metrics_port_in_use_is_one_line_naming_the_option():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("actors", "--metrics-port", str(port), "--learner", "tcp://127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"python -m actors: error: cannot bind the Prometheus endpoint at 127.0.0.1:{port}: Address already in use "
        "(choose another port with --metrics-port PORT; 0 takes a free one)")


@pytest.mark.integration
def test_pool_server_metrics_port_out_of_range_is_one_line(tmp_path):
    done = run_cli("learner.pool.server", "--run-dir", str(tmp_path), "--metrics-port", "-5")
    assert done.returncode == 2
    assert done.stderr == ("python -m learner.pool.server: error: --metrics-port must be a port number in 0..65535 "
                           "(0: a free port), got -5\n")
