"""Small real Gymnasium envs and PettingZoo ParallelEnvs for the adapter tests, importable as entry points
('tests.fake_envs:...'). Everything is deterministic so tests can write down exact expected buffers."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from pettingzoo import ParallelEnv
from pettingzoo.utils.env import AECEnv

NOT_CALLABLE = 3
"""An entry point that names something that is not callable."""


def action_space(kind: str) -> spaces.Space:
    """The action spaces the echo envs use: offsets and bounds the adapters must honour."""
    if kind == "discrete":
        return spaces.Discrete(3, start=-1)
    if kind == "multi_discrete":
        return spaces.MultiDiscrete([3, 2], start=[1, -1])
    if kind == "box":
        return spaces.Box(low=np.array([-1.0, 0.0]), high=np.array([1.0, 2.0]), dtype=np.float64)
    if kind == "masked":
        return spaces.Discrete(4)
    if kind == "multi_binary":
        return spaces.MultiBinary(3)
    raise ValueError(kind)


def mask_at(t: int, j: int) -> np.ndarray:
    """Legal actions of agent ``j`` at step ``t`` of the masked envs: all but ``(t + j) % 4``."""
    mask = np.ones(4, dtype=np.int8)
    mask[(t + j) % 4] = 0
    return mask


def unsupported_spaces(what: str) -> tuple[spaces.Space, spaces.Space]:
    """(observation space, action space) pairs Sluice must reject, by name."""
    box = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    table: dict[str, tuple[spaces.Space, spaces.Space]] = {
        "sequence_obs": (spaces.Sequence(box), spaces.Discrete(2)),
        "text_action": (box, spaces.Text(5)),
        "int_box_action": (box, spaces.Box(0, 3, shape=(2,), dtype=np.int64)),
        "2d_box_action": (box, spaces.Box(-1.0, 1.0, shape=(2, 2), dtype=np.float32)),
        "2d_multi_discrete": (box, spaces.MultiDiscrete([[2, 3], [4, 5]])),
        "2d_multi_binary": (box, spaces.MultiBinary([2, 2])),
        "dict_with_sequence": (spaces.Tuple((box, spaces.Sequence(box))), spaces.Discrete(2)),
        "mask_wrong_size": (spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(3)}),
                            spaces.Discrete(2)),
        "mask_with_box_action": (spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(2)}),
                                 spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)),
    }
    return table[what]


# ----- Gymnasium envs -----


class Uint8GridEnv(gymnasium.Env):
    """uint8 image observations; terminates after ``length`` steps; reward = action + 1."""

    observation_space = spaces.Box(0, 255, shape=(3, 5, 5), dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.t = 0

    def _obs(self) -> np.ndarray:
        return self.np_random.integers(0, 256, size=(3, 5, 5), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(action) + 1.0, self.t >= self.length, False, {}


class BadObsEnv(Uint8GridEnv):
    """Returns an observation of the wrong shape or dtype from reset or step."""

    def __init__(self, bad: str = "shape", when: str = "step") -> None:
        super().__init__(length=100)
        self.bad, self.when = bad, when

    def _wrong(self) -> np.ndarray:
        obs = self._obs()
        return obs.reshape(75) if self.bad == "shape" else obs.astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed)
        return (self._wrong() if self.when == "reset" else obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        _, reward, term, trunc, info = super().step(action)
        return self._wrong(), reward, term, trunc, info


class OldApiEnv(Uint8GridEnv):
    """Wrong: gym's old API (before 0.26): ``reset`` returns the observation alone (``where="reset"``), or ``step``
    four values (``where="step"``)."""

    def __init__(self, where: str = "reset") -> None:
        super().__init__(length=100)
        self.where = where

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        obs, info = super().reset(seed=seed)
        return obs if self.where == "reset" else (obs, info)

    def step(self, action: Any) -> tuple:
        obs, reward, term, _trunc, info = super().step(action)
        return obs, reward, term, info


class RaisingEnv(Uint8GridEnv):
    """Raises from step after ``after`` steps, or from reset."""

    def __init__(self, where: str = "step", after: int = 1) -> None:
        super().__init__(length=100)
        self.where, self.after = where, after

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if self.where == "reset":
            raise OSError("simulator crashed in reset")
        return super().reset(seed=seed)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.t >= self.after:
            raise ZeroDivisionError("physics blew up")
        return super().step(action)


class EchoEnv(gymnasium.Env):
    """Observation float32 ``[episode, t, seed]`` (plus an action mask when ``kind='masked'``).

    Reward at step ``t`` is ``10 * t + sum(env action)``; the episode terminates at ``t == length`` or is
    truncated at ``t == truncate_at`` (if > 0). The actions it received are kept in ``received``; a masked
    env raises on an illegal action.
    """

    def __init__(self, kind: str = "discrete", length: int = 3, truncate_at: int = 0) -> None:
        self.kind, self.length, self.truncate_at = kind, length, truncate_at
        self.action_space = action_space(kind)
        box = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.observation_space = (spaces.Dict({"observation": box, "action_mask": spaces.Box(0, 1, (4,), np.int8)})
                                  if kind == "masked" else box)
        self.t, self.episode, self.seed = 0, -1, -1
        self.received: list[Any] = []

    def _obs(self) -> Any:
        obs = np.array([self.episode, self.t, self.seed], dtype=np.float32)
        return {"observation": obs, "action_mask": mask_at(self.t, 0)} if self.kind == "masked" else obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.seed = seed
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.kind == "masked" and not mask_at(self.t, 0)[action]:
            raise ValueError(f"illegal action {action} at t={self.t}")
        self.received.append(action)
        self.t += 1
        reward = 10.0 * self.t + float(np.sum(action))
        return self._obs(), reward, self.t >= self.length, self.t == self.truncate_at, {}


class UnsupportedEnv(gymnasium.Env):
    """An env whose spaces are one of ``unsupported_spaces``."""

    def __init__(self, what: str = "sequence_obs") -> None:
        self.observation_space, self.action_space = unsupported_spaces(what)


def sync_vector(num_envs: int, *, env: str = "EchoEnv", autoreset_mode: str = "NextStep",
                env_kwargs: dict[str, Any] | None = None,
                per_env: list[dict[str, Any]] | None = None) -> SyncVectorEnv:
    """A SyncVectorEnv of ``num_envs`` of this module's envs, in the given autoreset mode.

    Sub-env ``i`` gets ``env_kwargs`` updated with ``per_env[i]`` (if given)."""
    cls = globals()[env]
    kwargs = [{**(env_kwargs or {}), **(per_env[i] if per_env else {})} for i in range(num_envs)]
    return SyncVectorEnv([lambda kw=kw: cls(**kw) for kw in kwargs], autoreset_mode=autoreset_mode)


class _CastObservations(gymnasium.vector.VectorObservationWrapper):
    """Returns observations cast to float32 from reset or step (its declared spaces unchanged)."""

    def __init__(self, env: gymnasium.vector.VectorEnv, when: str) -> None:
        super().__init__(env)
        self.when = when
        self.calls = 0

    def reset(self, **kwargs: Any) -> Any:
        self.calls = 0
        return super().reset(**kwargs)

    def step(self, actions: Any) -> Any:
        self.calls = 1
        return super().step(actions)

    def observations(self, observations: Any) -> Any:
        wrong = self.calls == (0 if self.when == "reset" else 1)
        return np.asarray(observations).astype(np.float32) if wrong else observations


def bad_obs_vector(num_envs: int, when: str = "reset") -> gymnasium.vector.VectorEnv:
    """Wrong: float32 batched observations (from reset or step) from a vector env that declares uint8 ones."""
    return _CastObservations(sync_vector(num_envs, env="Uint8GridEnv"), when)


def not_a_vector_env(num_envs: int) -> gymnasium.Env:
    """Wrong: a single env."""
    return EchoEnv()


def wrong_size_vector(num_envs: int) -> SyncVectorEnv:
    """Wrong: one sub-env too many."""
    return sync_vector(num_envs + 1)


def raising_factory(**kwargs: Any) -> Any:
    """An entry point that fails."""
    raise OSError("licence server unreachable")


# ----- PettingZoo ParallelEnvs -----


class StaggeredParallelEnv(ParallelEnv):
    """Agents finish at different steps; observation float32 ``[episode, t, j, seed]`` for agent ``j``.

    ``ends`` maps agent -> (``"term"`` or ``"trunc"``, step); reward of agent ``j`` at step ``t`` is
    ``100 * j + 10 * t + sum(env action)``. Raises if the actions are not exactly those of ``self.agents``
    (an inactive agent's action must not reach it). ``kind`` picks the action space (see ``action_space``);
    ``masked`` gives dict observations with ``mask_at(t, j)`` and raises on illegal actions.
    """

    metadata = {"name": "staggered_v0"}
    render_mode = None

    def __init__(self, ends: dict[str, list[Any]] | None = None, kind: str = "discrete") -> None:
        self.ends = ends or {"a": ["term", 1], "b": ["trunc", 2], "c": ["term", 3]}
        self.possible_agents = list(self.ends)
        self.kind = kind
        self.agents: list[str] = []
        self.t, self.episode, self.seed = 0, -1, -1
        self.received: list[dict[str, Any]] = []
        box = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
        self._obs_space = (spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(4)})
                           if kind == "masked" else box)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return action_space(self.kind)

    def _obs(self, agent: str) -> Any:
        j = self.possible_agents.index(agent)
        obs = np.array([self.episode, self.t, j, self.seed], dtype=np.float32)
        return {"observation": obs, "action_mask": mask_at(self.t, j)} if self.kind == "masked" else obs

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.seed = seed
        self.t, self.episode = 0, self.episode + 1
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if set(actions) != set(self.agents):
            raise KeyError(f"actions for {sorted(actions)} but agents are {self.agents}")
        for agent, action in actions.items():
            if self.kind == "masked" and not mask_at(self.t, self.possible_agents.index(agent))[action]:
                raise ValueError(f"illegal action {action} for {agent} at t={self.t}")
        self.received.append(dict(actions))
        self.t += 1
        obs, rewards, terms, truncs = {}, {}, {}, {}
        for agent in self.agents:
            how, at = self.ends[agent]
            obs[agent] = self._obs(agent)
            rewards[agent] = 100.0 * self.possible_agents.index(agent) + 10.0 * self.t + float(np.sum(actions[agent]))
            terms[agent] = how == "term" and self.t >= at
            truncs[agent] = how == "trunc" and self.t >= at
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}


class MixedSpacesParallelEnv(StaggeredParallelEnv):
    """Agent 'c' has other spaces than 'a' and 'b' (``what``): "actions": Discrete(4) (theirs: Discrete(3, start=-1));
    "obs": that, and the observation ``[episode, t, j, seed, 7, 8]``; "masked": "obs" with every agent's
    observation a Dict carrying ``mask_at(t, j)`` (c's padded with one legal flag); ones that cannot be padded:
    "dtype" (c's observation float64), "rank" (c's observation 2x2), "box" (c's actions a Box)."""

    def __init__(self, what: str = "actions") -> None:
        super().__init__(kind="masked" if what == "masked" else "discrete")
        self.what = what

    def observation_space(self, agent: str) -> spaces.Space:
        if agent != "c" or self.what == "actions":
            return self._obs_space
        shape, dtype = {"dtype": ((4,), np.float64), "rank": ((2, 2), np.float32)}.get(self.what, ((6,), np.float32))
        box = spaces.Box(-np.inf, np.inf, shape=shape, dtype=dtype)
        if self.what == "masked":
            return spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(5)})
        return box

    def action_space(self, agent: str) -> spaces.Space:
        if agent != "c":
            return action_space(self.kind)
        if self.what == "box":
            return spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        return spaces.Discrete(5 if self.what == "masked" else 4)

    def _obs(self, agent: str) -> Any:
        obs = super()._obs(agent)
        if agent != "c" or self.what == "actions":
            return obs
        if self.what == "masked":
            return {"observation": np.concatenate([obs["observation"], [7, 8]]).astype(np.float32),
                    "action_mask": np.concatenate([obs["action_mask"], [1]])}
        return np.concatenate([obs, [7, 8]]).astype(np.float32) if self.what == "obs" else \
            obs.astype(np.float64) if self.what == "dtype" else obs.reshape(2, 2)


class UnsupportedParallelEnv(StaggeredParallelEnv):
    """Wrong: spaces from ``unsupported_spaces``."""

    def __init__(self, what: str = "sequence_obs") -> None:
        super().__init__()
        self._obs_space, self._act_space = unsupported_spaces(what)

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space


class FaultyParallelEnv(StaggeredParallelEnv):
    """Misbehaves on demand: ``fault`` in raise_reset, raise_step, bad_obs_reset, bad_obs_step, missing_agent,
    no_obs_step (no observation for 'c'), vanish (drops 'c' from agents without a flag), rejoin ('a' comes
    back after it terminated)."""

    def __init__(self, fault: str = "raise_step") -> None:
        super().__init__()
        self.fault = fault

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if self.fault == "raise_reset":
            raise OSError("simulator crashed in reset")
        obs, infos = super().reset(seed=seed)
        if self.fault == "bad_obs_reset":
            obs["b"] = obs["b"].astype(str)
        if self.fault == "missing_agent":
            del obs["c"]
        return obs, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self.fault == "raise_step":
            raise ZeroDivisionError("physics blew up")
        obs, rewards, terms, truncs, infos = super().step(actions)
        if self.fault == "bad_obs_step":
            obs["c"] = obs["c"][:2]
        if self.fault == "no_obs_step":
            del obs["c"]
        if self.fault == "vanish":
            self.agents.remove("c")
        if self.fault == "rejoin" and self.t == 2:
            self.agents.insert(0, "a")
        return obs, rewards, terms, truncs, infos


def staggered_aec(**kwargs: Any) -> AECEnv:
    """Wrong: an AEC env where a ParallelEnv is expected."""
    from pettingzoo.utils.conversions import parallel_to_aec

    return parallel_to_aec(StaggeredParallelEnv(**kwargs))


class Factories:
    """Entry points reached through a dotted attribute path ('tests.fake_envs:Factories.staggered')."""

    @staticmethod
    def staggered(**kwargs: Any) -> StaggeredParallelEnv:
        return StaggeredParallelEnv(**kwargs)
