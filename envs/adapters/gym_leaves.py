"""A structured Gymnasium observation space (Dict / Tuple, nested) as ``envs.base.ObsLeaf`` leaves, and
``env.obs_keys``, which keeps some of a Dict's top-level keys.

Leaves are Box (any numeric dtype; rank 3 declared an image by ``image_layout_of``, which ``gym_spaces`` also
applies to a Box observation), Discrete, MultiDiscrete and MultiBinary, in the space's own order (Gymnasium sorts a
Dict's keys); a Discrete, MultiDiscrete or MultiBinary observation space on its own is a structured observation of
one leaf. Anything else (Text,
Sequence, Graph, ...) is an EnvConfigError naming the leaf; inside a Dict it says which ``env.obs_keys`` leave it
out. ``env.obs_keys``: the top-level Dict keys to keep (in the space's order; [] keeps all); ``action_mask`` is
never a leaf (``gym_spaces`` takes it as the action mask).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from envs.base import FLOAT32_EXACT, ObsLeaf
from envs.errors import EnvConfigError

IMAGE_CHANNELS_MAX = 4
"""Most channels an axis of a rank-3 Box may have to be read as its channel axis (RGB, RGBA, a few stacked frames)."""
MASK_KEY = "action_mask"
"""The Dict key that holds the legal-action mask (PettingZoo's classic convention), never an observation leaf."""


def image_layout_of(obs_shape: tuple[int, ...]) -> str:
    """``EnvSpec.image_layout`` of a Box observation: hwc (last axis <= 4), else chw (first axis <= 4), else ""."""
    if len(obs_shape) != 3:
        return ""
    if obs_shape[-1] <= IMAGE_CHANNELS_MAX:
        return "hwc"
    return "chw" if obs_shape[0] <= IMAGE_CHANNELS_MAX else ""


class UnsupportedLeaf(EnvConfigError):
    """A leaf space Sluice cannot carry; ``path`` says where it is."""

    def __init__(self, path: tuple[str | int, ...], space: spaces.Space) -> None:
        self.path = path
        self.space = space
        name = ".".join(str(part) for part in path)
        super().__init__(f"leaf {name!r} is a {type(space).__name__} space, which Sluice cannot carry (it carries "
                         f"Box, Discrete, MultiDiscrete and MultiBinary leaves)")


def select_keys(label: str, space: spaces.Space, obs_keys: Sequence[str]) -> spaces.Space:
    """``space`` without its action mask and with only the ``obs_keys`` top-level keys (all when empty);
    EnvConfigError naming a key the Dict does not have, or when ``obs_keys`` is given for a space that is no Dict."""
    if not isinstance(space, spaces.Dict):
        if obs_keys:
            raise EnvConfigError(f"env.obs_keys {list(obs_keys)}: {label} has a {type(space).__name__} observation "
                                 f"space, not a Dict, so it has no keys to keep; drop env.obs_keys")
        return space
    keys = [key for key in space.spaces if key != MASK_KEY]
    for key in obs_keys:
        if key not in keys:
            raise EnvConfigError(f"env.obs_keys: key {key!r} is not in the observation of {label}; its keys are "
                                 f"{', '.join(map(str, keys))}" + (f" ({MASK_KEY} is always the action mask)"
                                                                   if MASK_KEY in space.spaces else ""))
    kept = [key for key in keys if not obs_keys or key in obs_keys]
    return spaces.Dict({key: space.spaces[key] for key in kept}, sort_keys=False)


def leaves_of(label: str, space: spaces.Space) -> list[ObsLeaf]:
    """The leaves of a structured observation space (offsets not yet laid out); EnvConfigError naming the leaf
    that cannot be carried (for a Dict, with the ``env.obs_keys`` that leave it out)."""
    leaves: list[ObsLeaf] = []
    try:
        _walk(space, (), leaves)
    except UnsupportedLeaf as err:
        if isinstance(space, spaces.Dict) and err.path:
            keep = [str(key) for key in space.spaces if key != err.path[0]]
            raise EnvConfigError(f"env.obs_keys: {label}: {err}; leave it out with env.obs_keys: "
                                 f"[{', '.join(keep)}]") from err
        raise EnvConfigError(f"{label}: {err}") from err
    if not leaves:
        raise EnvConfigError(f"{label}: the observation space {space!r} has no leaves left (env.obs_keys)")
    return leaves


def _walk(space: spaces.Space, path: tuple[str | int, ...], out: list[ObsLeaf]) -> None:
    """Append the leaves of ``space`` (at ``path``) to ``out``."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise EnvConfigError(f"observation Dict key {key!r} at {list(path)} is not a string")
            _walk(sub, (*path, key), out)
    elif isinstance(space, spaces.Tuple):
        for index, sub in enumerate(space.spaces):
            _walk(sub, (*path, index), out)
    else:
        out.append(leaf_of(space, path))


def leaf_of(space: spaces.Space, path: tuple[str | int, ...]) -> ObsLeaf:
    """The ObsLeaf of one leaf space (offset 0); UnsupportedLeaf for a space that is no leaf Sluice carries."""
    if isinstance(space, spaces.Discrete):
        return ObsLeaf(path=path, kind="discrete", dtype=np.dtype(space.dtype).name, nvec=(int(space.n),),
                       start=(int(space.start),))
    if isinstance(space, spaces.MultiDiscrete):
        return ObsLeaf(path=path, kind="multi_discrete", shape=space.nvec.shape, dtype=np.dtype(space.dtype).name,
                       nvec=tuple(int(n) for n in space.nvec.reshape(-1)),
                       start=tuple(int(s) for s in np.broadcast_to(space.start, space.nvec.shape).reshape(-1)))
    if isinstance(space, spaces.MultiBinary):
        return ObsLeaf(path=path, kind="multi_binary", shape=space.shape, dtype=np.dtype(space.dtype).name)
    if isinstance(space, spaces.Box) and np.dtype(space.dtype).kind in "fiub":
        dtype = np.dtype(space.dtype)
        if dtype.kind in "iu" and dtype != np.uint8 and (np.any(space.low < -FLOAT32_EXACT)
                                                        or np.any(space.high > FLOAT32_EXACT)):
            name = ".".join(str(part) for part in path)
            raise EnvConfigError(f"observation leaf {name!r} is an integer Box ({dtype.name}) with bounds "
                                 f"[{space.low.min()}, {space.high.max()}]: integers beyond +-2**24 are not exact "
                                 f"in the float32 flat observation; bound the Box within +-{FLOAT32_EXACT} or make "
                                 f"it a float Box")
        shape = tuple(int(d) for d in space.shape)
        return ObsLeaf(path=path, kind="box", shape=shape, dtype=dtype.name, image_layout=image_layout_of(shape))
    raise UnsupportedLeaf(path, space)
