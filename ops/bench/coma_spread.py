"""Benchmark: COMA on simple_spread (3 agents, 25-step episodes), scored like the issue asks.

For each seed, COMA trains in the serial mode (``learner.coma_serial``, the built-in numba ``simple_spread``) for
``--seconds`` of wall-clock, then its actors play ``--episodes`` deterministic evaluation episodes (the mean action);
the score is the team return, the sum over agents and steps, averaged over episodes. Printed beside it, on the same
env and episodes: a uniformly random policy and a scripted controller that knows the landmark positions (each
agent heads for the landmark given to it by a greedy nearest-pair assignment). The project's PPO with independent
per-agent critics runs through the real pipeline (``configs/simple_spread.yaml``) and is scored with
``python -m learner.evaluate``; see the README.

Usage: .venv/bin/python ops/bench/coma_spread.py [--seeds 1 2 3] [--seconds 600] [--episodes 200] [--envs 16]
       [--set coma.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from benchlib import emit

from configs.loader import load_config
from envs.base import StepBuffers
from envs.simple_spread import ACTION_DIM, SimpleSpreadVec, obs_dim, state_dim
from learner.coma_algorithm import ComaShapes
from learner.coma_serial import EpisodeLog, SerialComa, evaluate_team_return

NUM_AGENTS = 3


def shapes(num_agents: int) -> ComaShapes:
    """simple_spread's sizes: Box(0, 1, (5,)) actions whose no-op is all zeros (no force, no movement)."""
    return ComaShapes(num_agents=num_agents, obs_dim=obs_dim(num_agents), state_dim=state_dim(num_agents),
                      action_low=(0.0,) * ACTION_DIM, action_high=(1.0,) * ACTION_DIM, noop_action=(0.0,) * ACTION_DIM)


def new_env(envs: int) -> tuple[SimpleSpreadVec, StepBuffers]:
    env = SimpleSpreadVec(envs, num_agents=NUM_AGENTS)
    return env, StepBuffers.allocate(env.spec, envs)


def baseline_returns(policy: str, *, episodes: int, seed: int) -> list[float]:
    """Team returns of ``random`` (uniform actions) or ``scripted`` (head for an assigned landmark)."""
    env, buffers = new_env(min(episodes, 64))
    env.reset(buffers, seed=seed)
    rng = np.random.default_rng(seed)
    log = EpisodeLog()
    while len(log.team_returns) < episodes:
        if policy == "random":
            buffers.actions[:] = rng.uniform(0.0, 1.0, buffers.actions.shape)
        else:
            buffers.actions[:] = scripted_actions(env)
        env.step(buffers)
        log.record(buffers, NUM_AGENTS)
    return log.team_returns[:episodes]


def scripted_actions(env: SimpleSpreadVec) -> np.ndarray:
    """Each agent pushes toward its landmark (greedy nearest agent-landmark pairs), braking by its velocity."""
    actions = np.zeros((env.num_envs, NUM_AGENTS, ACTION_DIM), np.float32)
    for e in range(env.num_envs):
        agent_pos, agent_vel, landmark_pos = env.get_world(e)
        distance = np.linalg.norm(agent_pos[:, None] - landmark_pos[None], axis=-1)
        target = np.empty(NUM_AGENTS, int)
        for _ in range(NUM_AGENTS):
            i, j = np.unravel_index(np.argmin(distance), distance.shape)
            target[i] = j
            distance[i, :], distance[:, j] = np.inf, np.inf
        for i in range(NUM_AGENTS):
            push = (landmark_pos[target[i]] - agent_pos[i]) * 2.0 - agent_vel[i] * 0.5
            # mpe2's continuous actions: force x = a[2] - a[1], force y = a[4] - a[3]
            actions[e, i, 2], actions[e, i, 1] = max(push[0], 0.0), max(-push[0], 0.0)
            actions[e, i, 4], actions[e, i, 3] = max(push[1], 0.0), max(-push[1], 0.0)
    return np.clip(actions, 0.0, 1.0).reshape(-1, ACTION_DIM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=600.0, help="training wall-clock per seed")
    parser.add_argument("--episodes", type=int, default=200, help="evaluation episodes")
    parser.add_argument("--envs", type=int, default=16, help="envs stepped together while collecting")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="coma.KEY=VALUE")
    args = parser.parse_args()
    section = load_config(None, args.overrides).coma
    for policy in ("random", "scripted"):
        returns = baseline_returns(policy, episodes=args.episodes, seed=12345)
        emit({"bench": "coma_spread", "policy": policy, "episodes": len(returns),
              "team_return_mean": round(float(np.mean(returns)), 2)})
    for seed in args.seeds:
        env, buffers = new_env(args.envs)
        trainer = SerialComa(env, shapes(NUM_AGENTS), section, seed=seed, buffers=buffers)
        started = time.monotonic()

        def progress(transitions: int, metrics: dict[str, float]) -> None:
            recent = trainer.log.team_returns[-200:]
            if transitions // section.rollout_length % 25 == 0:
                print(f"seed {seed} {time.monotonic() - started:6.0f} s {transitions:>9,} transitions  train team "
                      f"return {np.mean(recent) if recent else float('nan'):7.2f}  critic "
                      f"{metrics['critic_loss']:.3f}  q {metrics['q_mean']:+.2f}  std {metrics['action_std']:.3f}",
                      flush=True)

        trainer.train(seconds=args.seconds, on_rollout=progress)
        eval_env, eval_buffers = new_env(min(args.episodes, 64))
        returns = evaluate_team_return(eval_env, trainer.coma, eval_buffers, episodes=args.episodes, seed=seed + 999)
        emit({"bench": "coma_spread", "policy": "coma", "seed": seed, "train_s": round(time.monotonic() - started, 1),
              "transitions": trainer.transitions, "episodes": len(returns),
              "team_return_mean": round(float(np.mean(returns)), 2), "default_action": section.default_action})


if __name__ == "__main__":
    main()
