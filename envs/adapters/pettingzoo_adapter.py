"""PettingZoo ParallelEnvs behind Sluice's VecEnv contract.

``env.entry_point`` names a callable (e.g. ``mpe2.simple_spread_v3:parallel_env``) called as
``fn(**env.kwargs)`` once per environment; each result must be a ``pettingzoo.ParallelEnv``. With
``num_agents = len(possible_agents)``, agent ``j`` (in ``possible_agents`` order) of env ``e`` is agent slot
``e * num_agents + j``. The agents' spaces map as ``envs.adapters.gym_spaces`` describes (dict observations with
``action_mask`` fill ``buffers.action_mask``); agents whose spaces differ share one padded layout
(``envs.adapters.agent_spaces``).

Agents that finish before the rest of their env (terminated or truncated, then gone from ``env.agents``):

* on the step they finish, their episode is reported (``episode_done``, return, length) and the slot turns
  inactive (``active=False``, reward 0, no flags); their final reward, flags and last observation are held;
* while the rest of the env plays on, the slot stays inactive and its action is not passed to the env;
* when the env ends (``env.agents`` empty after a step, or the adapter's time limit) it is reset at once
  (unseeded) and every slot gets the new episode's first observation, active again, with its held reward,
  ``terminated``/``truncated`` and (if truncated) ``final_obs``.

Agents that finish on the env's last step get the same in one step. ``reset(seed)`` resets env ``e`` with
``seed + e``. ``max_steps > 0`` truncates every agent of an env after ``max_steps`` env steps (the adapter's
own time limit); ``max_steps <= 0`` keeps the env's own (e.g. MPE's ``max_cycles``).

Global state: when env 0 has a ``state_space`` that is a gymnasium ``Box`` (mpe2's parallel envs do), the
spec's ``state_size`` is its size and ``env.state()`` (flattened, float32) goes into every slot of the env's
``global_state`` after each reset and step. When an env's episode ends (the step that delivers the held flags
and resets it), ``state()`` taken before that auto-reset goes into its slots of ``final_global_state``.
Without such a ``state_space``, ``state_size`` is 0 and ``state()`` is never called.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from envs.base import EnvSpec, StepBuffers
from envs.adapters.entry_point import resolve_entry_point
from envs.adapters.agent_spaces import AgentSpaces
from envs.adapters.gym_spaces import close_each, report_episode, reward_value, rendered_frame
from envs.errors import EnvConfigError, EnvRaised


def check_agents(label: str, envs: list[Any]) -> tuple[str, ...]:
    """``possible_agents`` of ``envs[0]``; EnvConfigError unless every env has the same agents (``open_envs`` runs it
    for both PettingZoo adapters)."""
    agents = tuple(envs[0].possible_agents)
    if not agents:
        raise EnvConfigError(f"{label}: possible_agents is empty")
    for e, env in enumerate(envs[1:], start=1):
        if tuple(env.possible_agents) != agents:
            raise EnvConfigError(f"{label}: env {e} has possible_agents {list(env.possible_agents)} but "
                                 f"env 0 has {list(agents)}")
    return agents


def open_envs(label: str, make_one: Callable[[int], Any], num_envs: int, *,
              obs_keys: Sequence[str]) -> tuple[list[Any], tuple[str, ...], AgentSpaces]:
    """``make_one(e)`` for each of ``num_envs`` envs, their shared agents (``check_agents``) and their agents'
    spaces (``AgentSpaces``: padded into one layout where they differ); on any error the envs made so far are closed
    (the construction error is the one raised). Shared by the Parallel and the AEC adapter."""
    envs: list[Any] = []
    try:
        for e in range(num_envs):
            envs.append(make_one(e))
        agents = check_agents(label, envs)
        agent_spaces = AgentSpaces(label, envs[0], agents, obs_keys=obs_keys)
    except BaseException:
        with contextlib.suppress(RuntimeError):
            close_each(envs, label)
        raise
    return envs, agents, agent_spaces


class PettingZooParallelAdapter:
    """``num_envs`` PettingZoo ParallelEnvs stepped one after another into caller-owned StepBuffers."""

    def __init__(self, entry_point: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any],
                 obs_keys: Sequence[str] = ()) -> None:
        """Build ``num_envs`` envs with the entry point and read their agents and spaces; ``obs_keys``: the
        top-level keys of a Dict observation to keep (all when empty)."""
        if num_envs <= 0:
            raise EnvConfigError(f"PettingZooParallelAdapter needs num_envs >= 1, got {num_envs}")
        fn = resolve_entry_point(entry_point, env_name="pettingzoo")
        self.label = f"pettingzoo env '{entry_point}'"
        self.num_envs = num_envs
        self.max_steps = max_steps
        self._envs, self.agents, self._spaces = open_envs(self.label, lambda e: self._make(fn, kwargs, e), num_envs,
                                                          obs_keys=obs_keys)
        self._state_shape: tuple[int, ...] = self._state_shape_of(self._envs[0])
        self.spec: EnvSpec = dataclasses.replace(self._spaces.spec, state_size=int(np.prod(self._state_shape)))
        self._slot = {agent: j for j, agent in enumerate(self.agents)}
        slots = num_envs * len(self.agents)
        self._env_steps = np.zeros(num_envs, dtype=np.int64)
        self._returns = np.zeros(slots, dtype=np.float64)
        self._lengths = np.zeros(slots, dtype=np.int64)
        self._live = np.zeros(slots, dtype=bool)  # the agent is in its env's episode and acts
        self._held_reward = np.zeros(slots, dtype=np.float32)
        self._held_terminated = np.zeros(slots, dtype=bool)
        self._held_truncated = np.zeros(slots, dtype=bool)
        self._held_final = np.zeros((slots, *self.spec.obs_shape), dtype=self.spec.obs_dtype)

    def _make(self, fn: Any, kwargs: dict[str, Any], index: int) -> Any:
        """Call the entry point once; check it built a ParallelEnv."""
        try:
            env = fn(**kwargs)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {index}) raised in make(): {exc!r}") from exc
        if not isinstance(env, ParallelEnv):
            with contextlib.suppress(Exception):  # it is not ours to use; closing is best effort
                env.close()
            raise EnvConfigError(f"{self.label}: the entry point returned a {type(env).__module__}."
                             f"{type(env).__qualname__}, not a pettingzoo ParallelEnv (for an AEC env use "
                             f"its module's parallel_env, or wrap it with pettingzoo.utils.aec_to_parallel)")
        return env

    @staticmethod
    def _state_shape_of(env: Any) -> tuple[int, ...]:
        """Shape of the env's global state: its ``state_space`` if that is a Box, else ``(0,)`` (none)."""
        state_space = getattr(env, "state_space", None)
        if isinstance(state_space, spaces.Box):
            return tuple(int(d) for d in state_space.shape)
        return (0,)

    def _write_state(self, out: np.ndarray, e: int, call: str) -> None:
        """Write env ``e``'s ``state()`` (flattened float32) into its slots of ``out``; nothing without a state."""
        if not self.spec.state_size:
            return
        try:
            raw = self._envs[e].state()
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in state() {call}: {exc!r}") from exc
        state = np.asarray(raw)
        if state.shape != self._state_shape or state.dtype.kind not in "biuf":
            raise EnvConfigError(f"{self.label} (env {e}) state() {call} returned shape {state.shape} dtype "
                                 f"{state.dtype}; expected shape {self._state_shape} of numbers (from its "
                                 f"state_space)")
        base = self._base(e)
        out[base:base + len(self.agents)] = state.reshape(-1)

    def _base(self, e: int) -> int:
        """Slot of agent 0 of env ``e``."""
        return e * len(self.agents)

    def _write_obs(self, buffers: StepBuffers, slot: int, raw: Any, *, call: str, where: str) -> np.ndarray:
        """Validate one agent's observation; write it and its mask into ``slot``; return the observation."""
        obs, mask = self._spaces.obs_and_mask(slot % len(self.agents), raw, call=call, where=where)
        buffers.obs[slot] = obs
        if mask is not None:
            buffers.action_mask[slot] = mask
        return obs

    def _reset_env(self, buffers: StepBuffers, e: int, seed: int | None, during: str) -> None:
        """Reset env ``e``; write every agent's first observation; every slot live and active again."""
        try:
            observations, _infos = self._envs[e].reset(seed=seed)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in reset(){during}: {exc!r}") from exc
        missing = [agent for agent in self.agents if agent not in observations]
        if missing:
            raise EnvConfigError(f"{self.label} (env {e}) reset() returned no observation for agents {missing}; "
                             f"every agent of possible_agents {list(self.agents)} must start each episode")
        base = self._base(e)
        for j, agent in enumerate(self.agents):
            self._write_obs(buffers, base + j, observations[agent], call="reset",
                            where=f"(env {e}, agent {agent!r})")
        self._write_state(buffers.global_state, e, f"after reset(){during}")
        self._live[base:base + len(self.agents)] = True
        buffers.active[base:base + len(self.agents)] = True
        self._env_steps[e] = 0

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset env ``e`` with seed ``seed + e``; write first observations (and masks); clear the rest."""
        buffers.clear_step_outputs()
        for e in range(self.num_envs):
            self._reset_env(buffers, e, seed + e, "")
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._held_reward[:] = 0.0
        self._held_terminated[:] = False
        self._held_truncated[:] = False

    def step(self, buffers: StepBuffers) -> None:
        """Step every env with the live agents' actions; write results; hold and deliver early finishes."""
        live = np.flatnonzero(self._live)
        self._spaces.check_actions(buffers.actions[live], live % len(self.agents), self._where_live())
        buffers.rewards[:] = 0.0
        buffers.terminated[:] = False
        buffers.truncated[:] = False
        buffers.episode_done[:] = False
        buffers.active[:] = self._live
        for e in range(self.num_envs):
            self._step_env(buffers, e)

    def _where_live(self) -> Any:
        """Maps a row of ``actions[live]`` to '(env e, agent name)' for messages."""
        live = np.flatnonzero(self._live)
        n = len(self.agents)
        return lambda row: f"(env {live[row] // n}, agent {self.agents[live[row] % n]!r})"

    def _step_env(self, buffers: StepBuffers, e: int) -> None:
        """One step of env ``e`` (see the module docstring for the slot rules)."""
        env, base = self._envs[e], self._base(e)
        acting = [agent for agent in self.agents if self._live[base + self._slot[agent]]]
        actions = {agent: self._spaces.to_env_action(self._slot[agent], buffers.actions[base + self._slot[agent]])
                   for agent in acting}
        try:
            observations, rewards, terminations, truncations, _infos = env.step(actions)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in step(): {exc!r}") from exc
        self._env_steps[e] += 1
        time_up = 0 < self.max_steps <= self._env_steps[e]
        remaining = set(env.agents)
        newcomers = sorted(remaining - set(acting))
        if newcomers:
            raise EnvConfigError(f"{self.label} (env {e}) step() returned with agents {newcomers} in env.agents that "
                             f"were not playing before the step; agents joining mid-episode are not supported")
        for agent in acting:
            slot = base + self._slot[agent]
            where = f"(env {e}, agent {agent!r})"
            if agent not in observations:
                raise EnvConfigError(f"{self.label} {where} step() returned no observation for an agent that acted")
            reward = reward_value(rewards.get(agent, 0.0), lambda: f"{self.label} {where} step()")
            self._returns[slot] += reward
            self._lengths[slot] += 1
            terminated = bool(terminations.get(agent, False))
            truncated = not terminated and (bool(truncations.get(agent, False)) or time_up)
            obs = self._write_obs(buffers, slot, observations[agent], call="step", where=where)
            if not (terminated or truncated):
                if agent not in remaining:
                    raise EnvConfigError(f"{self.label} {where} step() removed the agent from env.agents without "
                                     f"terminating or truncating it")
                buffers.rewards[slot] = reward
                continue
            # this agent's episode is over: report it now, hold its reward and flags for the reset step
            report_episode(buffers, slot, self._returns, self._lengths)
            self._held_reward[slot] = reward
            self._held_terminated[slot] = terminated
            self._held_truncated[slot] = truncated
            self._held_final[slot] = obs
            self._live[slot] = False
            buffers.active[slot] = False
        slots = slice(base, base + len(self.agents))
        if time_up or not remaining or not self._live[slots].any():
            self._write_state(buffers.final_global_state, e, "after the episode's last step()")
            self._reset_env(buffers, e, None, " (auto-reset during step())")
            buffers.rewards[slots] = self._held_reward[slots]
            buffers.terminated[slots] = self._held_terminated[slots]
            buffers.truncated[slots] = self._held_truncated[slots]
            truncated_slots = np.flatnonzero(self._held_truncated[slots]) + base
            buffers.final_obs[truncated_slots] = self._held_final[truncated_slots]
            self._held_reward[slots] = 0.0
            self._held_terminated[slots] = False
            self._held_truncated[slots] = False
        else:
            self._write_state(buffers.global_state, e, "after step()")

    def render_first(self) -> np.ndarray:
        """Env 0's current frame as [height, width, 3] uint8, from its ``render()``: the envs must have been made
        with ``render_mode='rgb_array'`` (env.kwargs), as ``python -m evaluation.evaluate --video`` makes them."""
        return rendered_frame(self.label, self._envs[0])

    def close(self) -> None:
        """Close every env made so far (the first failure is re-raised after closing the rest)."""
        envs, self._envs = self._envs, []
        close_each(envs, self.label)
