"""Run a loaded policy for a number of episodes on its run's env, in this process, and collect their returns.

The env is built with ``envs.registry.make_vec_env`` as an actor worker builds it and stepped through private
``StepBuffers``. The policy acts only for ``active`` slots (under their action masks), keeps a recurrent state
per slot (zero width for an MLP), zeroed when the slot's episode ends. Every agent's episode counts, as in the
learner's metrics: a multi-agent env's episode gives one return per agent, and a two-player env plays the
policy against itself.

Episodes are counted per agent slot: slot ``s`` of ``S`` counts its first ``ceil((episodes - s) / S)``
episodes whatever their length, so short episodes are not favoured; a slot past its share keeps playing until
the others finish, uncounted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from envs.base import StepBuffers, VecEnv
from envs.registry import make_vec_env
from evaluation.load_policy import LoadedPolicy

MAX_ENVS = 16
"""Envs stepped at once (fewer when fewer episodes are asked for)."""

StepObserver = Callable[[VecEnv, StepBuffers], None]
"""Called after the reset and after every step while env 0 still has episodes to count (to draw frames)."""


@dataclass(frozen=True, kw_only=True)
class EpisodeResults:
    """Returns and lengths of the counted episodes, one entry per agent episode."""

    returns: np.ndarray
    """[episodes] float64 undiscounted returns."""
    lengths: np.ndarray
    """[episodes] int64 lengths in steps."""


def run_episodes(loaded: LoadedPolicy, *, episodes: int, deterministic: bool = False, seed: int = 0,
                 observer: StepObserver | None = None) -> EpisodeResults:
    """Play ``episodes`` agent episodes with ``loaded``'s policy on its run's env.

    ``deterministic`` takes the most probable legal action instead of sampling; ``seed`` seeds the env reset and
    the action sampler. ``observer`` sees the env and its buffers after every step while env 0 still counts.
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    agents = loaded.spec.num_agents
    env = make_vec_env(loaded.config.env, min(MAX_ENVS, -(-episodes // agents)))
    try:
        return _play(env, loaded, episodes=episodes, deterministic=deterministic, seed=seed, observer=observer)
    finally:
        env.close()


def _play(env: VecEnv, loaded: LoadedPolicy, *, episodes: int, deterministic: bool, seed: int,
          observer: StepObserver | None) -> EpisodeResults:
    spec, policy = loaded.spec, loaded.policy
    slots = env.num_envs * spec.num_agents
    quota = (episodes - np.arange(slots) + slots - 1) // slots
    counted = np.zeros(slots, dtype=np.int64)
    states = np.zeros((slots, policy.state_size), dtype=np.float32)
    generator = torch.Generator()
    generator.manual_seed(seed)
    buffers = StepBuffers.allocate(spec, env.num_envs)
    env.reset(buffers, seed)
    returns: list[float] = []
    lengths: list[int] = []
    env0 = slice(0, spec.num_agents)
    while (counted < quota).any():
        if observer is not None and (counted[env0] < quota[env0]).any():
            observer(env, buffers)
        rows = np.flatnonzero(buffers.active)
        if len(rows):
            actions, states[rows] = _act(loaded, buffers, rows, states[rows], deterministic, generator)
            buffers.actions[rows] = actions.reshape(buffers.actions[rows].shape)
        env.step(buffers)
        ended = buffers.episode_done.astype(bool)
        counting = np.flatnonzero(ended & (counted < quota))
        returns.extend(buffers.episode_return[counting].tolist())
        lengths.extend(buffers.episode_length[counting].tolist())
        counted[ended] += 1
        states[ended | buffers.terminated | buffers.truncated] = 0.0
    return EpisodeResults(returns=np.asarray(returns, dtype=np.float64), lengths=np.asarray(lengths, dtype=np.int64))


@torch.no_grad()
def _act(loaded: LoadedPolicy, buffers: StepBuffers, rows: np.ndarray, states: np.ndarray, deterministic: bool,
         generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Actions and new recurrent states of the agents in ``rows``."""
    policy = loaded.policy
    params, _, new_states = policy.step(torch.from_numpy(buffers.obs[rows]), torch.from_numpy(states))
    mask = torch.from_numpy(buffers.action_mask[rows]) if loaded.spec.mask_size else None
    if deterministic:
        actions = policy.distribution.mode(params, mask)
    else:
        actions = policy.distribution.sample(params, mask, generator)[0]
    return actions.numpy(), new_states.numpy()
