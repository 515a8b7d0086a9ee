"""A worked example of a Gymnasium env whose observation is a padded token list, declared to Sluice with env.tokens.

TokenCue: each step the agent sees ``rows`` uint8 rows of (location, feature id, value); ``cues`` of them are real
and the rest are padding (location 0xFF, the other two columns random bytes, as packed multi-agent gridworlds emit
them). Real rows sit at random positions. Feature 0 is the cue: its value says which of the four actions pays
(value // 64); the other features are distractors. Reward 1 for the paying action, else 0; an episode is
``episode_steps`` steps (a time limit: truncated).

Gymnasium sees a plain ``Box(0, 255, (rows, 3), uint8)``; nothing in it says "token list", so the config declares
the layout (configs/token_cue.yaml):

    env:
      name: gymnasium_vector
      entry_point: examples.token_cue:make_vec
      tokens: {num_locations: 121, num_features: 4, pad_value: 255}

and ``model.encoder: auto`` then picks the token encoder, which embeds each real row and pools them with the padding
masked out. Without the declaration the flat MLP reads the padding's random bytes as input.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

PAD = 0xFF
"""Location of a padding row."""
NUM_LOCATIONS = 121
"""An 11 x 11 window's cells."""
NUM_FEATURES = 4
"""Feature 0 is the cue; 1..3 are distractors."""
NUM_ACTIONS = 4


class TokenCue(gym.Env):
    """One agent, a contextual bandit with token-list observations."""

    def __init__(self, rows: int = 32, cues: int = 3, episode_steps: int = 32) -> None:
        if not 1 <= cues <= rows:
            raise ValueError(f"TokenCue needs 1 <= cues <= rows, got cues={cues}, rows={rows}")
        self.rows, self.cues, self.episode_steps = rows, cues, episode_steps
        self.observation_space = gym.spaces.Box(0, 255, shape=(rows, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.steps = 0
        self.paying = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.paying)
        self.steps += 1
        return self._observe(), reward, False, self.steps >= self.episode_steps, {}

    def _observe(self) -> np.ndarray:
        rng = self.np_random
        obs = rng.integers(0, 256, size=(self.rows, 3), dtype=np.uint8)
        obs[:, 0] = PAD
        where = rng.choice(self.rows, size=self.cues, replace=False)
        obs[where, 0] = rng.integers(0, NUM_LOCATIONS, size=self.cues)
        obs[where, 1] = np.concatenate([[0], rng.integers(1, NUM_FEATURES, size=self.cues - 1)])
        self.paying = int(obs[where[0], 2]) // 64
        return obs


def make_vec(num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    """``num_envs`` TokenCue envs in one Gymnasium vector env (what ``env.name: gymnasium_vector`` calls)."""
    return gym.vector.SyncVectorEnv([lambda: TokenCue(**kwargs) for _ in range(num_envs)])
