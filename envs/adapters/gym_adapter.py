"""Any registered Gymnasium env behind Sluice's VecEnv contract.

Holds ``num_envs`` independent ``gymnasium.make`` instances and steps them one after another in Python,
writing into caller-owned ``StepBuffers`` and auto-resetting finished episodes like the native envs do.
Spaces map as ``envs.adapters.gym_spaces`` describes: Box, dict-with-action-mask or structured (Dict / Tuple)
observations, carried flat (``envs.obs_layout``); Discrete,
MultiDiscrete or Box actions (``start`` offsets added, Box actions clipped to the space's bounds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from envs.base import EnvSpec, StepBuffers
from envs.adapters.gym_spaces import SpaceConverter, close_each, reward_value, rendered_frame
from envs.errors import EnvConfigError, EnvRaised


UNREGISTERED_HINT = (" (an env that a package registers when it is imported needs the package named first, "
                     "e.g. env.gym_id: minigrid:MiniGrid-Empty-5x5-v0)")
"""Appended when an id without a package prefix is unknown (gymnasium only knows its own envs until then)."""


def _make_one(gym_id: str, max_steps: int, kwargs: dict[str, Any]) -> gymnasium.Env:
    """``gymnasium.make`` one env, turning an unknown id into a ValueError and other failures into RuntimeError."""
    make_kwargs = dict(kwargs)
    if max_steps > 0:
        make_kwargs["max_episode_steps"] = max_steps
    try:
        return gymnasium.make(gym_id, **make_kwargs)
    except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as exc:
        hint = "" if ":" in gym_id or isinstance(exc, gymnasium.error.DeprecatedEnv) else UNREGISTERED_HINT
        raise EnvConfigError(f"gymnasium has no env with id '{gym_id}': {exc}{hint}") from exc
    except Exception as exc:
        raise EnvRaised(f"gymnasium env '{gym_id}' raised in make(): {exc!r}") from exc


RESET_RESULT = "obs, info"
"""What ``reset`` returns."""
STEP_RESULT = "obs, reward, terminated, truncated, info"
"""What ``step`` returns."""
OLD_API_HINT = ("an env written for gym's old API needs shimmy's GymV21CompatibilityV0 (pip install shimmy) around it, "
                "or its reset and step brought up to date")


class GymnasiumVecEnv:
    """``num_envs`` instances of one Gymnasium env, stepped sequentially into shared buffers.

    Actions ``0..n-1`` map to the Discrete space's ``start..start+n-1`` (likewise per MultiDiscrete
    component); Box actions are clipped to the space's bounds. ``truncated`` is reported only when the
    episode did not also terminate (Gymnasium's TimeLimit may set both on the last step).
    """

    def __init__(self, gym_id: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any],
                 obs_keys: Sequence[str] = ()) -> None:
        """Make ``num_envs`` envs; ``max_steps <= 0`` keeps the env's registered time limit; ``obs_keys``: the
        top-level keys of a Dict observation to keep (all when empty)."""
        if num_envs <= 0:
            raise EnvConfigError(f"GymnasiumVecEnv needs num_envs >= 1, got {num_envs}")
        self.gym_id = gym_id
        self.num_envs = num_envs
        self._envs: list[gymnasium.Env] = []
        try:
            first = _make_one(gym_id, max_steps, kwargs)
            self._envs.append(first)
            self._spaces = SpaceConverter(f"gymnasium env '{gym_id}'", first.observation_space,
                                          first.action_space, obs_keys=obs_keys)
            self.spec: EnvSpec = self._spaces.spec
            for _ in range(num_envs - 1):
                self._envs.append(_make_one(gym_id, max_steps, kwargs))
        except BaseException:
            with contextlib.suppress(RuntimeError):
                self.close()  # the construction error is the one worth reporting
            raise
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def render_first(self) -> np.ndarray:
        """Env 0's current frame as [height, width, 3] uint8, from its ``render()``: the envs must have been made
        with ``render_mode='rgb_array'`` (env.kwargs), as ``python -m evaluation.evaluate --video`` makes them."""
        return rendered_frame(f"gymnasium env '{self.gym_id}'", self._envs[0])

    def _reset_one(self, index: int, seed: int | None, buffers: StepBuffers) -> None:
        """Reset env ``index``; write its validated first observation (and action mask)."""
        try:
            result = self._envs[index].reset(seed=seed)
        except Exception as exc:
            raise EnvRaised(f"gymnasium env '{self.gym_id}' (env {index}) raised in reset(): {exc!r}") from exc
        obs, _info = self._unpack(result, index, "reset", RESET_RESULT)
        self._write_obs(buffers, index, obs, "reset")

    def _unpack(self, result: Any, index: int, call: str, fields: str) -> tuple:
        """``result`` of ``call`` as the tuple Gymnasium's API returns; EnvConfigError naming the env when it is not
        (e.g. an env of gym's old API, whose reset returns the observation alone and step four values)."""
        expected = fields.count(",") + 1
        if isinstance(result, tuple) and len(result) == expected:
            return result
        got = f"{len(result)} values" if isinstance(result, tuple) else type(result).__name__
        raise EnvConfigError(f"gymnasium env '{self.gym_id}' (env {index}) {call}() returned {got}, not ({fields}) "
                             f"as Gymnasium's API has it since 0.26; {OLD_API_HINT}")

    def _write_obs(self, buffers: StepBuffers, index: int, raw: Any, call: str) -> None:
        """Validate ``raw`` and write it (and its mask) into slot ``index``."""
        obs, mask = self._spaces.obs_and_mask(raw, call=call, where=f"(env {index})")
        buffers.obs[index] = obs
        if mask is not None:
            buffers.action_mask[index] = mask

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset env ``i`` with seed ``seed + i``; write first observations and clear everything else."""
        buffers.clear_step_outputs()
        for i in range(self.num_envs):
            self._reset_one(i, seed + i, buffers)
        self._returns[:] = 0.0
        self._lengths[:] = 0

    def step(self, buffers: StepBuffers) -> None:
        """Step every env with ``buffers.actions``; write results; auto-reset (unseeded) ended episodes."""
        self._spaces.check_actions(buffers.actions, lambda i: f"(env {i})")
        for i, env in enumerate(self._envs):
            try:
                result = env.step(self._spaces.to_env_action(buffers.actions[i]))
            except Exception as exc:
                raise EnvRaised(f"gymnasium env '{self.gym_id}' (env {i}) raised in step(): {exc!r}") from exc
            obs, reward, term, trunc, _info = self._unpack(result, i, "step", STEP_RESULT)
            reward = reward_value(reward, lambda: f"gymnasium env '{self.gym_id}' (env {i}) step()")
            terminated = bool(term)
            truncated = bool(trunc) and not terminated
            buffers.rewards[i] = reward
            buffers.terminated[i] = terminated
            buffers.truncated[i] = truncated
            self._returns[i] += reward
            self._lengths[i] += 1
            self._write_obs(buffers, i, obs, "step")
            buffers.episode_done[i] = terminated or truncated
            if terminated or truncated:
                buffers.episode_return[i] = self._returns[i]
                buffers.episode_length[i] = self._lengths[i]
                if truncated:
                    buffers.final_obs[i] = buffers.obs[i]
                self._returns[i] = 0.0
                self._lengths[i] = 0
                self._reset_one(i, None, buffers)

    def close(self) -> None:
        """Close every env made so far (the first failure is re-raised after closing the rest)."""
        envs, self._envs = self._envs, []
        close_each(envs, f"gymnasium env '{self.gym_id}'")
