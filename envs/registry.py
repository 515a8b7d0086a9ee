"""Build an env (or just read its spec) from the `env` section of a run config.

The built-in envs (``envs.builtin.table.BUILTIN_ENVS``) declare their spec from the config alone. The adapters
(``envs.adapters.table.ADAPTERS``: Gymnasium, PettingZoo, native entry points) are imported only when a config
names them, and ``probe_env_spec`` reads an external env's spec in a short-lived child process, so a learner never
builds a user's env in its own process.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from configs.env_config import ENV_NAMES, EnvConfig
from envs.adapters.table import ADAPTERS
from envs.base import EnvSpec, TokenLayout, VecEnv
from envs.builtin.table import BUILTIN_ENVS
from envs.errors import EnvConfigError, EnvRaised


def _check_name(cfg: EnvConfig) -> None:
    """ValueError unless ``cfg.name`` is one of ``ENV_NAMES``."""
    if cfg.name not in ENV_NAMES:
        allowed = ", ".join(repr(n) for n in ENV_NAMES)
        raise EnvConfigError(f"unknown env.name {cfg.name!r}; allowed names: {allowed}")


def env_label(cfg: EnvConfig) -> str:
    """How an env is named in messages: 'cartpole', 'gymnasium:CartPole-v1', 'pettingzoo:pkg.mod:fn'."""
    adapter = ADAPTERS.get(cfg.name)
    return cfg.name if adapter is None else adapter.label(cfg)


def _check_agents(cfg: EnvConfig, spec: EnvSpec) -> None:
    """ValueError if the config's agent count disagrees with what the env provides."""
    if cfg.num_agents != spec.num_agents:
        plural = "agent" if spec.num_agents == 1 else "agents"
        raise EnvConfigError(
            f"env.num_agents={cfg.num_agents} but env '{env_label(cfg)}' has "
            f"{spec.num_agents} {plural} per environment"
        )


def _declared_spec(cfg: EnvConfig) -> EnvSpec | None:
    """The spec of a built-in env (validated against ``cfg``), or None for an external one."""
    _check_name(cfg)
    builtin = BUILTIN_ENVS.get(cfg.name)
    if builtin is None:
        return None
    if cfg.tokens:
        raise EnvConfigError(f"env.tokens declares the token layout of an adapted env; the built-in env "
                             f"{cfg.name!r} declares its own observations: drop env.tokens")
    if cfg.obs_keys:
        raise EnvConfigError(f"env.obs_keys keeps keys of an adapted env's Dict observation; the built-in env "
                             f"{cfg.name!r} declares its own observations: drop env.obs_keys")
    spec = builtin.spec(cfg)
    _check_agents(cfg, spec)
    return spec


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


BUILD_NOTICE_S = 10.0
"""Seconds of building an env's spec before the first line saying it is still going (each later gap doubles, at
most BUILD_NOTICE_MAX_S)."""
BUILD_NOTICE_MAX_S = 60.0


def probe_env_spec(cfg: EnvConfig, *, note: Callable[[str], None] = print) -> EnvSpec:
    """The spec of the env ``cfg`` describes, without building any env in this process.

    Built-in envs declare theirs; an external env is built once in a short-lived spawned child that returns
    its spec and exits. Errors come back with their own type (EnvConfigError for a config the env rejects,
    EnvRaised for the env's own exception), the child's traceback chained as their cause. While the child builds,
    ``note`` gets a line after BUILD_NOTICE_S, then at doubling gaps; past ``env.build_timeout_s`` the child is
    killed and EnvConfigError says so (an env that hangs in its constructor never stalls the caller silently).
    """
    spec = _declared_spec(cfg)
    if spec is not None:
        return spec
    label, bound = env_label(cfg), cfg.build_timeout_s
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        try:
            pid = child.submit(os.getpid).result()
            built = child.submit(env_spec, cfg)
            gap, next_note = BUILD_NOTICE_S, BUILD_NOTICE_S
            while True:
                waited = time.monotonic() - started
                if waited >= bound:
                    os.kill(pid, signal.SIGKILL)
                    raise EnvConfigError(f"env '{label}': building it to read its spec took longer than "
                                         f"env.build_timeout_s ({bound:g} s); its constructor hangs, or it needs a "
                                         f"larger env.build_timeout_s")
                if waited >= next_note:
                    note(f"building env '{label}' to read its spec: {waited:.0f} s so far (env.build_timeout_s "
                         f"{bound:g})")
                    gap = min(2 * gap, BUILD_NOTICE_MAX_S)
                    next_note += gap
                if wait([built], timeout=min(next_note, bound) - waited).done:  # its own errors raise as they are
                    return built.result()
        except BrokenProcessPool as exc:
            raise EnvRaised(f"env '{label}': the process reading its spec died while building it "
                            f"(the env killed its process, or ran out of memory)") from exc


def _make_external(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """A Gymnasium / Gymnasium-vector / PettingZoo / native env through its adapter, agent count checked."""
    adapter = ADAPTERS[cfg.name]
    if cfg.name == "native" and cfg.obs_keys:
        raise EnvConfigError("env.obs_keys keeps keys of a Gymnasium or PettingZoo Dict observation; a native env "
                             "declares its own leaves (EnvSpec.obs_leaves): drop env.obs_keys")
    if adapter.entry_point_example and not cfg.entry_point:
        raise EnvConfigError(f"env.name '{cfg.name}' needs env.entry_point, e.g. {adapter.entry_point_example!r}")
    env = adapter.make(cfg, num_envs)
    try:
        _check_agents(cfg, env.spec)
        spec = with_token_layout(cfg, env.spec)
        if spec is not env.spec:
            try:
                env.spec = spec
            except AttributeError as err:  # a native env whose spec is a read-only property
                raise EnvConfigError(f"env.tokens: env '{env_label(cfg)}' has a read-only .spec; declare the "
                                     f"layout in its EnvSpec (tokens=TokenLayout(...)) instead") from err
    except EnvConfigError:
        env.close()
        raise
    return env


def with_token_layout(cfg: EnvConfig, spec: EnvSpec) -> EnvSpec:
    """``spec`` with the token layout ``env.tokens`` declares (unchanged when it declares none); EnvConfigError when
    the env's observations cannot hold it, or the env declares another one itself."""
    if not cfg.tokens:
        return spec
    if all(isinstance(layout, dict) for layout in cfg.tokens.values()):
        return _with_leaf_token_layouts(cfg, spec)
    if spec.obs_leaves:
        keys = ", ".join(leaf.name for leaf in spec.obs_leaves)
        raise EnvConfigError(f"env.tokens: env '{env_label(cfg)}' has a structured observation (leaves {keys}); "
                             f"declare the layout per key: env.tokens: {{<key>: {{num_locations, num_features, "
                             f"pad_value}}}}")
    layout = TokenLayout(**cfg.tokens)
    if spec.tokens is not None and spec.tokens != layout:
        raise EnvConfigError(f"env.tokens {cfg.tokens} but env '{env_label(cfg)}' declares its own token layout "
                             f"{dataclasses.asdict(spec.tokens)}: drop env.tokens or make them agree")
    try:
        layout.check_obs(spec.obs_shape, spec.obs_dtype)
    except EnvConfigError as err:
        raise EnvConfigError(f"env.tokens: env '{env_label(cfg)}': {err}") from err
    return dataclasses.replace(spec, tokens=layout)


def _with_leaf_token_layouts(cfg: EnvConfig, spec: EnvSpec) -> EnvSpec:
    """``spec`` with the per-key token layouts ``env.tokens: {<key>: {...}}`` declares on its top-level leaves."""
    leaves = {leaf.path: leaf for leaf in spec.obs_leaves}
    for key, fields in cfg.tokens.items():
        leaf = leaves.get((key,))
        if leaf is None:
            top = ", ".join(leaf.name for leaf in spec.obs_leaves if len(leaf.path) == 1) or "none"
            raise EnvConfigError(f"env.tokens.{key}: env '{env_label(cfg)}' has no top-level observation leaf "
                                 f"{key!r}; its top-level leaves: {top}")
        layout = TokenLayout(**fields)
        if leaf.tokens is not None and leaf.tokens != layout:
            raise EnvConfigError(f"env.tokens.{key} {fields} but env '{env_label(cfg)}' declares the leaf's own "
                                 f"layout {dataclasses.asdict(leaf.tokens)}: drop it or make them agree")
        if leaf.kind != "box":
            raise EnvConfigError(f"env.tokens.{key}: env '{env_label(cfg)}': leaf {key!r} is {leaf.kind}; token "
                                 f"observations must be an integer Box [L, 3]")
        try:
            layout.check_obs(leaf.shape, leaf.dtype)
        except EnvConfigError as err:
            raise EnvConfigError(f"env.tokens.{key}: env '{env_label(cfg)}': leaf {key!r}: {err}") from err
        leaves[(key,)] = dataclasses.replace(leaf, tokens=layout, image_layout="")
    return dataclasses.replace(spec, obs_leaves=tuple(leaves.values()))


def make_vec_env(cfg: EnvConfig, num_envs: int) -> VecEnv:
    """Build ``num_envs`` environments as ``cfg`` describes; the caller must ``close()`` it."""
    if _declared_spec(cfg) is None:
        return _make_external(cfg, num_envs)
    return BUILTIN_ENVS[cfg.name].make(cfg, num_envs)
