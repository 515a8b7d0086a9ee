"""A worked example of Sluice's native vectorised env API (docs/ENVIRONMENTS.md explains it line by line).

Corridor: each env holds ``num_agents`` agents on a line of ``length`` cells. Every agent starts at a random
cell and must walk to the goal at the right end: actions 0 left, 1 stay, 2 right. "left" is illegal at the
left wall (the action mask says so). Reaching the goal gives +1 and ends that agent's part of the episode;
each step costs -0.01. An env's episode ends when all its agents are home (terminated) or after ``max_steps``
(truncated). Agents that are home early sit out (inactive) until their env resets, and get their +1 with the
first observation of the next episode, exactly as the StepBuffers contract asks. One named statistic,
``steps_to_goal`` (mean over the env's agents that made it), is reported at episode end.

Run it: ``python -m learner --config configs/corridor.yaml`` and ``python -m actors --n 2``.
"""

from __future__ import annotations

import numpy as np

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace

LEFT, STAY, RIGHT = 0, 1, 2


class CorridorVec:
    """``num_envs`` corridors of ``num_agents`` agents; agent slot of agent a of env e is ``e * num_agents + a``."""

    def __init__(self, num_envs: int, *, max_steps: int, num_agents: int = 2, length: int = 8) -> None:
        if num_envs < 1 or num_agents < 1 or length < 2:
            raise ValueError(f"CorridorVec needs num_envs, num_agents >= 1 and length >= 2, "
                             f"got {num_envs}, {num_agents}, {length}")
        self.num_envs, self.num_agents, self.length = num_envs, num_agents, length
        self.max_steps = max_steps if max_steps > 0 else 4 * length
        # 1. Declare everything up front: observation shape and dtype, action space, masks, named stats.
        self.spec = EnvSpec(num_agents=num_agents, obs_shape=(length,), obs_dtype="uint8",
                            action=ActionSpace.discrete(3), action_mask=True, episode_stats=("steps_to_goal",))
        slots = num_envs * num_agents
        self.pos = np.zeros(slots, dtype=np.int64)
        self.home = np.zeros(slots, dtype=bool)
        self.home_at = np.zeros(slots, dtype=np.int64)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.returns = np.zeros(slots, dtype=np.float32)
        self.held_reward = np.zeros(slots, dtype=np.float32)
        self.rng = np.random.default_rng()

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """2. Reset every env, write first observations and masks; clear_step_outputs() does the rest."""
        self.rng = np.random.default_rng(seed)
        buffers.clear_step_outputs()  # rewards/flags/stats zeroed, every slot active, every action legal
        self._new_episodes(np.arange(self.num_envs))
        buffers.obs[:] = self._observe()
        buffers.action_mask[:] = self._masks()

    def step(self, buffers: StepBuffers) -> None:
        """3. Apply buffers.actions to active agents, write results in place, auto-reset finished envs."""
        actions = buffers.actions
        if ((actions < 0) | (actions > 2)).any():  # a clear error beats a silent wrong move
            raise ValueError(f"CorridorVec: actions must be 0, 1 or 2, got {actions[(actions < 0) | (actions > 2)]}")
        walking = ~self.home
        self.pos[walking] = np.clip(self.pos[walking] + actions[walking] - 1, 0, self.length - 1)
        arrived = walking & (self.pos == self.length - 1)
        rewards = np.where(walking, -0.01, 0.0).astype(np.float32) + arrived
        self.steps += 1
        self.home |= arrived
        self.home_at[arrived] = np.repeat(self.steps, self.num_agents)[arrived]
        self.returns += rewards
        # Agents home before the rest of their env: their reward is held for their next active step.
        self.held_reward += rewards
        by_env = self.home.reshape(self.num_envs, self.num_agents)
        done_envs = by_env.all(axis=1)
        timed_out = ~done_envs & (self.steps >= self.max_steps)
        ending = np.repeat(done_envs | timed_out, self.num_agents)
        buffers.episode_done[:] = arrived | (ending & ~self.home)  # each agent's episode, on the step it ends
        buffers.episode_return[:] = self.returns
        buffers.episode_length[:] = np.where(arrived, self.home_at, np.repeat(self.steps, self.num_agents))
        buffers.episode_stats[:, 0] = np.where(arrived, self.home_at, 0)
        buffers.active[:] = ~self.home | ending  # home early: sit out until the env resets
        buffers.rewards[:] = np.where(buffers.active, self.held_reward, 0.0)
        self.held_reward[buffers.active] = 0.0
        buffers.terminated[:] = ending & self.home  # reached the goal (now or earlier)
        buffers.truncated[:] = ending & ~self.home  # still walking when the time limit hit
        truncated = buffers.truncated
        buffers.final_obs[truncated] = self._observe()[truncated]  # last obs of a time-limited episode
        self.returns[arrived | ending] = 0.0
        self._new_episodes(np.flatnonzero(done_envs | timed_out))  # auto-reset: obs below is the new first obs
        buffers.obs[:] = self._observe()
        buffers.action_mask[:] = self._masks()

    def close(self) -> None:
        """4. Nothing to release (a native env owning threads or files would do it here)."""

    def _new_episodes(self, envs: np.ndarray) -> None:
        slots = (envs[:, None] * self.num_agents + np.arange(self.num_agents)).reshape(-1)
        self.pos[slots] = self.rng.integers(0, self.length - 1, size=len(slots))
        self.home[slots] = False
        self.steps[envs] = 0
        self.returns[slots] = 0.0

    def _observe(self) -> np.ndarray:
        obs = np.zeros((len(self.pos), self.length), dtype=np.uint8)
        obs[np.arange(len(self.pos)), self.pos] = 255
        return obs

    def _masks(self) -> np.ndarray:
        masks = np.ones((len(self.pos), 3), dtype=np.uint8)
        masks[self.pos == 0, LEFT] = 0
        return masks
