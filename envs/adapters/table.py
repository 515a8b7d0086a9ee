"""The adapters by ``env.name``: how ``envs.registry`` builds a user's env, one entry each.

Each entry imports its adapter module (and the library behind it: gymnasium, pettingzoo) only when an env is
built, so a config that names a built-in env never imports them. An adapter has no declared spec: the registry
reads it from one built env (``probe_env_spec`` in a child process). Its name is also in
``configs.env_config.EnvName`` (tests/test_env_table.py checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from configs.env_config import EnvConfig
from envs.base import VecEnv


@dataclass(frozen=True)
class Adapter:
    """How the registry builds one kind of user env and names it in messages."""

    make: Callable[[EnvConfig, int], VecEnv]
    """``num_envs`` envs through the adapter, its module imported only now (the agent count is checked by the
    registry)."""
    label: Callable[[EnvConfig], str]
    """How the env is named in messages, e.g. 'gymnasium:CartPole-v1' or 'pettingzoo:pkg.mod:fn'."""
    entry_point_example: str = ""
    """For an adapter built from ``env.entry_point``: an example of one, for the message when it is missing; ''
    for one that is not (gymnasium, which takes ``env.gym_id``)."""


def _entry_point_label(cfg: EnvConfig) -> str:
    return f"{cfg.name}:{cfg.entry_point}"


def _gymnasium(cfg: EnvConfig, num_envs: int) -> VecEnv:
    from envs.adapters.gym_adapter import GymnasiumVecEnv
    return GymnasiumVecEnv(cfg.gym_id, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs, obs_keys=cfg.obs_keys)


def _gymnasium_vector(cfg: EnvConfig, num_envs: int) -> VecEnv:
    from envs.adapters.gym_vector_adapter import GymnasiumVectorAdapter
    return GymnasiumVectorAdapter(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs,
                                  obs_keys=cfg.obs_keys)


def _pettingzoo(cfg: EnvConfig, num_envs: int) -> VecEnv:
    from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
    return PettingZooParallelAdapter(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs,
                                     obs_keys=cfg.obs_keys)


def _pettingzoo_aec(cfg: EnvConfig, num_envs: int) -> VecEnv:
    from envs.adapters.pettingzoo_aec_adapter import PettingZooAECAdapter
    return PettingZooAECAdapter(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs,
                                obs_keys=cfg.obs_keys)


def _native(cfg: EnvConfig, num_envs: int) -> VecEnv:
    from envs.adapters.native import make_native_env
    return make_native_env(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)


ADAPTERS: dict[str, Adapter] = {
    "gymnasium": Adapter(make=_gymnasium, label=lambda cfg: f"gymnasium:{cfg.gym_id}"),
    "gymnasium_vector": Adapter(make=_gymnasium_vector, label=_entry_point_label,
                                entry_point_example="gymnasium:make_vec"),
    "pettingzoo": Adapter(make=_pettingzoo, label=_entry_point_label,
                          entry_point_example="mpe2.simple_spread_v3:parallel_env"),
    "pettingzoo_aec": Adapter(make=_pettingzoo_aec, label=_entry_point_label,
                              entry_point_example="pettingzoo.classic.tictactoe_v3:env"),
    "native": Adapter(make=_native, label=_entry_point_label, entry_point_example="examples.corridor:CorridorVec"),
}
"""Every adapter by its ``env.name``."""
