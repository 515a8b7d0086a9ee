"""Benchmark: gridworld agent-steps per second on one core (single process, random actions).

Steps ``GridworldVec`` with uniformly random actions (pre-drawn, cycled, so drawing them is not timed) into
private ``StepBuffers``, after a warm-up that includes numba compilation/cache load. Prints one JSON object
per agent count with agent-steps/s (= env steps/s x agents; one process, so per core). Goal: >= 1M.
Usage: .venv/bin/python -m ops.bench.gridworld_steps [--agents 3 24] [--slots 768] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from envs.base import StepBuffers
from envs.builtin.gridworld import GridworldVec
from ops.benchlib import machine


def bench(num_agents: int, slots: int, seconds: float, max_steps: int) -> dict:
    num_envs = max(1, slots // num_agents)
    env = GridworldVec(num_envs, num_agents=num_agents, max_steps=max_steps)
    buffers = StepBuffers.allocate(env.spec, num_envs)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.spec.num_actions, size=(64, num_envs * num_agents), dtype=np.int32)
    env.reset(buffers, seed=0)
    for k in range(50):
        buffers.actions[:] = actions[k % 64]
        env.step(buffers)
    steps = 0
    start = time.perf_counter()
    while True:
        for _ in range(20):
            buffers.actions[:] = actions[steps % 64]
            env.step(buffers)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    agent_steps = steps * num_envs * num_agents
    return {
        "bench": "gridworld_steps",
        "num_agents": num_agents,
        "num_envs": num_envs,
        "map_size": env.side,
        "obs_shape": list(env.spec.obs_shape),
        "max_steps": max_steps,
        "seconds": round(elapsed, 3),
        "agent_steps": agent_steps,
        "agent_steps_per_s_per_core": round(agent_steps / elapsed),
        "goal_agent_steps_per_s_per_core": 1_000_000,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 24])
    parser.add_argument("--slots", type=int, default=768, help="agent slots per env batch (envs = slots // agents)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--max-steps", type=int, default=1000)
    args = parser.parse_args()
    for n in args.agents:
        print(json.dumps(bench(n, args.slots, args.seconds, args.max_steps)), flush=True)


if __name__ == "__main__":
    main()
