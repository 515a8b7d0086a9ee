"""Learner probe envs: tiny vectorised tasks whose right answer is known in closed form.

- ``TruncationProbeVec`` (``probe_truncation``): a constant zero observation, reward 1 every step, never
  terminal, truncated after ``max_steps`` steps. With time-limit bootstrapping the value of the (only)
  observation converges to ``1 / (1 - gamma)``; a learner that treats truncation as termination gets the
  mean truncated discounted sum instead.
- ``MemoryProbeVec`` (``probe_memory``): a cue of +-1 is shown on the first observation only; ``delay``
  steps later an answer flag appears and the action taken there ends the episode with reward +1 if it
  names the cue, else -1. A policy without memory averages 0, one with memory 1.

Both follow the ``VecEnv`` contract of ``envs.base`` like ``CartPoleVec``: they write into caller-owned
``StepBuffers`` (in place, never rebinding an array), auto-reset inside ``step`` and are stepped with whole-array
NumPy operations (no per-env Python loop). Every env of one instance starts its episodes together and all
episodes have the same length, so all envs end their episodes on the same step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError

MEMORY_DEFAULT_DELAY = 8
"""Steps between the cue and the answer observation when env.kwargs has no 'delay'."""
MEMORY_KWARGS = ("delay",)
"""The env.kwargs keys probe_memory accepts."""


def _check_actions(name: str, actions: np.ndarray, num_actions: int) -> None:
    """ValueError naming the first out-of-range action (one vectorised test on the happy path)."""
    bad = (actions < 0) | (actions >= num_actions)
    if bad.any():
        i = int(np.argmax(bad))
        raise EnvConfigError(f"{name}: action {int(actions[i])} for env {i} is out of range; "
                         f"actions must be 0 or 1")


def memory_delay(kwargs: Mapping[str, Any]) -> int:
    """The validated ``delay`` of probe_memory's ``env.kwargs`` (ValueError naming the key and what is allowed)."""
    unknown = sorted(str(k) for k in kwargs if k not in MEMORY_KWARGS)
    if unknown:
        raise EnvConfigError(f"env.kwargs for env 'probe_memory' has unknown keys {unknown}; "
                         f"the only allowed key is 'delay'")
    delay = kwargs.get("delay", MEMORY_DEFAULT_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, (int, np.integer)) or delay < 1:
        raise EnvConfigError(f"env.kwargs.delay for env 'probe_memory' must be an integer >= 1, got {delay!r}")
    return int(delay)


class TruncationProbeVec:
    """``num_envs`` copies of: zero observation, reward 1, never terminal, truncated at ``max_steps`` steps."""

    SPEC = EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.discrete(2))

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        """Create ``num_envs`` envs whose episodes are cut after exactly ``max_steps`` (>= 1) steps."""
        if num_envs <= 0:
            raise EnvConfigError(f"TruncationProbeVec needs num_envs >= 1, got {num_envs}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise EnvConfigError(f"env.max_steps for env 'probe_truncation' must be an integer >= 1 "
                             f"(the time limit is the point of this probe), got {max_steps!r}")
        self.spec: EnvSpec = self.SPEC
        self.num_envs: int = num_envs
        self.max_steps: int = int(max_steps)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._started = False

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Start every episode (the seed is accepted for the contract; nothing here is random)."""
        self._steps[:] = 0
        self._started = True
        buffers.obs[: self.num_envs] = 0.0
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        """Reward 1; truncate (final_obs = zeros, episode stats) and restart the envs at ``max_steps``."""
        if not self._started:
            raise RuntimeError("TruncationProbeVec.step() called before reset()")
        _check_actions("TruncationProbeVec", buffers.actions, self.spec.num_actions)
        self._steps += 1
        done = self._steps >= self.max_steps
        buffers.rewards[:] = 1.0
        buffers.terminated[:] = False
        buffers.truncated[:] = done
        buffers.episode_done[:] = done
        # Reward is 1 per step, so an ended episode's return equals its length.
        np.multiply(self._steps, done, out=buffers.episode_length, casting="unsafe")
        buffers.episode_return[:] = buffers.episode_length
        buffers.final_obs[:] = 0.0  # the last observation of every episode (and the rest) is all zeros
        self._steps[done] = 0
        buffers.obs[:] = 0.0

    def close(self) -> None:
        """Nothing to release."""


class MemoryProbeVec:
    """``num_envs`` copies of the cue-recall task: episodes of ``delay + 1`` steps.

    Observation ``t`` of an episode (``t = 0 .. delay``): ``obs[0]`` is +1 (cue 1) or -1 (cue 0) at ``t = 0``
    and 0 afterwards; ``obs[1]`` is 1 at ``t = delay`` (answer now) and 0 elsewhere; ``obs[2]`` is always 0.
    The action taken on observation ``delay`` terminates the episode with reward +1 if it equals the cue,
    else -1; every other step gives 0. Cues come from a ``Generator`` seeded by ``reset`` (one draw for all
    envs at reset, one for the envs that restart at each auto-reset), so a run is a deterministic function of
    the seed and the actions.
    """

    SPEC = EnvSpec(num_agents=1, obs_shape=(3,), obs_dtype="float32", action=ActionSpace.discrete(2))

    def __init__(self, num_envs: int, *, delay: int = MEMORY_DEFAULT_DELAY) -> None:
        """Create ``num_envs`` envs whose answer comes ``delay`` (>= 1) steps after the cue."""
        if num_envs <= 0:
            raise EnvConfigError(f"MemoryProbeVec needs num_envs >= 1, got {num_envs}")
        self.spec: EnvSpec = self.SPEC
        self.num_envs: int = num_envs
        self.delay: int = memory_delay({"delay": delay})
        self._t = np.zeros(num_envs, dtype=np.int64)
        self._cue = np.zeros(num_envs, dtype=np.int32)
        self._rng: np.random.Generator | None = None

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reseed, draw a cue per env, write the cue observations and clear everything else."""
        self._rng = np.random.default_rng(seed)
        self._cue[:] = self._rng.integers(0, 2, size=self.num_envs)
        self._t[:] = 0
        buffers.clear_step_outputs()
        self._write_obs(buffers.obs)

    def step(self, buffers: StepBuffers) -> None:
        """Reward +-1 and terminate on the answer step (then a fresh cue), 0 on every other step."""
        if self._rng is None:
            raise RuntimeError("MemoryProbeVec.step() called before reset()")
        actions = buffers.actions
        _check_actions("MemoryProbeVec", actions, self.spec.num_actions)
        done = self._t >= self.delay
        reward = np.where(actions == self._cue, np.float32(1.0), np.float32(-1.0))
        buffers.rewards[:] = np.where(done, reward, np.float32(0.0))
        buffers.terminated[:] = done
        buffers.truncated[:] = False
        buffers.episode_done[:] = done
        # Only the answer step is rewarded, so an ended episode's return is its last reward.
        buffers.episode_return[:] = buffers.rewards
        buffers.episode_length[:] = np.where(done, self.delay + 1, 0)
        self._t += 1
        if done.any():
            self._t[done] = 0
            self._cue[done] = self._rng.integers(0, 2, size=int(done.sum()))
        self._write_obs(buffers.obs)

    def _write_obs(self, obs: np.ndarray) -> None:
        first = self._t == 0
        obs[: self.num_envs, 0] = np.where(first, np.where(self._cue == 1, 1.0, -1.0), 0.0)
        obs[: self.num_envs, 1] = self._t == self.delay
        obs[: self.num_envs, 2] = 0.0

    def close(self) -> None:
        """Nothing to release."""
