"""Benchmark: COMA on simple_spread (3 agents, 25-step episodes), scored like the issue asks.

For each seed, COMA trains for ``--seconds`` of wall-clock on the built-in numba ``simple_spread``, then its actors
play ``--episodes`` deterministic evaluation episodes (the mean action); the score is the team return, the sum over
agents and steps, averaged over episodes. ``--mode pipeline`` (the default) trains through the real pipeline
(``python -m learner --config coma_spread`` and one ``python -m actors`` host, stopped by SIGINT) and scores the
final checkpoint's actors; with ``--plot PATH`` it also draws each seed's learning curve (the team return, 3 x
metrics.jsonl's episode_return_mean, against agent steps) beside the baselines. ``--mode serial`` trains in one
process (``learner.coma.serial``). Printed beside it, on the same
env and episodes: a uniformly random policy and a scripted controller that knows the landmark positions (each
agent heads for the landmark given to it by a greedy nearest-pair assignment). The project's PPO with independent
per-agent critics runs through the real pipeline (``configs/simple_spread.yaml``) and is scored with
``python -m evaluation.evaluate``; see the README.

Usage: .venv/bin/python -m ops.experiments.coma_spread [--mode pipeline|serial] [--seeds 1 2 3] [--seconds 600]
       [--episodes 200] [--port 6310] [--plot PNG] [--envs 16 (serial)] [--set SECTION.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file

from configs.loader import load_config
from envs.base import StepBuffers
from envs.builtin.simple_spread import ACTION_DIM, SimpleSpreadVec, obs_dim, state_dim
from learner.coma.algorithm import ComaShapes
from learner.coma.serial import EpisodeLog, SerialComa, evaluate_team_return, play_team_return
from evaluation.load_policy import LoadPolicyError, find_checkpoint
from evaluation.plot import Curve, PlotError, draw, load_run, read_records
from ops.benchlib import emit
from ops.experiments.pipeline_run import trained_run
from policies import tanh_gaussian
from policies.factory import load_state_arrays
from policies.team_actors import make_team_actors, team_shapes

NUM_AGENTS = 3
BASELINE_SEED = 12345
"""The reset seed of the baselines' evaluation episodes."""
EVAL_SEED_OFFSET = 999
"""A trained seed S is evaluated on episodes reset with seed S + this."""


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


def checkpoint_team_returns(run_dir: Path, *, episodes: int, seed: int) -> list[float]:
    """Team returns of the run's newest checkpoint's actors (the mean action) over ``episodes`` seeded episodes."""
    config = load_config(run_dir / "config.yaml")
    env, buffers = new_env(min(episodes, 64))
    sizes = team_shapes(env.spec)
    actors = make_team_actors(sizes, config.coma)
    load_state_arrays(actors, load_file(str(find_checkpoint(run_dir, None) / "actors.safetensors")))
    low, high = torch.tensor(sizes.action_low), torch.tensor(sizes.action_high)

    def mean_actions(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean, _ = actors.heads(torch.as_tensor(obs, dtype=torch.float32))
            return tanh_gaussian.mode(mean, low, high).numpy()

    return play_team_return(env, mean_actions, buffers, episodes=episodes, seed=seed)


def team_return_curve(run_dir: Path, seed: int) -> Curve | None:
    """The run's training team return (3 x episode_return_mean) against agent steps (None before any episode)."""
    try:
        run = load_run(run_dir, metric="episode_return_mean", x_axis="agent_steps")
    except PlotError:
        return None
    return Curve(label=f"COMA seed {seed}", x=run.x, mean=NUM_AGENTS * run.y, low=None, high=None)


def update_cost(run_dir: Path) -> dict[str, float | int | None]:
    """How many updates the run took and the median wall-clock of one (metrics.jsonl's update_s: the learner's
    replay and gradient steps, the figure that bounds COMA on a small machine)."""
    costs = [record["update_s"] for record in read_records(run_dir) if record.get("update_s") is not None]
    return {"updates": len(costs), "update_s_median": round(float(np.median(costs)), 3) if costs else None}


def pipeline_trial(seed: int, *, seconds: float, episodes: int, port: int,
                   overrides: list[str]) -> tuple[dict, Curve | None]:
    """Train one seed through the real pipeline, score its final checkpoint; its figures and learning curve."""
    with trained_run(config="coma_spread", seed=seed, seconds=seconds, port=port, overrides=overrides) as run:
        try:
            returns = checkpoint_team_returns(run.run_dir, episodes=episodes, seed=seed + EVAL_SEED_OFFSET)
            error = None
        except LoadPolicyError as err:
            returns, error = [], str(err)
        curve = team_return_curve(run.run_dir, seed)
        cost = update_cost(run.run_dir)
    agent_steps = run.agent_steps
    return {"bench": "coma_spread", "mode": "pipeline", "policy": "coma", "seed": seed, "train_s": seconds,
            "agent_steps": agent_steps, "transitions": agent_steps // NUM_AGENTS if agent_steps is not None else None,
            **cost, "learner_exit_code": run.learner_exit_code, "episodes": len(returns),
            "team_return_mean": round(float(np.mean(returns)), 2) if returns else None,
            "evaluate_error": error}, curve


def train_serial(args: argparse.Namespace) -> None:
    """``--mode serial``: COMA in this process (``learner.coma.serial``), one seed after another."""
    section = load_config(None, args.overrides).coma
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
        returns = evaluate_team_return(eval_env, trainer.coma, eval_buffers, episodes=args.episodes,
                                       seed=seed + EVAL_SEED_OFFSET)
        emit({"bench": "coma_spread", "mode": "serial", "policy": "coma", "seed": seed,
              "train_s": round(time.monotonic() - started, 1), "transitions": trainer.transitions,
              "episodes": len(returns),
              "team_return_mean": round(float(np.mean(returns)), 2), "default_action": section.default_action})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("pipeline", "serial"), default="pipeline",
                        help="train through the real learner and actor processes, or in this one process")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=600.0, help="training wall-clock per seed")
    parser.add_argument("--episodes", type=int, default=200, help="evaluation episodes")
    parser.add_argument("--envs", type=int, default=16, help="serial: envs stepped together while collecting")
    parser.add_argument("--port", type=int, default=6310,
                        help="pipeline: the learner's network.port (and the next three)")
    parser.add_argument("--plot", type=Path, default=None, help="pipeline: write the learning curves as this PNG")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="serial: coma.KEY=VALUE over the defaults; pipeline: the learner's --set")
    args = parser.parse_args()
    baselines = {}
    for policy in ("random", "scripted"):
        returns = baseline_returns(policy, episodes=args.episodes, seed=BASELINE_SEED)
        baselines[policy] = round(float(np.mean(returns)), 2)
        emit({"bench": "coma_spread", "policy": policy, "episodes": len(returns),
              "team_return_mean": baselines[policy]})
    if args.mode == "serial":
        train_serial(args)
        return
    curves = []
    for seed in args.seeds:
        record, curve = pipeline_trial(seed, seconds=args.seconds, episodes=args.episodes, port=args.port,
                                       overrides=args.overrides)
        emit(record)
        curves.extend([curve] if curve is not None else [])
    if args.plot is not None:
        draw(curves, metric="team return (3 x episode_return_mean)", x_axis="agent steps", out=args.plot,
             baselines=[("random policy", baselines["random"]), ("scripted controller", baselines["scripted"])])
        print(f"wrote {args.plot} ({len(curves)} curves)", flush=True)


if __name__ == "__main__":
    main()
