"""One metrics.jsonl record per update: the run's counters, what the ingest counted, the algorithm's metrics,
and the learner's own figures (throughput, hosts and what the control server refused, self-play, update
time). Key order is the file's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from learner.run.checkpoint import TrainerState
from learner.serve.control import ControlCounts
from learner.serve.ingest_counters import IngestSnapshot


@dataclass(frozen=True, kw_only=True)
class Lap:
    """The clock read after an update."""

    elapsed_s: float
    """Training seconds of the whole run, earlier processes of a resumed run included."""
    steps_per_s: float
    """Agent steps per second since the previous lap (or since the clock started)."""


class RunClock:
    """Training wall-clock across resumes, and agent steps per second between successive laps."""

    def __init__(self, *, elapsed_before: float, agent_steps: int) -> None:
        self.started = time.monotonic()
        self.elapsed_before = elapsed_before
        self.last_agent_steps = agent_steps
        self.last_time = self.started

    def lap(self, agent_steps: int) -> Lap:
        """Read the clock now, with the run's agent steps so far."""
        now = time.monotonic()
        rate = (agent_steps - self.last_agent_steps) / max(1e-9, now - self.last_time)
        self.last_agent_steps, self.last_time = agent_steps, now
        return Lap(elapsed_s=self.elapsed_before + now - self.started, steps_per_s=rate)


def outcome_rates(returns: Sequence[float]) -> dict[str, float | None]:
    """Self-play: the learner's win/draw/loss rates against the pool, from the sign of its last returns."""
    outcome = np.sign(np.asarray(returns, dtype=np.float64))
    return {name: float((outcome == sign).mean()) if len(outcome) else None
            for name, sign in (("win_rate", 1), ("draw_rate", 0), ("loss_rate", -1))}


def metrics_record(*, state: TrainerState, sps: float, ingest: IngestSnapshot, update_metrics: dict[str, float],
                   hosts: ControlCounts, selfplay: dict[str, Any], update_s: float,
                   clients_refused: int = 0) -> dict[str, Any]:
    """The record of the update ``state`` has just counted (``selfplay`` is empty without an opponent pool;
    ``clients_refused``: CURVE connection attempts refused since the start, 0 without CURVE)."""
    returns, lengths = ingest.recent_returns, ingest.recent_lengths
    return {
        "update": state.update,
        "env_steps": state.env_steps,
        "agent_steps": state.agent_steps,
        "sps": sps,
        "elapsed_s": state.elapsed_s,
        "episodes": state.episodes,
        "episode_return_mean": float(np.mean(returns)) if returns else None,
        "episode_length_mean": float(np.mean(lengths)) if lengths else None,
        **{f"episode_{name}_mean": mean for name, mean in ingest.episode_stat_means.items()},
        **update_metrics,
        "policy_version": state.policy_version,
        "policy_lag_mean": ingest.policy_lag_mean,
        "policy_lag_max": ingest.policy_lag_max,
        "rows_received": ingest.rows_received,
        "rows_dropped_stale": ingest.rows_dropped_stale,
        "rows_dropped_future": ingest.rows_dropped_future,
        "messages_dropped": ingest.messages_dropped,
        "messages_dropped_by_reason": dict(ingest.messages_dropped_by_reason),
        "env_restarts": ingest.env_restarts,
        "actor_hosts": hosts.actor_hosts,
        "actor_host_registrations": hosts.registrations,
        "actor_hosts_lost": hosts.actor_hosts_lost,
        "actor_hosts_failed": hosts.actor_hosts_failed,
        "control_rejected_by_reason": dict(hosts.rejected_by_reason),
        "clients_refused": clients_refused,
        **ingest.host_timing,
        **selfplay,
        "update_s": update_s,
    }
