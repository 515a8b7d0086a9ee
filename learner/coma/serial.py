"""COMA in one process (the serial mode): step a cooperative continuous VecEnv, fill the replay buffer with joint
transitions, train, evaluate. The seed's training loop as written (seeds/004), for tests, the credit-assignment
probe and ``ops/experiments/coma_spread.py``; the distributed path feeds the same ``Coma`` from actor hosts' rows.

The env must have Box actions and give its global state: ``global_state(out)`` and ``final_global_state(out)``
(``[num_envs, state_dim]`` float32; the final one is the last state of an episode that the last step ended, as
``final_obs`` is the last observation), like ``envs.builtin.simple_spread.SimpleSpreadVec``.

Rollouts and epochs: a rollout is ``coma.rollout_length`` joint transitions (over all envs); after each, ``coma.epochs``
epochs of ``ceil(rollout_length / batch_size)`` minibatches each, sampled uniformly from the replay buffer, so every
epoch draws about as many transitions as the rollout added (the seed gives "10 epochs per rollout" and a batch of
64 without saying how many minibatches an epoch holds; this is the reading in which an epoch is one pass's worth).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from configs.schema import ComaSection
from envs.base import StepBuffers
from learner.coma.algorithm import Coma, ComaShapes, transition_fields
from learner.coma.replay_buffer import ReplayBuffer


class CooperativeVecEnv(Protocol):
    """What the serial loop needs of an env (``SimpleSpreadVec`` has it)."""

    num_envs: int
    num_agents: int
    state_dim: int

    def reset(self, buffers: StepBuffers, seed: int) -> None: ...
    def step(self, buffers: StepBuffers) -> None: ...
    def global_state(self, out: np.ndarray) -> None: ...
    def final_global_state(self, out: np.ndarray) -> None: ...


@dataclass(kw_only=True)
class EpisodeLog:
    """Team returns (the sum over agents of an episode's return) as episodes end."""

    team_returns: list[float] = field(default_factory=list)
    """Every finished episode's team return, in order."""

    def record(self, buffers: StepBuffers, num_agents: int) -> None:
        """Add the episodes the last step ended (an env's agents end together)."""
        done = buffers.episode_done.reshape(-1, num_agents)
        returns = buffers.episode_return.reshape(-1, num_agents)
        ended = done.all(axis=1)
        self.team_returns.extend(returns[ended].sum(axis=1).tolist())


class SerialComa:
    """One env, one ``Coma``, one replay buffer; ``train`` runs rollouts and epochs until a transition budget."""

    def __init__(self, env: CooperativeVecEnv, spec_shapes: ComaShapes, section: ComaSection, *, seed: int,
                 buffers: StepBuffers) -> None:
        self.env, self.section, self.buffers = env, section, buffers
        self.shapes = spec_shapes
        self.coma = Coma(spec_shapes, section, seed=seed, device=torch.device("cpu"))
        self.replay = ReplayBuffer(section.buffer_size, transition_fields(spec_shapes))
        self.rng = np.random.default_rng(seed)
        self.log = EpisodeLog()
        self.transitions = 0
        self.state = np.zeros((env.num_envs, env.state_dim), np.float32)
        self.final_state = np.zeros_like(self.state)
        env.reset(buffers, seed=seed)
        env.global_state(self.state)

    def _joint(self, array: np.ndarray) -> np.ndarray:
        """Per-slot [E * N, ...] -> per-env [E, N, ...]."""
        return array.reshape(self.env.num_envs, self.env.num_agents, *array.shape[1:])

    def collect(self, transitions: int) -> None:
        """Step every env until at least ``transitions`` joint transitions went into the replay buffer."""
        buffers, env = self.buffers, self.env
        added = 0
        while added < transitions:
            obs = self._joint(buffers.obs).astype(np.float32, copy=True)
            state = self.state.copy()
            pre_tanh, actions, logprobs = self.coma.act(obs)
            buffers.actions[:] = actions.reshape(buffers.actions.shape)
            env.step(buffers)
            self.log.record(buffers, env.num_agents)
            ended = self._joint(buffers.terminated | buffers.truncated).any(axis=1)
            next_obs = self._joint(buffers.obs).astype(np.float32, copy=True)
            env.global_state(self.state)
            next_state = self.state.copy()
            if ended.any():  # the episode's true last observation and state, not the next episode's first
                env.final_global_state(self.final_state)
                next_obs[ended] = self._joint(buffers.final_obs)[ended]
                next_state[ended] = self.final_state[ended]
            self.replay.add({"state": state, "obs": obs, "pre_tanh": pre_tanh, "actions": actions, "logprobs": logprobs,
                             "rewards": self._joint(buffers.rewards).astype(np.float32),
                             "next_state": next_state, "next_obs": next_obs,
                             "terminated": self._joint(buffers.terminated).any(axis=1).astype(np.float32)})
            added += env.num_envs
        self.transitions += added

    def train_epochs(self) -> dict[str, float]:
        """``coma.epochs`` epochs of minibatch steps; returns the last step's metrics and the buffer fill."""
        section = self.section
        steps = section.epochs * math.ceil(section.rollout_length / section.batch_size)
        metrics: dict[str, float] = {}
        for _ in range(steps):
            batch = {name: torch.from_numpy(values)
                     for name, values in self.replay.sample(section.batch_size, self.rng).items()}
            metrics = self.coma.train_step(batch)
        metrics["buffer_fill"] = len(self.replay) / self.replay.capacity
        return metrics

    def train(self, *, total_transitions: int | None = None, seconds: float | None = None,
              on_rollout: Callable[[int, dict[str, float]], None] | None = None) -> None:
        """Rollouts then epochs until ``total_transitions`` were collected or ``seconds`` passed (either may be
        None; one must be given); ``on_rollout(transitions, metrics)`` after each."""
        if total_transitions is None and seconds is None:
            raise ValueError("SerialComa.train: give total_transitions or seconds")
        started = time.monotonic()
        while ((total_transitions is None or self.transitions < total_transitions)
               and (seconds is None or time.monotonic() - started < seconds)):
            self.collect(self.section.rollout_length)
            metrics = self.train_epochs()
            if on_rollout is not None:
                on_rollout(self.transitions, metrics)


def evaluate_team_return(env: CooperativeVecEnv, coma: Coma, buffers: StepBuffers, *, episodes: int, seed: int,
                         deterministic: bool = True) -> list[float]:
    """Team returns of ``episodes`` whole episodes of ``coma``'s actors (the mean action when ``deterministic``)."""
    return play_team_return(env, lambda obs: coma.act(obs, deterministic=deterministic)[1], buffers,
                            episodes=episodes, seed=seed)


def play_team_return(env: CooperativeVecEnv, choose_actions: Callable[[np.ndarray], np.ndarray],
                     buffers: StepBuffers, *, episodes: int, seed: int) -> list[float]:
    """Team returns of ``episodes`` whole episodes where ``choose_actions`` maps obs [E, N, obs_dim] to env actions
    [E, N, A], from a reset with ``seed``."""
    env.reset(buffers, seed=seed)
    log = EpisodeLog()
    while len(log.team_returns) < episodes:
        obs = buffers.obs.reshape(env.num_envs, env.num_agents, -1)
        buffers.actions[:] = choose_actions(obs).reshape(buffers.actions.shape)
        env.step(buffers)
        log.record(buffers, env.num_agents)
    return log.team_returns[:episodes]
