"""Build an env (or just read its spec) from the `env` section of a run config.

Built-in envs declare their spec statically. The adapters (Gymnasium, PettingZoo, native entry points) are
imported only when a config names them, and ``probe_env_spec`` reads an external env's spec in a short-lived
child process, so a learner never builds a user's env in its own process.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from envs.base import EnvSpec, VecEnv
from envs.cartpole import CartPoleVec
from envs.connect_four import ConnectFourVec, check_max_steps
from envs.gridworld import GridworldVec, grid_settings
from envs.probes import MemoryProbeVec, TruncationProbeVec, memory_delay
from envs.simple_spread import SimpleSpreadVec, spread_local_ratio
from configs.env_config import ENV_NAMES, EnvConfig
from envs.errors import EnvConfigError, EnvRaised


def _check_name(cfg: EnvConfig) -> None:
    """ValueError unless ``cfg.name`` is one of ``ENV_NAMES``."""
    if cfg.name not in ENV_NAMES:
        allowed = ", ".join(repr(n) for n in ENV_NAMES)
        raise EnvConfigError(f"unknown env.name {cfg.name!r}; allowed names: {allowed}")


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
        raise EnvConfigError(
            f"env.num_agents={cfg.num_agents} but env '{env_label(cfg)}' has "
            f"{spec.num_agents} {plural} per environment"
        )


def _check_no_kwargs(cfg: EnvConfig) -> None:
    """The built-in cartpole and probe_truncation take no extra constructor arguments."""
    if cfg.kwargs:
        raise EnvConfigError(f"env.kwargs is not supported for env '{cfg.name}' (got keys {sorted(cfg.kwargs)})")


def _build_entry_point_env(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """An env built by calling env.entry_point ('module:callable'), its adapter imported only now."""
    if cfg.name == "gymnasium_vector":
        from envs.gym_vector_adapter import GymnasiumVectorAdapter
        return GymnasiumVectorAdapter(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    if cfg.name == "pettingzoo":
        from envs.pettingzoo_adapter import PettingZooParallelAdapter
        return PettingZooParallelAdapter(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    from envs.native import make_native_env
    return make_native_env(cfg.entry_point, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)


_ENTRY_POINT_ENVS = ("gymnasium_vector", "pettingzoo", "native")
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
        raise EnvConfigError(f"env.max_steps for env 'probe_truncation' must be an integer >= 1 "
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
        raise EnvConfigError(f"env.obs_height/obs_width for env 'gridworld' must be >= 1, "
                         f"got {cfg.obs_height}x{cfg.obs_width}")
    return GridworldVec.spec_for(cfg.num_agents, cfg.obs_height, cfg.obs_width)


def _simple_spread_spec(cfg: EnvConfig) -> EnvSpec:
    """Validate simple_spread's kwargs (local_ratio) and agent count (any >= 1, landmarks as many as agents)."""
    spread_local_ratio(cfg.kwargs)
    if cfg.num_agents < 1:
        raise EnvConfigError(f"env.num_agents for env 'simple_spread' must be >= 1, got {cfg.num_agents}")
    return SimpleSpreadVec.spec_for(cfg.num_agents)


def _declared_spec(cfg: EnvConfig) -> EnvSpec | None:
    """The spec of a built-in env (validated against ``cfg``), or None for an external one."""
    _check_name(cfg)
    if cfg.name == "gridworld":
        return _gridworld_spec(cfg)
    if cfg.name == "simple_spread":
        return _simple_spread_spec(cfg)
    if cfg.name in _BUILTIN_SPECS:
        return _check_builtin(cfg)
    return None


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """The spec of the env ``cfg`` describes, building one throwaway external env in this process if needed.

    For a process that builds the env anyway (an actor host, the arena); the learner uses ``probe_env_spec``.
    """
    spec = _declared_spec(cfg)
    if spec is not None:
        return spec
    env = _make_external(cfg, 1)
    spec = env.spec
    env.close()
    return spec


def probe_env_spec(cfg: EnvConfig) -> EnvSpec:
    """The spec of the env ``cfg`` describes, without building any env in this process.

    Built-in envs declare theirs; an external env is built once in a short-lived spawned child that returns
    its spec and exits. Errors come back with their own type (EnvConfigError for a config the env rejects,
    EnvRaised for the env's own exception), the child's traceback chained as their cause.
    """
    spec = _declared_spec(cfg)
    if spec is not None:
        return spec
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        try:
            return child.submit(env_spec, cfg).result()
        except BrokenProcessPool as exc:
            raise EnvRaised(f"env '{env_label(cfg)}': the process reading its spec died while building it "
                            f"(the env killed its process, or ran out of memory)") from exc


def _make_external(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """A Gymnasium / Gymnasium-vector / PettingZoo env through its adapter, agent count checked."""
    if cfg.name == "gymnasium":
        from envs.gym_adapter import GymnasiumVecEnv
        env: VecEnv = GymnasiumVecEnv(cfg.gym_id, num_envs, max_steps=cfg.max_steps, kwargs=cfg.kwargs)
    else:
        if not cfg.entry_point:
            raise EnvConfigError(f"env.name '{cfg.name}' needs env.entry_point, e.g. "
                             f"{_ENTRY_POINT_EXAMPLES[cfg.name]!r}")
        env = _build_entry_point_env(cfg, num_envs)
    try:
        _check_agents(cfg, env.spec)
    except EnvConfigError:
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
    if cfg.name == "simple_spread":
        _simple_spread_spec(cfg)
        return SimpleSpreadVec(num_envs, num_agents=cfg.num_agents, max_steps=cfg.max_steps,
                               local_ratio=spread_local_ratio(cfg.kwargs))
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
