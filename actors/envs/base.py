"""The native vectorised environment contract every env in Sluice implements.

An env owns ``num_envs`` environments of ``num_agents`` agents each, so ``num_envs * num_agents`` agent
slots. It never allocates its outputs: the caller hands it a ``StepBuffers`` whose arrays are views into
shared memory, and ``reset``/``step`` write straight into them. Episodes auto-reset inside ``step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """What an env declares up front; carried unchanged through actors, wire and learner."""

    num_agents: int
    """Agents per environment."""
    obs_shape: tuple[int, ...]
    """Shape of one agent's observation."""
    obs_dtype: str
    """NumPy dtype name of observations (kept end to end: uint8 stays uint8)."""
    num_actions: int
    """Size of the discrete action space of one agent."""


@dataclass(frozen=True, kw_only=True)
class StepBuffers:
    """Per-agent-slot arrays an env reads actions from and writes results into (length = agent slots)."""

    obs: np.ndarray
    """[A, *obs_shape] observation after the step (the first obs of the next episode after an auto-reset)."""
    actions: np.ndarray
    """[A] int32 actions to apply (input)."""
    rewards: np.ndarray
    """[A] float32 reward of the transition just taken."""
    terminated: np.ndarray
    """[A] bool: the episode reached a terminal state on this step."""
    truncated: np.ndarray
    """[A] bool: the episode was cut by a time limit on this step (and did not terminate)."""
    final_obs: np.ndarray
    """[A, *obs_shape] the last observation of an episode that was truncated on this step."""
    episode_done: np.ndarray
    """[A] bool: an episode ended on this step; episode_return/length are valid there."""
    episode_return: np.ndarray
    """[A] float32 undiscounted return of the episode that ended."""
    episode_length: np.ndarray
    """[A] int32 length in steps of the episode that ended."""

    def clear_step_outputs(self) -> None:
        """Zero rewards, flags, final observations and episode stats (what a reset leaves behind)."""
        for array in (self.rewards, self.terminated, self.truncated, self.final_obs, self.episode_done,
                      self.episode_return, self.episode_length):
            array[:] = 0

    @staticmethod
    def allocate(spec: EnvSpec, num_envs: int) -> "StepBuffers":
        """Private (non-shared) buffers, for tests and single-process use."""
        slots = num_envs * spec.num_agents
        return StepBuffers(
            obs=np.zeros((slots, *spec.obs_shape), dtype=spec.obs_dtype),
            actions=np.zeros(slots, dtype=np.int32),
            rewards=np.zeros(slots, dtype=np.float32),
            terminated=np.zeros(slots, dtype=np.bool_),
            truncated=np.zeros(slots, dtype=np.bool_),
            final_obs=np.zeros((slots, *spec.obs_shape), dtype=spec.obs_dtype),
            episode_done=np.zeros(slots, dtype=np.bool_),
            episode_return=np.zeros(slots, dtype=np.float32),
            episode_length=np.zeros(slots, dtype=np.int32),
        )


class VecEnv(Protocol):
    """A batch of environments stepped together into caller-owned buffers."""

    spec: EnvSpec
    num_envs: int

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset every env; write first observations, zero rewards and all flags."""

    def step(self, buffers: StepBuffers) -> None:
        """Apply ``buffers.actions``; write results; auto-reset the envs whose episode ended."""

    def close(self) -> None:
        """Release resources."""
