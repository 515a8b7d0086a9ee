"""Benchmark: env steps per second of the built-in simple_spread (numba) against mpe2's own simple_spread_v3.

Both step uniformly random continuous actions (pre-drawn, so drawing is not timed), 3 agents, 25-step episodes with
their resets, one process:

* native: ``SimpleSpreadVec`` with ``--envs`` envs stepped together into private ``StepBuffers`` (after a warm-up
  that includes numba compilation or its cache load);
* mpe2: one ``simple_spread_v3.parallel_env(continuous_actions=True)`` stepped in a loop with ``step(dict)``,
  reset when its agents are done (how the PettingZoo adapter drives each of its envs).

Prints one JSON object per side: env steps/s. Usage:
.venv/bin/python -m ops.bench.spread_steps [--envs 1024] [--seconds 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from envs.base import StepBuffers
from envs.builtin.simple_spread import ACTION_DIM, SimpleSpreadVec
from ops.benchlib import emit

AGENTS = 3


def native(envs: int, seconds: float) -> dict:
    env = SimpleSpreadVec(envs, num_agents=AGENTS)
    buffers = StepBuffers.allocate(env.spec, envs)
    actions = np.random.default_rng(0).random((64, envs * AGENTS, ACTION_DIM), dtype=np.float32)
    env.reset(buffers, seed=0)
    for k in range(50):
        buffers.actions[:] = actions[k % 64]
        env.step(buffers)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            buffers.actions[:] = actions[steps % 64]
            env.step(buffers)
            steps += 1
    elapsed = time.perf_counter() - start
    return {"bench": "spread_steps", "side": "native numba", "envs": envs, "seconds": round(elapsed, 3),
            "env_steps_per_s": round(steps * envs / elapsed)}


def reference(seconds: float) -> dict:
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=AGENTS, max_cycles=25, local_ratio=0.5, continuous_actions=True)
    env.reset(seed=0)
    draws = np.random.default_rng(0).random((64, AGENTS, ACTION_DIM), dtype=np.float32)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step = {agent: draws[steps % 64, i] for i, agent in enumerate(env.agents)}
        env.step(step)
        steps += 1
        if not env.agents:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return {"bench": "spread_steps", "side": "mpe2 simple_spread_v3", "envs": 1, "seconds": round(elapsed, 3),
            "env_steps_per_s": round(steps / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1024, help="native envs stepped together")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per side")
    args = parser.parse_args()
    emit(native(args.envs, args.seconds))
    emit(reference(args.seconds))


if __name__ == "__main__":
    main()
