"""The `env` section of a run config: which environment the actors build."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from configs.field_rules import MayBeEmpty, PositiveInt, Range

EnvName = Literal["cartpole", "gridworld", "native", "gymnasium", "gymnasium_vector", "pettingzoo",
                  "probe_truncation", "probe_memory", "connect_four", "simple_spread", "pettingzoo_aec"]
"""The env families ``env.name`` allows."""
ENV_NAMES: tuple[str, ...] = get_args(EnvName)
"""The same names as a tuple (envs.registry checks them)."""


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Which env to build and its size; shared by actors (which build it) and learner (which reads its spec)."""

    name: EnvName = "cartpole"
    """Env family: cartpole, gridworld, connect_four or simple_spread (built-in; connect_four is two-player
    turn-based, so num_agents 2; simple_spread is mpe2's MPE simple_spread_v3 with continuous actions, N agents
    and N landmarks, kwargs local_ratio, max_steps <= 0 meaning mpe2's 25), native (your own VecEnv, by
    entry_point), gymnasium (one env by gym_id), gymnasium_vector, pettingzoo (a ParallelEnv) or pettingzoo_aec (a
    turn-based AEC env, played like connect_four: one active agent per env; self-play and the arena work on it) built
    by entry_point, or a learner probe: probe_truncation, probe_memory."""
    gym_id: str = "CartPole-v1"
    """Gymnasium env id, used when name is 'gymnasium'."""
    entry_point: str = ""
    """'module:callable' building the env: for native (a VecEnv, called with num_envs=, max_steps= and kwargs),
    gymnasium_vector (a gymnasium VectorEnv, called with num_envs= and kwargs), pettingzoo (a ParallelEnv, called
    with kwargs) and pettingzoo_aec (an AECEnv, called with kwargs, e.g. 'pettingzoo.classic.tictactoe_v3:env')."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the env constructor (gymnasium.make, the entry point, or a built-in env)."""
    tokens: dict[str, Any] = field(default_factory=dict)
    """An adapted env's observation is a padded token list: {num_locations, num_features, pad_value} declares its
    layout (obs [L, 3] integer rows of location, feature id, value; a row whose location is pad_value is padding),
    so model.encoder auto picks the token encoder; for a Dict observation {<key>: {num_locations, num_features,
    pad_value}, ...} declares it for those top-level keys' leaves; {} (the default): not declared."""
    obs_keys: Annotated[list[str], MayBeEmpty()] = field(default_factory=list)
    """The top-level keys of an adapted env's Dict observation to keep, e.g. [direction, image] (MiniGrid without
    its Text 'mission'); the rest are dropped. [] (the default) keeps every key."""
    num_agents: PositiveInt = 1
    """Agents per environment (1 for single-agent envs)."""
    obs_width: PositiveInt = 11
    """Observation window width (gridworld envs)."""
    obs_height: PositiveInt = 11
    """Observation window height (gridworld envs)."""
    max_steps: int = 500
    """Episode time limit in steps; reaching it truncates the episode (bootstrapped, not terminal)."""
    step_timeout_s: Annotated[float, Range(low=0.1)] = 60.0
    """Deadline in seconds for one env group's step on an actor host (from the host handing it actions to the
    worker's answer, env rebuilds included): a worker past it (a hung env, a stopped process) is reported,
    killed and respawned, counted like a worker death."""
    build_timeout_s: Annotated[float, Range(low=1.0)] = 300.0
    """Deadline in seconds for building an adapted or native env: the child that reads its spec for the learner (and
    for each actor host) past it is killed and the run stops with one line; an env worker that has not built and
    reset its envs by then is reported, killed and respawned, counted like a worker death."""
