"""A user's own native vectorised env, built by ``env.entry_point`` and checked against the contract.

``env.name: native`` with ``env.entry_point: 'my_package.my_env:MyVecEnv'`` calls
``MyVecEnv(num_envs=..., max_steps=..., **env.kwargs)``; what comes back must follow ``envs.base.VecEnv``:
an ``EnvSpec`` as ``.spec``, ``.num_envs`` as asked, and ``reset``/``step``/``close``. Every mismatch is a
ValueError naming the entry point and what was expected. docs/ENVIRONMENTS.md walks through writing one.

A native env with a structured (dict / tuple) observation declares its leaves in its spec,
``EnvSpec(**envs.obs_layout.structured_obs([ObsLeaf(path=("image",), kind="box", shape=(7, 7, 3), dtype="uint8",
image_layout="hwc"), ObsLeaf(path=("direction",), kind="discrete", nvec=(4,))]), ...)``, and writes each observation
into its flat row with ``envs.obs_layout.flatten_obs(obs, spec, out=buffers.obs[slot])`` (or a whole batch with
``lead=(n,)``), which checks every leaf.
"""

from __future__ import annotations

from typing import Any

from envs.base import EnvSpec, VecEnv
from envs.adapters.entry_point import resolve_entry_point
from envs.errors import EnvConfigError, EnvRaised


def make_native_env(entry_point: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any]) -> VecEnv:
    """Build the user's VecEnv and check its shape of contract (not yet its outputs: the worker does that)."""
    factory = resolve_entry_point(entry_point, env_name="native")
    label = f"native:{entry_point}"
    try:
        env = factory(num_envs=num_envs, max_steps=max_steps, **kwargs)
    except TypeError as exc:
        raise EnvConfigError(f"env '{label}' could not be built with num_envs={num_envs}, max_steps={max_steps} and "
                         f"env.kwargs {sorted(kwargs)}: {exc}") from exc
    except Exception as exc:
        raise EnvRaised(f"env '{label}' raised in make(): {exc!r}") from exc
    missing = [name for name in ("spec", "num_envs", "reset", "step", "close") if not hasattr(env, name)]
    problem = ""
    if missing:
        problem = f"it has no {', '.join(missing)}"
    elif not isinstance(env.spec, EnvSpec):
        problem = f"its .spec is a {type(env.spec).__name__}, not an envs.base.EnvSpec"
    elif env.num_envs != num_envs:
        problem = f"it has num_envs={env.num_envs}, but {num_envs} were asked for"
    if problem:
        close = getattr(env, "close", None)
        if callable(close):
            close()
        raise EnvConfigError(f"env '{label}' does not follow the VecEnv contract (envs/base.py): {problem}")
    return env
