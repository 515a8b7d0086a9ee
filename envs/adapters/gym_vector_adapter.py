"""A Gymnasium ``VectorEnv`` (e.g. from ``gymnasium.make_vec``) behind Sluice's VecEnv contract.

``env.entry_point`` names a callable that is called as ``fn(num_envs=num_envs, **env.kwargs)`` and must
return a ``gymnasium.vector.VectorEnv`` of exactly ``num_envs`` sub-envs; sub-env ``i`` is agent slot ``i``.
Spaces come from ``single_observation_space``/``single_action_space`` (see ``envs.adapters.gym_spaces``).

How the vector env's ``metadata["autoreset_mode"]`` maps onto Sluice's contract (an episode end arrives with
the first observation of the next episode; ``final_obs`` holds a truncated episode's last observation):

* ``NEXT_STEP`` (the default of ``make_vec``): a sub-env whose episode ends returns the episode's last
  observation and resets on the next ``step``, ignoring that step's action. The adapter reports the episode
  (``episode_done``/return/length) on the step it ends but holds its reward, ``terminated``/``truncated``
  and final observation, and marks the slot inactive; on the next step (the sub-env's reset) it writes the
  reset observation together with the held reward and flags, and the slot is active again.
* ``SAME_STEP``: the sub-env resets within the step; the last observation is in ``infos["final_obs"]``.
* ``DISABLED``: the adapter resets finished sub-envs itself with ``reset(options={"reset_mask": mask})``.

With the same seeds and the same actions on each slot's active steps, the three modes write the same
sequence of active steps per slot. ``max_steps > 0`` adds the adapter's own time limit per sub-env (the
sub-env is truncated and reset at once, by ``reset_mask``); ``max_steps <= 0`` keeps the env's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from envs.base import EnvSpec, StepBuffers
from envs.adapters.entry_point import resolve_entry_point
from envs.adapters.gym_spaces import SpaceConverter, report_episode
from envs.errors import EnvConfigError, EnvRaised


class GymnasiumVectorAdapter:
    """A Gymnasium VectorEnv built by an entry point, stepped into caller-owned StepBuffers."""

    def __init__(self, entry_point: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any],
                 obs_keys: Sequence[str] = ()) -> None:
        """Call the entry point, check what it built, and read its spaces (ValueError if unsupported);
        ``obs_keys``: the top-level keys of a Dict observation to keep (all when empty)."""
        if num_envs <= 0:
            raise EnvConfigError(f"GymnasiumVectorAdapter needs num_envs >= 1, got {num_envs}")
        fn = resolve_entry_point(entry_point, env_name="gymnasium_vector")
        env_id = kwargs.get("id")
        self.label = f"gymnasium_vector env '{entry_point}'" + (f" (id {env_id!r})" if isinstance(env_id, str) else "")
        self.num_envs = num_envs
        self.max_steps = max_steps
        try:
            env = fn(num_envs=num_envs, **kwargs)
        except Exception as exc:
            raise EnvRaised(f"{self.label} raised in make(): {exc!r}") from exc
        self._env: Any = env
        try:
            self._check_env(env)
            self._spaces = SpaceConverter(self.label, env.single_observation_space, env.single_action_space,
                                          source="single_observation_space", obs_keys=obs_keys)
            self.mode = self._autoreset_mode(env)
        except BaseException:
            with contextlib.suppress(RuntimeError):
                self.close()  # the construction error is the one worth reporting
            raise
        self.spec: EnvSpec = self._spaces.spec
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._resetting = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: resets on the next step, slot inactive
        self._held_reward = np.zeros(num_envs, dtype=np.float32)
        self._held_terminated = np.zeros(num_envs, dtype=bool)
        self._held_truncated = np.zeros(num_envs, dtype=bool)
        self._held_final = np.zeros((num_envs, *self.spec.obs_shape), dtype=self.spec.obs_dtype)

    def _check_env(self, env: Any) -> None:
        """ValueError unless ``env`` is a VectorEnv with ``num_envs`` sub-envs."""
        if not isinstance(env, VectorEnv):
            raise EnvConfigError(f"{self.label}: the entry point returned a {type(env).__module__}."
                             f"{type(env).__qualname__}, not a gymnasium.vector.VectorEnv (for a single "
                             f"env use env.name 'gymnasium' with env.gym_id)")
        if env.num_envs != self.num_envs:
            raise EnvConfigError(f"{self.label}: the entry point was asked for num_envs={self.num_envs} but "
                             f"returned a VectorEnv with num_envs={env.num_envs}")

    def _autoreset_mode(self, env: Any) -> AutoresetMode:
        """The env's autoreset mode (NEXT_STEP if it declares none); ValueError where it cannot work."""
        value = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        try:
            mode = AutoresetMode(value)
        except ValueError as exc:
            raise EnvConfigError(f"{self.label}: metadata['autoreset_mode'] is {value!r}; expected one of "
                             f"{[m.value for m in AutoresetMode]}") from exc
        masked_reset = mode == AutoresetMode.DISABLED or isinstance(env.unwrapped, (SyncVectorEnv, AsyncVectorEnv))
        if self.max_steps > 0 and not masked_reset:
            raise EnvConfigError(
                f"{self.label}: env.max_steps={self.max_steps} (the adapter's time limit) needs a vector env that "
                f"resets single sub-envs with reset(options={{'reset_mask': ...}}) (SyncVectorEnv, AsyncVectorEnv, "
                f"or autoreset_mode DISABLED), but this is a {type(env.unwrapped).__name__} in mode "
                f"{mode.name}; set env.max_steps: 0 to keep the env's own time limit, or build it with "
                f"vectorization_mode 'sync'")
        return mode

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset every sub-env (sub-env ``i`` seeded ``seed + i``); write first observations, clear the rest."""
        try:
            raw, _infos = self._env.reset(seed=seed)
        except Exception as exc:
            raise EnvRaised(f"{self.label} raised in reset(): {exc!r}") from exc
        obs, mask = self._spaces.batch_obs_and_mask(raw, self.num_envs, call="reset")
        buffers.clear_step_outputs()
        buffers.obs[:] = obs
        if mask is not None:
            buffers.action_mask[:] = mask
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._resetting[:] = False

    def _env_actions(self, buffers: StepBuffers) -> np.ndarray:
        """The batched env actions: the slots' actions, a placeholder for the sub-envs that are resetting."""
        actions = buffers.actions.copy()
        actions[self._resetting] = self._spaces.placeholder_action()
        self._spaces.check_actions(actions, lambda i: f"(env {i})")
        return self._spaces.to_env_actions(actions)

    def _step_arrays(self, result: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Unpack and shape-check what ``env.step`` returned."""
        try:
            raw, rewards, terminated, truncated, infos = result
        except (TypeError, ValueError) as exc:
            raise EnvConfigError(f"{self.label} step() returned {type(result).__name__}; expected the 5-tuple "
                             f"(obs, rewards, terminations, truncations, infos)") from exc
        arrays = [np.asarray(rewards, dtype=np.float64), np.asarray(terminated), np.asarray(truncated)]
        for name, array in zip(("rewards", "terminations", "truncations"), arrays):
            if array.shape != (self.num_envs,):
                raise EnvConfigError(f"{self.label} step() returned {name} with shape {array.shape}; expected "
                                 f"({self.num_envs},)")
        return raw, arrays[0], arrays[1].astype(bool), arrays[2].astype(bool), infos

    def _final_obs(self, infos: dict[str, Any], index: int) -> Any:
        """SAME_STEP: the last observation of sub-env ``index`` from ``infos["final_obs"]``."""
        final = infos.get("final_obs")
        present = infos.get("_final_obs")
        if final is None or (present is not None and not present[index]):
            raise EnvConfigError(f"{self.label} (env {index}) step() returned no infos['final_obs'] for a sub-env whose "
                             f"episode ended (autoreset_mode SAME_STEP)")
        return final[index]

    def step(self, buffers: StepBuffers) -> None:
        """Step every sub-env with ``buffers.actions``; write results; map the env's auto-reset (see module)."""
        actions = self._env_actions(buffers)
        try:
            result = self._env.step(actions)
        except Exception as exc:
            raise EnvRaised(f"{self.label} raised in step(): {exc!r}") from exc
        raw, rewards, env_terminated, env_truncated, infos = self._step_arrays(result)
        obs, mask = self._spaces.batch_obs_and_mask(raw, self.num_envs, call="step")
        was_resetting = self._resetting.copy()
        reset_mask = np.zeros(self.num_envs, dtype=bool)
        buffers.rewards[:] = 0.0
        buffers.terminated[:] = False
        buffers.truncated[:] = False
        buffers.episode_done[:] = False
        buffers.active[:] = True
        buffers.obs[:] = obs
        if mask is not None:
            buffers.action_mask[:] = mask
        for i in range(self.num_envs):
            if was_resetting[i]:  # NEXT_STEP: obs is the reset observation; deliver what was held
                self._deliver(buffers, i, float(self._held_reward[i]), bool(self._held_terminated[i]),
                              bool(self._held_truncated[i]), self._held_final[i])
                self._resetting[i] = False
                continue
            self._returns[i] += rewards[i]
            self._lengths[i] += 1
            env_ended = bool(env_terminated[i] or env_truncated[i])
            terminated = bool(env_terminated[i])
            truncated = not terminated and (bool(env_truncated[i]) or 0 < self.max_steps <= self._lengths[i])
            if not (terminated or truncated):
                buffers.rewards[i] = rewards[i]
                continue
            report_episode(buffers, i, self._returns, self._lengths)
            if env_ended and self.mode == AutoresetMode.NEXT_STEP:
                self._hold(buffers, i, float(rewards[i]), terminated, truncated, obs[i])
            elif env_ended and self.mode == AutoresetMode.SAME_STEP:
                final, _ = self._spaces.obs_and_mask(self._final_obs(infos, i), call="step", where=f"(env {i})")
                self._deliver(buffers, i, float(rewards[i]), terminated, truncated, final)
            else:  # DISABLED, or the adapter's own time limit: reset this sub-env below
                self._deliver(buffers, i, float(rewards[i]), terminated, truncated, obs[i])
                reset_mask[i] = True
        if reset_mask.any():
            self._reset_some(buffers, reset_mask)

    def _hold(self, buffers: StepBuffers, index: int, reward: float, terminated: bool, truncated: bool,
              final: np.ndarray) -> None:
        """NEXT_STEP: keep the ended episode's reward, flags and last obs; the slot sits out the next step."""
        self._held_reward[index] = reward
        self._held_terminated[index] = terminated
        self._held_truncated[index] = truncated
        self._held_final[index] = final
        self._resetting[index] = True
        buffers.active[index] = False

    @staticmethod
    def _deliver(buffers: StepBuffers, index: int, reward: float, terminated: bool, truncated: bool,
                 final: np.ndarray) -> None:
        """Write an ended episode's reward and flags (and final obs if truncated) beside a reset observation."""
        buffers.rewards[index] = reward
        buffers.terminated[index] = terminated
        buffers.truncated[index] = truncated
        if truncated:
            buffers.final_obs[index] = final

    def _reset_some(self, buffers: StepBuffers, reset_mask: np.ndarray) -> None:
        """Reset the masked sub-envs (unseeded) and write their first observations."""
        try:
            raw, _infos = self._env.reset(options={"reset_mask": reset_mask.copy()})
        except Exception as exc:
            raise EnvRaised(f"{self.label} raised in reset() (options reset_mask={reset_mask.tolist()}, "
                               f"auto-reset during step()): {exc!r}") from exc
        obs, mask = self._spaces.batch_obs_and_mask(raw, self.num_envs, call="reset")
        buffers.obs[reset_mask] = obs[reset_mask]
        if mask is not None:
            buffers.action_mask[reset_mask] = mask[reset_mask]

    def close(self) -> None:
        """Close the vector env."""
        env, self._env = self._env, None
        if env is None:
            return
        try:
            env.close()
        except Exception as exc:
            raise EnvRaised(f"{self.label} raised in close(): {exc!r}") from exc

