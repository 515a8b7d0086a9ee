"""A synthetic env that costs a fixed time per env step: the benchmark's stand-in for a real simulator.

``SyntheticVec`` does no physics. Each ``step`` spins (busy-waits, like a simulator computing) for
``step_us`` microseconds per env, then writes a constant-size observation, reward 0 and, every
``max_steps`` steps, a truncation. With it, ``ops/bench/pipeline.py`` measures how much of a core the
pipeline leaves to an env whose own cost is known exactly. Use it as a native env:
``env.name: native``, ``env.entry_point: envs.builtin.synthetic:SyntheticVec``, ``env.kwargs: {step_us: 20}``.
"""

from __future__ import annotations

import time

import numpy as np

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError


class SyntheticVec:
    """``num_envs`` single-agent envs of ``obs_size`` float32 observations and ``num_actions`` actions."""

    def __init__(self, num_envs: int, *, max_steps: int, step_us: float = 20.0, obs_size: int = 4,
                 num_actions: int = 2) -> None:
        if num_envs < 1 or step_us < 0 or obs_size < 1 or num_actions < 1:
            raise EnvConfigError(f"SyntheticVec needs num_envs >= 1, step_us >= 0, obs_size >= 1 and num_actions >= 1, "
                             f"got {num_envs}, {step_us}, {obs_size}, {num_actions}")
        self.num_envs = num_envs
        self.max_steps = max_steps if max_steps > 0 else 500
        self.step_ns = int(round(step_us * 1000 * num_envs))
        self.spec = EnvSpec(num_agents=1, obs_shape=(obs_size,), obs_dtype="float32",
                            action=ActionSpace.discrete(num_actions))
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.returns = np.zeros(num_envs, dtype=np.float32)

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Every env starts at step 0 with a zero observation (offset per env, so episodes end staggered)."""
        buffers.clear_step_outputs()
        self.steps[:] = np.random.default_rng(seed).integers(0, self.max_steps, size=self.num_envs)
        buffers.obs[:] = 0.0
        buffers.obs[:, 0] = self.steps

    def step(self, buffers: StepBuffers) -> None:
        """Spin for step_us per env, then advance every env by one step."""
        deadline = time.perf_counter_ns() + self.step_ns
        while time.perf_counter_ns() < deadline:
            pass
        self.steps += 1
        ending = self.steps >= self.max_steps
        buffers.rewards[:] = 0.0
        buffers.terminated[:] = False
        buffers.truncated[:] = ending
        buffers.episode_done[:] = ending
        buffers.episode_return[:] = self.returns
        buffers.episode_length[:] = self.steps
        buffers.obs[:, 0] = self.steps
        if ending.any():
            buffers.final_obs[ending] = buffers.obs[ending]
            self.steps[ending] = 0
            buffers.obs[ending, 0] = 0.0

    def close(self) -> None:
        """Nothing to release."""
