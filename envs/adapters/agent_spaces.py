"""The spaces of a PettingZoo env's agents as the one slot layout they share; used by both PettingZoo adapters.

When every agent has the same observation and action space, one ``SpaceConverter`` serves them all. When they
differ (MPE's simple_tag, simple_adversary, simple_push, simple_speaker_listener, simple_world_comm), the agents
still share one policy, so their slots get one padded layout, built from each agent's own converter:

* observations: every agent's observation (validated against its own space, ``obs_keys`` applied) must be a 1-D
  array of one dtype; agent ``i``'s ``d_i`` values fill the first ``d_i`` entries of ``max(d) + K`` zeros, and
  entry ``max(d) + k`` is 1 for an agent of kind ``k``: the agents with the same pair of spaces are one kind,
  numbered in ``possible_agents`` order, so the shared policy can tell an adversary from a good agent;
* actions, all ``Discrete``: ``Discrete(max(n))``, with an action mask where the ``n_i`` differ or an agent's
  observation carries one: agent ``i``'s first ``n_i`` actions are legal (those its env's own ``action_mask``
  allows, when it has one) and the rest never are;
* actions, all 1-D ``Box``: ``Box`` of ``max(d)`` entries (each entry's bounds the widest of the agents that have
  it); agent ``i``'s env gets the first ``d_i``, clipped to its own bounds.

Where the spaces differ, anything else (observations that are images, structured or tokens, observation dtypes
that differ, Discrete actions beside Box ones, multi-discrete actions) is an ``EnvConfigError`` naming two agents,
their spaces and what can be padded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envs.adapters.gym_spaces import SpaceConverter
from envs.base import EnvSpec
from envs.errors import EnvConfigError
from envs.spaces import ActionSpace

PADDABLE = ("agents with differing spaces are padded into one layout when every agent's observation is a 1-D "
            "array of one dtype and the actions are all Discrete or all 1-D Box")


class AgentSpaces:
    """Every agent's spaces, their shared ``spec``, and the conversions of one agent's observations and actions."""

    def __init__(self, label: str, env: Any, agents: Sequence[str], *, obs_keys: Sequence[str]) -> None:
        """Read each agent's spaces from ``env`` (EnvConfigError if they differ in a way that cannot be padded)."""
        self.label = label
        self.agents = tuple(agents)
        spaces_of = [(env.observation_space(agent), env.action_space(agent)) for agent in self.agents]
        kinds: list[tuple[Any, Any]] = []
        self.kind_of = np.zeros(len(self.agents), dtype=np.int64)
        """Each agent's kind: the index of its pair of spaces among the distinct pairs."""
        for i, pair in enumerate(spaces_of):
            if pair not in kinds:
                kinds.append(pair)
            self.kind_of[i] = kinds.index(pair)
        self._converters = [SpaceConverter(label, obs, action, num_agents=len(self.agents),
                                           source=f"observation_space({self.agents[self._first(k)]!r})",
                                           obs_keys=obs_keys)
                            for k, (obs, action) in enumerate(kinds)]
        self.padded = len(kinds) > 1
        """Whether the agents' spaces differ (and so are padded)."""
        self.spec: EnvSpec = self._converters[0].spec if not self.padded else self._padded_spec()

    def _first(self, kind: int) -> int:
        """The first agent of ``kind``."""
        return int(np.flatnonzero(self.kind_of == kind)[0])

    def _refuse(self, kind: int, why: str) -> EnvConfigError:
        """The error for spaces that cannot be padded: ``why`` about the first agent of ``kind`` against agent 0."""
        first, other = self.agents[0], self.agents[self._first(kind)]
        ours, theirs = self._converters[0].spec, self._converters[kind].spec
        return EnvConfigError(f"{self.label}: the agents' spaces differ and cannot be padded into one layout: {why} "
                              f"({first!r} has observation {ours.obs_shape} "
                              f"{ours.obs_dtype}, actions {ours.action.describe()}; {other!r} has observation "
                              f"{theirs.obs_shape} {theirs.obs_dtype}, actions {theirs.action.describe()}); {PADDABLE}")

    def _padded_spec(self) -> EnvSpec:
        """The layout every agent's slot gets (see the module docstring); EnvConfigError if there is none."""
        specs = [converter.spec for converter in self._converters]
        first = specs[0]
        for k, spec in enumerate(specs):
            if spec.obs_leaves or spec.tokens is not None or len(spec.obs_shape) != 1:
                raise self._refuse(k, "an observation is not a 1-D array")
            if spec.obs_dtype != first.obs_dtype:
                raise self._refuse(k, "the observation dtypes differ")
            if spec.action.kind != first.action.kind or spec.action.kind not in ("discrete", "box"):
                raise self._refuse(k, "the actions are not all Discrete or all 1-D Box")
        self._obs_sizes = np.array([spec.obs_shape[0] for spec in specs], dtype=np.int64)
        self._width = int(self._obs_sizes.max())
        obs_shape = (self._width + len(specs),)
        if first.action.kind == "discrete":
            self._action_sizes = np.array([spec.action.nvec[0] for spec in specs], dtype=np.int64)
            action = ActionSpace.discrete(int(self._action_sizes.max()))
        else:
            self._action_sizes = np.array([spec.action.shape[0] for spec in specs], dtype=np.int64)
            size = int(self._action_sizes.max())
            low, high = np.full(size, np.inf), np.full(size, -np.inf)
            for spec in specs:
                d = spec.action.shape[0]
                low[:d] = np.minimum(low[:d], spec.action.low)
                high[:d] = np.maximum(high[:d], spec.action.high)
            action = ActionSpace.box(low, high)
        masked = action.kind == "discrete" and (len(set(self._action_sizes.tolist())) > 1
                                                or any(spec.action_mask for spec in specs))
        return EnvSpec(num_agents=len(self.agents), obs_shape=obs_shape, obs_dtype=first.obs_dtype, action=action,
                       action_mask=masked)

    def obs_and_mask(self, agent: int, raw: Any, *, call: str, where: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Agent ``agent``'s (observation, uint8 mask or None) in the shared layout, from what the env returned;
        EnvConfigError if it does not fit the agent's own space."""
        kind = int(self.kind_of[agent])
        obs, mask = self._converters[kind].obs_and_mask(raw, call=call, where=where)
        if not self.padded:
            return obs, mask
        padded = np.zeros(self.spec.obs_shape, dtype=obs.dtype)
        padded[:len(obs)] = obs
        padded[self._width + kind] = 1
        if not self.spec.action_mask:
            return padded, None
        legal = np.zeros(self.spec.mask_size, dtype=np.uint8)
        legal[:self._action_sizes[kind]] = 1 if mask is None else mask
        return padded, legal

    def check_actions(self, actions: np.ndarray, agents: np.ndarray, where: Callable[[int], str]) -> None:
        """EnvConfigError naming a row ``b`` (as ``where(b)``) whose action is out of range or not finite for its
        agent (``agents[b]``: an index into ``possible_agents``): the first such row of the first kind that has one."""
        if not self.padded:
            self._converters[0].check_actions(actions, where)
            return
        for kind, converter in enumerate(self._converters):
            rows = np.flatnonzero(self.kind_of[agents] == kind)
            if len(rows):
                size = self._action_sizes[kind]
                view = actions[rows] if self.spec.action.kind == "discrete" else actions[rows, :size]
                converter.check_actions(view, lambda r, rows=rows: where(int(rows[r])))

    def to_env_action(self, agent: int, action: np.ndarray) -> Any:
        """One Sluice action of agent ``agent`` as its env's action."""
        kind = int(self.kind_of[agent])
        if self.padded and self.spec.action.kind == "box":
            action = action[:self._action_sizes[kind]]
        return self._converters[kind].to_env_action(action)
