"""A tiny native env whose observation is a heavily padded token list (envs.base.TokenLayout), for tests only.

Each agent sees ``rows`` uint8 rows of (location, feature id, value); ``cues`` of them are real and the rest are
padding (location 255, other columns random bytes, which a correct encoder never reads). Real rows sit at random
positions. Feature 0 is the cue: its value says which action pays (value // 64, four actions); the other
features are distractors. Reward 1 for the paying action, else 0; episodes are truncated after ``max_steps``.
"""

from __future__ import annotations

import numpy as np

from envs.base import EnvSpec, StepBuffers, TokenLayout
from envs.spaces import ActionSpace

PAD = 255
"""Location of a padding row."""
NUM_LOCATIONS = 121
"""An 11 x 11 window's cells."""
NUM_FEATURES = 4
"""Feature 0 is the cue; 1..3 are distractors."""
NUM_ACTIONS = 4


class PaddedTokenVec:
    """``num_envs`` one-agent contextual bandits with token observations [rows, 3] (mostly padding)."""

    def __init__(self, num_envs: int, *, max_steps: int, rows: int = 32, cues: int = 3) -> None:
        if not 1 <= cues <= rows:
            raise ValueError(f"PaddedTokenVec needs 1 <= cues <= rows, got cues={cues}, rows={rows}")
        self.num_envs, self.rows, self.cues = num_envs, rows, cues
        self.max_steps = max_steps if max_steps > 0 else 32
        self.spec = self.spec_for(rows)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.returns = np.zeros(num_envs, dtype=np.float32)
        self.paying = np.zeros(num_envs, dtype=np.int64)
        self.rng = np.random.default_rng()

    @staticmethod
    def spec_for(rows: int) -> EnvSpec:
        """The spec of this env with ``rows`` token rows per observation."""
        return EnvSpec(num_agents=1, obs_shape=(rows, 3), obs_dtype="uint8", action=ActionSpace.discrete(NUM_ACTIONS),
                       tokens=TokenLayout(num_locations=NUM_LOCATIONS, num_features=NUM_FEATURES, pad_value=PAD))

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Fresh episodes everywhere; first observations written."""
        self.rng = np.random.default_rng(seed)
        buffers.clear_step_outputs()
        self.steps[:] = 0
        self.returns[:] = 0
        buffers.obs[:] = self._observe()

    def step(self, buffers: StepBuffers) -> None:
        """Reward the paying action, truncate at max_steps, write the next observation."""
        rewards = (buffers.actions.reshape(-1) == self.paying).astype(np.float32)
        self.steps += 1
        self.returns += rewards
        ending = self.steps >= self.max_steps
        buffers.rewards[:] = rewards
        buffers.terminated[:] = False
        buffers.truncated[:] = ending
        buffers.episode_done[:] = ending
        buffers.episode_return[:] = self.returns
        buffers.episode_length[:] = self.steps
        next_obs = self._observe()
        buffers.final_obs[ending] = next_obs[ending]
        self.steps[ending] = 0
        self.returns[ending] = 0
        buffers.obs[:] = next_obs

    def close(self) -> None:
        """Nothing to release."""

    def _observe(self) -> np.ndarray:
        obs = self.rng.integers(0, 256, size=(self.num_envs, self.rows, 3), dtype=np.uint8)
        obs[:, :, 0] = PAD
        for env in range(self.num_envs):
            where = self.rng.choice(self.rows, size=self.cues, replace=False)
            obs[env, where, 0] = self.rng.integers(0, NUM_LOCATIONS, size=self.cues)
            obs[env, where, 1] = np.concatenate([[0], self.rng.integers(1, NUM_FEATURES, size=self.cues - 1)])
        cue = np.argmax((obs[:, :, 0] != PAD) & (obs[:, :, 1] == 0), axis=1)
        self.paying = obs[np.arange(self.num_envs), cue, 2].astype(np.int64) // 64
        return obs
