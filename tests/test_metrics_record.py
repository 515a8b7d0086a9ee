"""The per-update metrics record (keys and their order, as metrics.jsonl has always had them) and the stop
rules' decisions and console lines (benchmarks parse the solved line)."""

from __future__ import annotations

import json

from configs.schema import TrainerSection
from learner.run.checkpoint import TrainerState
from learner.serve.control import ControlCounts
from learner.serve.ingest_counters import IngestSnapshot
from learner.monitor.metrics_log import MetricsLog
from learner.monitor.metrics_record import RunClock, metrics_record, outcome_rates
from learner.stop_rules import check_stop_rules

TIMING = {"inference_batch_agents_mean": 25.0, "inference_ms_per_batch": 0.5, "act_ms_per_batch": 1.0,
          "worker_wait_fraction": 0.25}


def snapshot(**kw) -> IngestSnapshot:
    base = dict(env_steps=80, agent_steps=160, episodes=3, env_restarts=1, recent_returns=(1.0, -1.0, 0.0),
                recent_lengths=(10, 20, 30), episode_stat_means={"goals": 0.5}, rows_received=64,
                rows_dropped_stale=2, rows_dropped_future=1, messages_dropped=4,
                messages_dropped_by_reason={"bad_field": 3, "unknown_token": 1}, policy_lag_mean=0.5,
                policy_lag_max=2, host_timing=TIMING)
    return IngestSnapshot(**{**base, **kw})


def hosts(**kw) -> ControlCounts:
    base = dict(actor_hosts=2, actor_hosts_lost=1, actor_hosts_failed=3,
                rejected_by_reason={"not_registered": 5, "rate_limited": 1})
    return ControlCounts(**{**base, **kw})


def test_record_keys_and_values_in_the_order_of_metrics_jsonl():
    state = TrainerState(update=7, policy_version=7, env_steps=80, agent_steps=160, episodes=3, elapsed_s=12.5,
                         recent_returns=[1.0, -1.0, 0.0])
    selfplay = {"pool_snapshots": 2, "alternations": 5, "opponents_unique_mean": None,
                **outcome_rates([1.0, -1.0, 0.0])}
    record = metrics_record(state=state, sps=100.0, ingest=snapshot(), update_metrics={"policy_loss": 0.25},
                            hosts=hosts(), selfplay=selfplay, update_s=0.75)
    assert list(record) == [
        "update", "env_steps", "agent_steps", "sps", "elapsed_s", "episodes", "episode_return_mean",
        "episode_length_mean", "episode_goals_mean", "policy_loss", "policy_version", "policy_lag_mean",
        "policy_lag_max", "rows_received", "rows_dropped_stale", "rows_dropped_future", "messages_dropped",
        "messages_dropped_by_reason", "env_restarts", "actor_hosts", "actor_host_registrations", "actor_hosts_lost", "actor_hosts_failed",
        "control_rejected_by_reason", "clients_refused", *TIMING, "pool_snapshots", "alternations",
        "opponents_unique_mean", "win_rate", "draw_rate", "loss_rate", "update_s"]
    assert (record["actor_hosts"], record["actor_hosts_lost"], record["actor_hosts_failed"]) == (2, 1, 3)
    assert record["control_rejected_by_reason"] == {"not_registered": 5, "rate_limited": 1}
    assert record["messages_dropped_by_reason"] == {"bad_field": 3, "unknown_token": 1}
    assert record["episode_return_mean"] == 0.0 and record["episode_length_mean"] == 20.0
    assert (record["win_rate"], record["draw_rate"], record["loss_rate"]) == (1 / 3, 1 / 3, 1 / 3)
    assert record["rows_dropped_future"] == 1 and record["update_s"] == 0.75 and record["elapsed_s"] == 12.5
    empty = metrics_record(state=state, sps=0.0, ingest=snapshot(recent_returns=(), recent_lengths=()),
                           update_metrics={}, hosts=hosts(rejected_by_reason={}), selfplay={}, update_s=0.0)
    assert empty["control_rejected_by_reason"] == {}
    assert empty["episode_return_mean"] is None and empty["episode_length_mean"] is None
    assert outcome_rates([]) == {"win_rate": None, "draw_rate": None, "loss_rate": None}


def test_the_clock_counts_earlier_processes_and_steps_between_laps():
    clock = RunClock(elapsed_before=100.0, agent_steps=1000)
    lap = clock.lap(1000)
    assert lap.elapsed_s >= 100.0 and lap.steps_per_s == 0.0
    assert clock.lap(1500).steps_per_s > 0


def test_stop_rules_target_return_then_total_timesteps():
    trainer = TrainerSection(target_episode_return=475.0, total_timesteps=10_000)
    assert check_stop_rules(trainer, TrainerState(agent_steps=500, recent_returns=[500.0] * 99)) is None
    solved = check_stop_rules(trainer, TrainerState(update=12, agent_steps=123_456, elapsed_s=61.25,
                                                    recent_returns=[480.0] * 100))
    assert solved.reason == "target return reached"
    assert solved.announcement == ("learner: solved: mean return 480.0 over the last 100 episodes >= 475 after "
                                   "123,456 agent steps in 61.2 s (12 updates)")
    done = check_stop_rules(trainer, TrainerState(agent_steps=10_000, elapsed_s=3.0, recent_returns=[1.0] * 100))
    assert done.reason == "total_timesteps reached"
    assert done.announcement == "learner: reached total_timesteps (10,000 agent steps) in 3.0 s"
    no_target = TrainerSection(target_episode_return=None, total_timesteps=10_000)
    assert check_stop_rules(no_target, TrainerState(agent_steps=9_999, recent_returns=[1e9] * 100)) is None


def test_the_metrics_log_records_lost_and_failed_hosts_and_prints_nothing(tmp_path, capsys):
    state = TrainerState(update=1, policy_version=1, agent_steps=160)
    losses = {"policy_loss": 0.1, "value_loss": 0.2, "entropy": 0.3, "approx_kl": 0.0, "clipfrac": 0.0,
              "explained_variance": 0.5}
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for counted in (hosts(actor_hosts_lost=0, actor_hosts_failed=0), hosts()):
        log.write(metrics_record(state=state, sps=1.0, ingest=snapshot(), update_metrics=losses, hosts=counted,
                                 selfplay={}, update_s=0.1))
    log.close()
    assert capsys.readouterr().out == ""  # the console line is learner/monitor/progress.py's
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["actor_hosts_lost"], r["actor_hosts_failed"]) for r in written] == [(0, 0), (1, 3)]
