"""The built-in envs by ``env.name``: one entry each, all ``envs.registry`` knows about them.

An entry says how to read the env's spec from the config without building it (checking what the config asks of
the env on the way) and how to build it. Adding a built-in env is its module under ``envs/builtin/``, one entry
here, and its name in ``configs.env_config.EnvName`` (configs cannot import envs; tests/test_env_table.py fails
until the two agree). The registry checks the agent count against the spec for every entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from configs.env_config import EnvConfig
from envs.base import EnvSpec, VecEnv
from envs.builtin.cartpole import CartPoleVec
from envs.builtin.connect_four.game import ConnectFourVec, check_max_steps
from envs.builtin.gridworld import GridworldVec, grid_settings
from envs.builtin.probes import MemoryProbeVec, TruncationProbeVec, memory_delay
from envs.builtin.simple_spread import SimpleSpreadVec, spread_local_ratio
from envs.errors import EnvConfigError


@dataclass(frozen=True)
class BuiltinEnv:
    """How the registry reads the spec of one built-in env and builds it."""

    spec: Callable[[EnvConfig], EnvSpec]
    """The env's spec for this config, nothing built; EnvConfigError for kwargs, sizes or a time limit the env
    refuses."""
    make: Callable[[EnvConfig, int], VecEnv]
    """``num_envs`` of the env as the config describes (called only after ``spec`` accepted the config)."""


def check_no_kwargs(cfg: EnvConfig) -> None:
    """EnvConfigError if ``cfg`` passes env.kwargs to an env that takes none."""
    if cfg.kwargs:
        raise EnvConfigError(f"env.kwargs is not supported for env '{cfg.name}' (got keys {sorted(cfg.kwargs)})")


def _cartpole_spec(cfg: EnvConfig) -> EnvSpec:
    check_no_kwargs(cfg)
    return CartPoleVec.SPEC


def _probe_truncation_spec(cfg: EnvConfig) -> EnvSpec:
    check_no_kwargs(cfg)
    if cfg.max_steps < 1:
        raise EnvConfigError(f"env.max_steps for env 'probe_truncation' must be an integer >= 1 "
                             f"(the time limit is the point of this probe), got {cfg.max_steps}")
    return TruncationProbeVec.SPEC


def _probe_memory_spec(cfg: EnvConfig) -> EnvSpec:
    memory_delay(cfg.kwargs)
    return MemoryProbeVec.SPEC


def _connect_four_spec(cfg: EnvConfig) -> EnvSpec:
    check_no_kwargs(cfg)
    check_max_steps(cfg.max_steps)
    return ConnectFourVec.SPEC


def _gridworld_spec(cfg: EnvConfig) -> EnvSpec:
    """Gridworld's kwargs and window checked; its spec follows the config (any agent count >= 1)."""
    grid_settings(cfg.kwargs, cfg.num_agents)
    if cfg.obs_height < 1 or cfg.obs_width < 1:
        raise EnvConfigError(f"env.obs_height/obs_width for env 'gridworld' must be >= 1, "
                             f"got {cfg.obs_height}x{cfg.obs_width}")
    return GridworldVec.spec_for(cfg.num_agents, cfg.obs_height, cfg.obs_width)


def _simple_spread_spec(cfg: EnvConfig) -> EnvSpec:
    """simple_spread's kwargs (local_ratio) and agent count checked (any >= 1, landmarks as many as agents)."""
    spread_local_ratio(cfg.kwargs)
    if cfg.num_agents < 1:
        raise EnvConfigError(f"env.num_agents for env 'simple_spread' must be >= 1, got {cfg.num_agents}")
    return SimpleSpreadVec.spec_for(cfg.num_agents)


BUILTIN_ENVS: dict[str, BuiltinEnv] = {
    "cartpole": BuiltinEnv(
        spec=_cartpole_spec,
        make=lambda cfg, num_envs: CartPoleVec(num_envs, max_steps=cfg.max_steps)),
    "gridworld": BuiltinEnv(
        spec=_gridworld_spec,
        make=lambda cfg, num_envs: GridworldVec(num_envs, num_agents=cfg.num_agents, obs_height=cfg.obs_height,
                                                obs_width=cfg.obs_width, max_steps=cfg.max_steps,
                                                kwargs=cfg.kwargs)),
    "connect_four": BuiltinEnv(
        spec=_connect_four_spec,
        make=lambda cfg, num_envs: ConnectFourVec(num_envs, max_steps=cfg.max_steps)),
    "simple_spread": BuiltinEnv(
        spec=_simple_spread_spec,
        make=lambda cfg, num_envs: SimpleSpreadVec(num_envs, num_agents=cfg.num_agents, max_steps=cfg.max_steps,
                                                   local_ratio=spread_local_ratio(cfg.kwargs))),
    "probe_truncation": BuiltinEnv(
        spec=_probe_truncation_spec,
        make=lambda cfg, num_envs: TruncationProbeVec(num_envs, max_steps=cfg.max_steps)),
    "probe_memory": BuiltinEnv(
        spec=_probe_memory_spec,
        make=lambda cfg, num_envs: MemoryProbeVec(num_envs, delay=memory_delay(cfg.kwargs))),
}
"""Every built-in env by its ``env.name``."""
