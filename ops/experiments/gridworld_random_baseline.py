"""Baseline: per-agent episode return of a uniformly random policy on a gridworld run config.

Builds the env exactly as a run config does (``configs.loader`` + ``envs.registry.make_vec_env``),
steps it with uniformly random actions from a seeded NumPy generator until at least ``--episodes`` agent
episodes have finished, and prints one JSON object with the mean and std of the per-agent episode return and the
means of the env's named episode stats (the gridworld's items collected and converted). A config's staggered start
(``env.kwargs.stagger_start``) is turned off here, so every episode counted has the full ``max_steps`` steps.
A trained policy should beat this mean by a margin well outside the std.
Usage: .venv/bin/python -m ops.experiments.gridworld_random_baseline --config configs/grid_3agents.yaml
       [--episodes 200] [--seed 0] [--num-envs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from configs.loader import load_config
from envs.base import StepBuffers
from envs.registry import make_vec_env


def random_baseline(config: Path, episodes: int, seed: int, num_envs: int | None = None,
                    overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Step the config's env (``overrides``: ``SECTION.KEY=VALUE`` as the learner's ``--set``) with uniform random
    actions until ``episodes`` agent episodes have ended."""
    cfg = load_config(config, overrides)
    env_config = dataclasses.replace(cfg.env, kwargs={key: value for key, value in cfg.env.kwargs.items()
                                                      if key != "stagger_start"})  # whole episodes only
    num_agents = env_config.num_agents
    if num_envs is None:
        num_envs = max(1, math.ceil(episodes / num_agents))  # episodes end together: one pass is enough
    env = make_vec_env(env_config, num_envs)
    try:
        buffers = StepBuffers.allocate(env.spec, num_envs)
        rng = np.random.default_rng(seed)
        env.reset(buffers, seed=seed)
        returns: list[float] = []
        lengths: list[int] = []
        stats: list[np.ndarray] = []
        env_steps = 0
        start = time.perf_counter()
        while len(returns) < episodes:
            buffers.actions[:] = rng.integers(0, env.spec.num_actions, size=buffers.actions.shape, dtype=np.int32)
            env.step(buffers)
            env_steps += 1
            done = buffers.episode_done
            if done.any():
                returns.extend(buffers.episode_return[done].tolist())
                lengths.extend(buffers.episode_length[done].tolist())
                stats.append(buffers.episode_stats[done].astype(np.float64))
        elapsed = time.perf_counter() - start
    finally:
        env.close()
    values = np.asarray(returns, dtype=np.float64)
    stat_means = np.concatenate(stats).mean(axis=0) if stats else np.zeros(0)
    return {
        "bench": "gridworld_random_baseline",
        "config": str(config),
        "num_agents": num_agents,
        "num_envs": num_envs,
        "env_kwargs": dict(env_config.kwargs),
        "seed": seed,
        "episodes": int(values.size),
        "episode_length_mean": float(np.mean(lengths)),
        "return_mean": round(float(values.mean()), 4),
        "return_std": round(float(values.std()), 4),
        "return_min": float(values.min()),
        "return_max": float(values.max()),
        "episode_stats": {name: round(float(mean), 4) for name, mean in zip(env.spec.episode_stats, stat_means)},
        "agent_steps": env_steps * num_envs * num_agents,
        "seconds": round(elapsed, 3),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
    }


def main() -> None:
    """Parse the command line and print the baseline as one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/grid_3agents.yaml"))
    parser.add_argument("--episodes", type=int, default=200, help="agent episodes to finish (at least)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the env reset and the action generator")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="envs stepped together (default: enough for --episodes in one episode length)")
    args = parser.parse_args()
    print(json.dumps(random_baseline(args.config, args.episodes, args.seed, args.num_envs)), flush=True)


if __name__ == "__main__":
    main()
