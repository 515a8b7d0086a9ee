"""Experiment: MiniGrid-DoorKey-8x8 (a third-party Gymnasium env with Dict observations) to a mean return of 0.9.

``configs/minigrid_doorkey.yaml`` (minigrid's Dict observation with ``mission`` left out by ``env.obs_keys``: the 7x7x3
image to a CNN, the direction to an embedding) is trained through the real pipeline (``pipeline_run.trained_run``:
learner and actor host processes) until the last 100 episodes' mean return reaches ``--target`` or ``--seconds`` pass.
A success returns ``1 - 0.9 * steps / 640``, so 0.9 means the agent picks up the key, opens the door and reaches the
goal in about 70 steps on average; a uniformly random policy's mean return is printed beside it (about 0). The final
checkpoint then plays ``--eval-episodes`` new episodes (``evaluation.episode_runner.run_episodes``, what ``python -m
evaluation.evaluate`` runs; actions sampled as in training): ``eval_return_mean`` says whether the level holds beyond
the episodes that ended the run. Prints one JSON object per seed and one for the random policy. Usage:
.venv/bin/python -m ops.experiments.minigrid_doorkey [--seeds 1] [--seconds 1200] [--target 0.9] [--port 6600]
[--set SECTION.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence

import numpy as np

from evaluation.episode_runner import run_episodes
from evaluation.load_policy import load_policy
from ops.benchlib import emit, run_stoppable
from ops.experiments.pipeline_run import trained_run

ENV_ID = "MiniGrid-DoorKey-8x8-v0"
SOLVED = re.compile(r"solved: mean return ([\d.]+) .* after ([\d,]+) agent steps in ([\d.]+) s")
CURVE_EVERY_S = 60.0
"""Seconds between two points of the printed learning curve."""


def random_policy_return(episodes: int, seed: int) -> float:
    """Mean return of uniformly random actions over ``episodes`` episodes of the env (gymnasium directly)."""
    import gymnasium as gym

    env = gym.make(f"minigrid:{ENV_ID}")  # the prefix imports minigrid, which registers its ids
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def curve(records: list[dict]) -> list[dict[str, float]]:
    """(elapsed s, agent steps, mean return) about every CURVE_EVERY_S seconds of training, and the last update, from
    the run's metrics records."""
    points, next_at = [], 0.0
    for index, record in enumerate(records):
        if record.get("episode_return_mean") is None:
            continue
        elapsed = record.get("elapsed_s", 0.0)
        if elapsed >= next_at or index == len(records) - 1:
            points.append({"s": round(elapsed), "agent_steps": record["agent_steps"],
                           "return_mean": round(record["episode_return_mean"], 3)})
            next_at = elapsed + CURVE_EVERY_S
    return points


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--seconds", type=float, default=1200.0, help="wall-clock cap of one run (20 minutes)")
    parser.add_argument("--target", type=float, default=0.9, help="the last 100 episodes' mean return that ends a run")
    parser.add_argument("--random-episodes", type=int, default=30)
    parser.add_argument("--eval-episodes", type=int, default=100, help="new episodes the final checkpoint plays")
    parser.add_argument("--port", type=int, default=6600)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE",
                        help="more learner settings (e.g. a smaller batch for a smoke run)")
    args = parser.parse_args(argv)
    emit({"experiment": "minigrid_doorkey", "policy": "random", "episodes": args.random_episodes,
          "return_mean": round(random_policy_return(args.random_episodes, seed=0), 3)})
    for seed in args.seeds:
        with trained_run(config="minigrid_doorkey", seed=seed, seconds=args.seconds, port=args.port,
                         overrides=[f"trainer.target_episode_return={args.target}", *args.overrides]) as run:
            metrics = (run.run_dir / "metrics.jsonl")
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            records = [json.loads(line) for line in lines if line.strip()]
            solved = SOLVED.search(run.learner_output)
            points = curve(records)
            evaluated = run_episodes(load_policy(run.run_dir), episodes=args.eval_episodes, seed=10_000 + seed)
            emit({"experiment": "minigrid_doorkey", "seed": seed, "target": args.target,
                  "reached": solved is not None,
                  "seconds_to_target": float(solved.group(3)) if solved else None,
                  "agent_steps_to_target": int(solved.group(2).replace(",", "")) if solved else None,
                  "final_return_mean": points[-1]["return_mean"] if points else None,
                  "eval_episodes": args.eval_episodes,
                  "eval_return_mean": round(float(evaluated.returns.mean()), 3),
                  "eval_length_mean": round(float(evaluated.lengths.mean()), 1),
                  "agent_steps": records[-1].get("agent_steps", 0) if records else 0,
                  "curve": points, "learner_exit_code": run.learner_exit_code})


if __name__ == "__main__":
    run_stoppable(main)
