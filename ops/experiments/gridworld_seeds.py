"""Benchmark: does a gridworld config learn on every seed? Issue 16's per-seed check, against the random policy.

The random policy's last-100-comparable mean return is computed once for the config
(``gridworld_random_baseline.random_baseline``: 200 agent episodes, seed 0, the same ``--set`` overrides). Then,
for each seed, the real learner and one actor host (separate processes, ZeroMQ, shared memory; ``pipeline_run``)
train the config until ``--agent-steps`` (passed as trainer.total_timesteps, so the learning-rate and entropy
schedules end where the budget does) or ``--seconds`` of wall-clock, whichever comes first. The learner's
metrics.jsonl is then scored by ``learning_criteria.evaluate_curve``: (a) above random by 1M agent steps,
(b) at the end at least 3x random (for random <= 0: final - random >= 2 |random|, and final > random),
(c) no phase longer than 2M agent steps below random after the first time above it.

Prints one JSON line per seed (the return when each agent-step mark was reached, the final return, the criteria,
the named episode stats' last means) and a summary line (final return min/median/max over seeds, seeds passing);
``--markdown FILE`` writes the same as a table for the README.

Usage: .venv/bin/python -m ops.experiments.gridworld_seeds [--config grid_3agents] [--seeds 1 2 3 4 5]
       [--agent-steps N (default: the config's trainer.total_timesteps)] [--seconds 1800] [--port 6400]
       [--set SECTION.KEY=VALUE ...] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from configs.loader import load_config, resolve_config_path
from evaluation.plot import PlotError, read_records
from ops.benchlib import emit, machine
from ops.experiments.gridworld_random_baseline import random_baseline
from ops.experiments.learning_criteria import (curve_from_records, evaluate_curve, last_episode_stats,
                                               return_at_marks)
from ops.experiments.pipeline_run import trained_run

MARKS = (1_000_000, 2_000_000, 4_000_000, 8_000_000)
"""Agent steps at which each seed's return is reported (when the run reached them)."""
RANDOM_EPISODES = 200
"""Agent episodes the random policy's mean return is taken over."""
RANDOM_SEED = 0
"""The random policy's env and action seed (the configs' comments quote this one)."""


def mark_label(agent_steps: int) -> str:
    """``1000000`` -> ``"1M"``, ``500000`` -> ``"0.5M"``."""
    return f"{agent_steps / 1e6:g}M"


def trial(*, config: str, seed: int, agent_steps: int, seconds: float, port: int, overrides: Sequence[str],
          random_return: float, marks: Sequence[int]) -> dict[str, Any]:
    """Train one seed of the ``config`` file through the pipeline and score its metrics.jsonl against
    ``random_return``."""
    started = time.monotonic()
    with trained_run(config=config, seed=seed, seconds=seconds, port=port,
                     overrides=[*overrides, f"trainer.total_timesteps={agent_steps}"]) as run:
        train_s = time.monotonic() - started
        try:
            records = read_records(run.run_dir)
        except PlotError:
            records = []
        learner_tail = run.learner_output[-1500:]
    curve = curve_from_records(records)
    result = evaluate_curve(curve, random_return=random_return)
    return {
        "bench": "gridworld_seeds", "config": Path(config).stem, "seed": seed, "agent_steps_budget": agent_steps,
        "seconds_cap": seconds, "train_s": round(train_s, 1), "learner_exit_code": run.learner_exit_code,
        "agent_steps": records[-1]["agent_steps"] if records else 0,
        "budget_reached": bool(records) and records[-1]["agent_steps"] >= agent_steps, "updates": len(records),
        "random_return_mean": random_return,
        "return_at": {mark_label(mark): round(value, 3) for mark, value in return_at_marks(curve, marks).items()},
        "final_return_mean": None if result.final_return is None else round(result.final_return, 3),
        "first_above_random_agent_steps": result.first_above_agent_steps,
        "longest_below_random_agent_steps": result.longest_below_agent_steps,
        "above_random_by_1m": result.above_random_by_1m,
        "final_at_least_3x_random": result.final_at_least_3x_random,
        "no_long_phase_below_random": result.no_long_phase_below_random,
        "passed": result.passed,
        "episode_stats": {name: round(value, 3) for name, value in last_episode_stats(records).items()},
        "learner_error": None if records else learner_tail,
    }


def summary(config: str, trials: Sequence[dict[str, Any]], random_return: float,
            random_stats: dict[str, float]) -> dict[str, Any]:
    """The spread of the final return over seeds and how many seeds passed each criterion (``random_stats``: the
    random policy's named episode stats, shown in the table's random row)."""
    finals = [t["final_return_mean"] for t in trials if t["final_return_mean"] is not None]
    return {
        "bench": "gridworld_seeds_summary", "config": config, "seeds": [t["seed"] for t in trials],
        "random_return_mean": random_return, "random_episode_stats": dict(random_stats),
        "final_return_min": min(finals) if finals else None,
        "final_return_median": statistics.median(finals) if finals else None,
        "final_return_max": max(finals) if finals else None,
        **{f"seeds_{key}": sum(t[key] for t in trials)
           for key in ("above_random_by_1m", "final_at_least_3x_random", "no_long_phase_below_random", "passed")},
        "seeds_total": len(trials),
    }


def markdown_table(trials: Sequence[dict[str, Any]], overview: dict[str, Any], marks: Sequence[int]) -> str:
    """The README table: the random policy's row, then one row per seed (return at each mark, final, criteria)."""
    stat_names = sorted({name for t in trials for name in t["episode_stats"]})
    labels = [mark_label(mark) for mark in marks]
    header = ["policy", *labels, "final", "agent steps", "(a) >random by 1M", "(b) >=3x random",
              "(c) no long dip", *stat_names]

    def cell(value: Any) -> str:
        if isinstance(value, bool):
            return "yes" if value else "NO"
        return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    random_stats = overview["random_episode_stats"]
    random_row = ["random", *[cell(overview["random_return_mean"])] * (len(labels) + 1), "", "", "", "",
                  *[cell(random_stats[name]) if name in random_stats else "" for name in stat_names]]
    rows = [random_row] + [
        [f"seed {t['seed']}", *[cell(t["return_at"].get(label)) for label in labels], cell(t["final_return_mean"]),
         f"{t['agent_steps']:,}", cell(t["above_random_by_1m"]), cell(t["final_at_least_3x_random"]),
         cell(t["no_long_phase_below_random"]), *[cell(t["episode_stats"].get(name)) for name in stat_names]]
        for t in trials]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append(f"\n`{overview['config']}`: last-100 mean return per agent episode; {overview['seeds_passed']} of "
                 f"{overview['seeds_total']} seeds pass all three; final min/median/max "
                 f"{cell(overview['final_return_min'])} / {cell(overview['final_return_median'])} / "
                 f"{cell(overview['final_return_max'])}. Machine: {machine()}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grid_3agents", help="a shipped config's name or a YAML path")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--agent-steps", type=int, default=None,
                        help="agent-step budget per seed (default: the config's trainer.total_timesteps)")
    parser.add_argument("--seconds", type=float, default=1800.0, help="wall-clock cap per seed")
    parser.add_argument("--port", type=int, default=6400, help="the learner's network.port (and the next three)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="passed to the learner (and to the random policy's env), repeatable")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the results as a Markdown table")
    args = parser.parse_args()
    config_path = resolve_config_path(args.config)
    budget = args.agent_steps or load_config(config_path, args.overrides).trainer.total_timesteps
    random = random_baseline(config_path, RANDOM_EPISODES, RANDOM_SEED, overrides=args.overrides)
    random_return = random["return_mean"]
    trials = []
    for seed in args.seeds:
        trials.append(trial(config=str(config_path.resolve()), seed=seed, agent_steps=budget, seconds=args.seconds,
                            port=args.port, overrides=args.overrides, random_return=random_return, marks=MARKS))
        emit(trials[-1])
    overview = summary(config_path.stem, trials, random_return, random["episode_stats"])
    emit(overview)
    if args.markdown is not None:
        args.markdown.write_text(markdown_table(trials, overview, MARKS))


if __name__ == "__main__":
    main()
