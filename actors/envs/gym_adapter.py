"""Any registered Gymnasium env (Box observations, Discrete actions) behind Sluice's VecEnv contract.

Holds ``num_envs`` independent ``gymnasium.make`` instances and steps them one after another in Python,
writing into caller-owned ``StepBuffers`` and auto-resetting finished episodes like the native envs do.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from actors.envs.base import EnvSpec, StepBuffers

SUPPORTED = "supported: Box observation spaces (any dtype) and Discrete action spaces"


def _make_one(gym_id: str, max_steps: int, kwargs: dict[str, Any]) -> gymnasium.Env:
    """``gymnasium.make`` one env, turning an unknown id into a ValueError and other failures into RuntimeError."""
    make_kwargs = dict(kwargs)
    if max_steps > 0:
        make_kwargs["max_episode_steps"] = max_steps
    try:
        return gymnasium.make(gym_id, **make_kwargs)
    except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as exc:
        raise ValueError(f"gymnasium has no env with id '{gym_id}': {exc}") from exc
    except Exception as exc:
        raise RuntimeError(f"gymnasium env '{gym_id}' raised in make(): {exc!r}") from exc


def spec_from_spaces(gym_id: str, observation_space: spaces.Space, action_space: spaces.Space) -> EnvSpec:
    """The EnvSpec of a Gymnasium env with these spaces; ValueError for anything unsupported."""
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"gymnasium env '{gym_id}': observation space is {observation_space!r} "
            f"({type(observation_space).__name__}); {SUPPORTED}"
        )
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"gymnasium env '{gym_id}': action space is {action_space!r} ({type(action_space).__name__}); {SUPPORTED}"
        )
    return EnvSpec(
        num_agents=1,
        obs_shape=tuple(int(d) for d in observation_space.shape),
        obs_dtype=np.dtype(observation_space.dtype).name,
        action=ActionSpace.discrete(int(action_space.n)),
    )


class GymnasiumVecEnv:
    """``num_envs`` instances of one Gymnasium env, stepped sequentially into shared buffers.

    Actions ``0..n-1`` map to the Discrete space's ``start..start+n-1``. ``truncated`` is reported only
    when the episode did not also terminate (Gymnasium's TimeLimit may set both on the last step).
    """

    def __init__(self, gym_id: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any]) -> None:
        """Make ``num_envs`` envs; ``max_steps <= 0`` keeps the env's registered time limit."""
        if num_envs <= 0:
            raise ValueError(f"GymnasiumVecEnv needs num_envs >= 1, got {num_envs}")
        self.gym_id = gym_id
        self.num_envs = num_envs
        self._envs: list[gymnasium.Env] = []
        try:
            first = _make_one(gym_id, max_steps, kwargs)
            self._envs.append(first)
            self.spec: EnvSpec = spec_from_spaces(gym_id, first.observation_space, first.action_space)
            for _ in range(num_envs - 1):
                self._envs.append(_make_one(gym_id, max_steps, kwargs))
        except BaseException:
            with contextlib.suppress(RuntimeError):
                self.close()  # the construction error is the one worth reporting
            raise
        action_space = first.action_space
        assert isinstance(action_space, spaces.Discrete)
        self._action_start = int(action_space.start)
        self._obs_dtype = np.dtype(self.spec.obs_dtype)
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def _check_obs(self, obs: Any, call: str, index: int) -> np.ndarray:
        """``obs`` as an array, or ValueError if its shape/dtype differ from the spec."""
        arr = np.asarray(obs)
        if arr.shape != self.spec.obs_shape or arr.dtype != self._obs_dtype:
            raise ValueError(
                f"gymnasium env '{self.gym_id}' (env {index}) {call}() returned an observation with "
                f"shape {arr.shape} dtype {arr.dtype}; expected shape {self.spec.obs_shape} "
                f"dtype {self.spec.obs_dtype} (from its observation_space)"
            )
        return arr

    def _reset_one(self, index: int, seed: int | None) -> np.ndarray:
        """Reset env ``index`` and return its validated first observation."""
        try:
            obs, _info = self._envs[index].reset(seed=seed)
        except Exception as exc:
            raise RuntimeError(f"gymnasium env '{self.gym_id}' (env {index}) raised in reset(): {exc!r}") from exc
        return self._check_obs(obs, "reset", index)

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset env ``i`` with seed ``seed + i``; write first observations and clear everything else."""
        for i in range(self.num_envs):
            buffers.obs[i] = self._reset_one(i, seed + i)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        """Step every env with ``buffers.actions``; write results; auto-reset (unseeded) ended episodes."""
        for i, env in enumerate(self._envs):
            action = int(buffers.actions[i])
            if not 0 <= action < self.spec.num_actions:
                raise ValueError(
                    f"gymnasium env '{self.gym_id}' (env {i}): action {action} is out of range "
                    f"[0, {self.spec.num_actions})"
                )
            try:
                obs, reward, term, trunc, _info = env.step(action + self._action_start)
            except Exception as exc:
                raise RuntimeError(f"gymnasium env '{self.gym_id}' (env {i}) raised in step(): {exc!r}") from exc
            arr = self._check_obs(obs, "step", i)
            terminated = bool(term)
            truncated = bool(trunc) and not terminated
            buffers.rewards[i] = reward
            buffers.terminated[i] = terminated
            buffers.truncated[i] = truncated
            self._returns[i] += float(reward)
            self._lengths[i] += 1
            if terminated or truncated:
                buffers.episode_done[i] = True
                buffers.episode_return[i] = self._returns[i]
                buffers.episode_length[i] = self._lengths[i]
                if truncated:
                    buffers.final_obs[i] = arr
                self._returns[i] = 0.0
                self._lengths[i] = 0
                arr = self._reset_one(i, None)
            else:
                buffers.episode_done[i] = False
            buffers.obs[i] = arr

    def close(self) -> None:
        """Close every env made so far (best effort: the first failure is re-raised after closing the rest)."""
        first_error: Exception | None = None
        for env in self._envs:
            try:
                env.close()
            except Exception as exc:  # keep closing the others
                first_error = first_error or exc
        self._envs = []
        if first_error is not None:
            raise RuntimeError(f"gymnasium env '{self.gym_id}' raised in close(): {first_error!r}") from first_error
