"""Envs with structured (nested Dict / Tuple) observations for the adapter tests: one Gymnasium env (also as a
vector env) and one PettingZoo ParallelEnv of two agents, with an action mask and a token-list key."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from pettingzoo import ParallelEnv

OBS_SPACE = spaces.Dict({
    "action_mask": spaces.MultiBinary(3),
    "grid": spaces.Box(0, 255, (5, 5, 2), np.uint8),
    "pos": spaces.Tuple((spaces.Discrete(6, start=1), spaces.Box(-1.0, 1.0, (2,), np.float32))),
    "flags": spaces.MultiBinary(4),
    "cells": spaces.Box(0, 255, (4, 3), np.uint8),
})
"""Every leaf kind, nested, a legal-action mask and a [4, 3] uint8 key that a config may declare a token list."""
EPISODE = 4
"""Steps per episode."""


def obs_at(seed: int, t: int, *, bad: str = "") -> dict[str, Any]:
    """The observation after ``t`` steps of an episode seeded ``seed`` (``bad`` names a leaf to break)."""
    rng = np.random.default_rng(seed * 100 + t)
    mask = np.ones(3, np.int8)
    mask[t % 3] = 0
    obs = {"action_mask": mask, "grid": rng.integers(0, 256, (5, 5, 2)).astype(np.uint8),
           "pos": (np.int64(1 + (seed + t) % 6), rng.uniform(-1, 1, 2).astype(np.float32)),
           "flags": rng.integers(0, 2, 4).astype(np.int8),
           "cells": np.array([[t % 5, 1, 7], [4, 0, 2], [255, 0, 0], [255, 0, 0]], np.uint8)}
    if bad == "pos.0":
        obs["pos"] = (np.int64(7), obs["pos"][1])
    elif bad == "grid":
        obs["grid"] = obs["grid"][:, :, :1]
    return obs


class StructuredEnv(gymnasium.Env):
    """Observations ``obs_at(seed, t)``; an illegal action raises; ``bad_at`` > 0 breaks leaf ``bad`` then."""

    observation_space = OBS_SPACE
    action_space = spaces.Discrete(3)

    def __init__(self, bad: str = "", bad_at: int = 0) -> None:
        self.bad, self.bad_at = bad, bad_at
        self.seed_value, self.t = 0, 0

    def _obs(self) -> dict[str, Any]:
        return obs_at(self.seed_value, self.t, bad=self.bad if self.t == self.bad_at else "")

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.seed_value = seed if seed is not None else self.seed_value + 1000
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        if not self._obs()["action_mask"][action]:
            raise ValueError(f"illegal action {action} at step {self.t}")
        self.t += 1
        return self._obs(), 1.0, self.t >= EPISODE, False, {}


def make_vec(num_envs: int, **kwargs: Any) -> SyncVectorEnv:
    """``num_envs`` StructuredEnvs in a SyncVectorEnv (NEXT_STEP autoreset)."""
    return SyncVectorEnv([lambda: StructuredEnv(**kwargs) for _ in range(num_envs)])


class StructuredParallelEnv(ParallelEnv):
    """Two agents; agent j's observation is ``obs_at(seed + j, t)``."""

    metadata = {"name": "structured_parallel"}
    possible_agents = ["a", "b"]

    def __init__(self, bad: str = "") -> None:
        self.bad = bad
        self.agents: list[str] = []
        self.seed_value, self.t = 0, 0

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_SPACE

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def _observations(self) -> dict[str, dict]:
        bad = self.bad if self.t == 1 else ""
        return {agent: obs_at(self.seed_value + j, self.t, bad=bad if agent == "b" else "")
                for j, agent in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.seed_value = seed if seed is not None else self.seed_value + 1000
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        done = self.t >= EPISODE
        observations = self._observations()
        flags = {agent: done for agent in self.agents}
        if done:
            self.agents = []
        return (observations, {agent: 1.0 for agent in flags}, flags, {agent: False for agent in flags},
                {agent: {} for agent in flags})
