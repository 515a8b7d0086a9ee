"""Benchmark: the project's PPO (independent per-agent critics: each agent's row has its own value) on
simple_spread, scored like ``coma_spread.py`` for a side-by-side table.

For each seed: the real learner and one actor host (separate processes, ZeroMQ, shared memory) train
``configs/simple_spread.yaml`` for ``--seconds`` of wall-clock, the learner is stopped with SIGINT (final
checkpoint), then ``python -m evaluation.evaluate --deterministic`` plays ``3 * --episodes`` agent episodes (all three
agents of ``--episodes`` env episodes). The team return is 3 x the mean agent return (every agent's episode lasts
the same 25 steps).

Usage: .venv/bin/python -m ops.experiments.ppo_spread [--seeds 1 2 3] [--seconds 600] [--episodes 200] [--port 6300]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from ops.benchlib import emit
from ops.experiments.pipeline_run import REPO, trained_run

NUM_AGENTS = 3
SUMMARY = re.compile(r"mean return (-?[\d.]+) \+- ([\d.]+) \(95% CI\) over (\d+) episodes")


def trial(seed: int, *, seconds: float, episodes: int, port: int) -> dict:
    """Train one seed for ``seconds``, evaluate it; returns its figures."""
    with trained_run(config="simple_spread", seed=seed, seconds=seconds, port=port) as run:
        done = subprocess.run([sys.executable, "-m", "evaluation.evaluate", "--run-dir", str(run.run_dir), "--episodes",
                               str(NUM_AGENTS * episodes), "--deterministic", "--seed", str(seed)],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
    match = SUMMARY.search(done.stdout)
    agent_mean = float(match.group(1)) if match else None
    return {"bench": "ppo_spread", "policy": "ppo", "seed": seed, "train_s": seconds,
            "agent_steps": run.agent_steps, "learner_exit_code": run.learner_exit_code, "episodes": episodes,
            "agent_return_mean": agent_mean,
            "team_return_mean": round(NUM_AGENTS * agent_mean, 2) if agent_mean is not None else None,
            "evaluate_error": None if match else done.stderr[-500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=600.0, help="training wall-clock per seed")
    parser.add_argument("--episodes", type=int, default=200, help="evaluation env episodes")
    parser.add_argument("--port", type=int, default=6300, help="the learner's network.port (and the next three)")
    args = parser.parse_args()
    for seed in args.seeds:
        emit(trial(seed, seconds=args.seconds, episodes=args.episodes, port=args.port))


if __name__ == "__main__":
    main()
