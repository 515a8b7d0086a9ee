"""Build an env (or just read its spec) from the `env` section of a run config."""

from __future__ import annotations

from actors.envs.base import EnvSpec, VecEnv
from actors.envs.cartpole import CartPoleVec
from actors.envs.connect_four import ConnectFourVec, check_max_steps
from actors.envs.gridworld import GridworldVec, grid_settings
from actors.envs.gym_adapter import GymnasiumVecEnv
from actors.envs.gym_vector_adapter import GymnasiumVectorAdapter
from actors.envs.native import make_native_env
from actors.envs.pettingzoo_adapter import PettingZooParallelAdapter
from actors.envs.probes import MemoryProbeVec, TruncationProbeVec, memory_delay
from configs.env_config import ENV_NAMES, EnvConfig


def _check_name(cfg: EnvConfig) -> None:
    """ValueError unless ``cfg.name`` is one of ``ENV_NAMES``."""
    if cfg.name not in ENV_NAMES:
        allowed = ", ".join(repr(n) for n in ENV_NAMES)
        raise ValueError(f"unknown env.name {cfg.name!r}; allowed names: {allowed}")


def env_label(cfg: EnvConfig) -> str:
    """How an env is named in messages: 'cartpole', 'gymnasium:CartPole-v1', 'pettingzoo:pkg.mod:fn'."""
    if cfg.name == "gymnasium":
        return f"gymnasium:{cfg.gym_id}"
    if cfg.name in _ENTRY_POINT_ENVS:
        return f"{cfg.name}:{cfg.entry_point}"
    return cfg.name


def _check_agents(cfg: EnvConfig, spec: EnvSpec) -> None:
    """ValueError if the config's agent count disagrees with what the env provides."""
    if cfg.num_agents != spec.num_agents:
        plural = "agent" if spec.num_agents == 1 else "agents"
        raise ValueError(
            f"env.num_agents={cfg.num_agents} but env '{env_label(cfg)}' has "
            f"{spec.num_agents} {plural} per environment"
        )


def _check_no_kwargs(cfg: EnvConfig) -> None:
    """The built-in cartpole and probe_truncation take no extra constructor arguments."""
    if cfg.kwargs:
        raise ValueError(f"env.kwargs is not supported for env '{cfg.name}' (got keys {sorted(cfg.kwargs)})")


_ENTRY_POINT_ENVS = {"gymnasium_vector": GymnasiumVectorAdapter, "pettingzoo": PettingZooParallelAdapter,
                     "native": make_native_env}
"""Envs built by calling env.entry_point ('module:callable')."""

_BUILTIN_SPECS: dict[str, EnvSpec] = {
    "cartpole": CartPoleVec.SPEC,
    "probe_truncation": TruncationProbeVec.SPEC,
    "probe_memory": MemoryProbeVec.SPEC,
    "connect_four": ConnectFourVec.SPEC,
}


def _check_builtin(cfg: EnvConfig) -> EnvSpec:
    """Validate kwargs and agent count of a built-in env; returns its spec."""
    if cfg.name == "probe_memory":
        memory_delay(cfg.kwargs)
    else:
        _check_no_kwargs(cfg)
    if cfg.name == "probe_truncation" and cfg.max_steps < 1:
        raise ValueError(f"env.max_steps for env 'probe_truncation' must be an integer >= 1 "
                         f"(the time limit is the point of this probe), got {cfg.max_steps}")
    if cfg.name == "connect_four":
        check_max_steps(cfg.max_steps)
    spec = _BUILTIN_SPECS[cfg.name]
    _check_agents(cfg, spec)
    return spec


def _gridworld_spec(cfg: EnvConfig) -> EnvSpec:
    """Validate gridworld's kwargs and window; its spec follows the config (any agent count >= 1)."""
    grid_settings(cfg.kwargs, cfg.num_agents)
    if cfg.obs_height < 1 or cfg.obs_width < 1:
        raise ValueError(f"env.obs_height/obs_width for env 'gridworld' must be >= 1, "
                         f"got {cfg.obs_height}x{cfg.obs_width}")
    return GridworldVec.spec_for(cfg.num_agents, cfg.obs_height, cfg.obs_width)


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """The spec of the env ``cfg`` describes (building one throwaway external env if needed)."""
    _check_name(cfg)
    if cfg.name == "gridworld":
        return _gridworld_spec(cfg)
    if cfg.name in _BUILTIN_SPECS:
        return _check_builtin(cfg)
    env = _make_external(cfg, 1)
    spec = env.spec
    env.close()
    return spec


def _make_external(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """A Gymnasium / Gymnasium-vector / PettingZoo env through its adapter, agent count checked."""
    if cfg.name == "gymnasium":
        env: VecEnv = GymnasiumVecEnv(cfg.gym_id, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    else:
        if not cfg.entry_point:
            raise ValueError(f"env.name '{cfg.name}' needs env.entry_point, e.g. "
                             f"{_ENTRY_POINT_EXAMPLES[cfg.name]!r}")
        env = _ENTRY_POINT_ENVS[cfg.name](cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    try:
        _check_agents(cfg, env.spec)
    except ValueError:
        env.close()
        raise
    return env


_ENTRY_POINT_EXAMPLES = {"gymnasium_vector": "gymnasium:make_vec", "pettingzoo": "mpe2.simple_spread_v3:parallel_env",
                         "native": "examples.corridor:CorridorVec"}


def make_vec_env(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """Build ``num_envs`` environments as ``cfg`` describes; the caller must ``close()`` it."""
    _check_name(cfg)
    if cfg.name == "gridworld":
        _gridworld_spec(cfg)
        return GridworldVec(num_envs, num_agents=cfg.num_agents, obs_height=cfg.obs_height,
                            obs_width=cfg.obs_width, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    if cfg.name in _BUILTIN_SPECS:
        _check_builtin(cfg)
        if cfg.name == "cartpole":
            return CartPoleVec(num_envs, max_steps=cfg.max_steps)
        if cfg.name == "probe_truncation":
            return TruncationProbeVec(num_envs, max_steps=cfg.max_steps)
        if cfg.name == "connect_four":
            return ConnectFourVec(num_envs, max_steps=cfg.max_steps)
        return MemoryProbeVec(num_envs, delay=memory_delay(cfg.kwargs))
    return _make_external(cfg, num_envs)
