"""Structured (Dict / Tuple) observations carried as one flat buffer: lay leaves out, flatten, read back.

A structured observation travels as ONE flat array per agent slot, ``EnvSpec.obs_shape == (N,)`` of
``EnvSpec.obs_dtype``, with ``EnvSpec.obs_leaves`` (``envs.base.ObsLeaf``) saying which slice holds which leaf. So
shared memory, rows, the wire and the learner's row checks are the same code as for any flat observation; only the
env side (``flatten_obs``) and the policy's encoder (``policies.leaf_encoder``, which slices the flat tensor per
leaf) know the structure.

The flat dtype (``flat_dtype``): uint8 when every leaf is exact in uint8 (a uint8 or bool Box, Discrete with
n <= 256, MultiDiscrete with every nvec <= 256, MultiBinary), else float32, exact for integers of magnitude up to
2**24 (larger discrete leaves are refused when the spec is built; integer Box values past it when flattened).
Discrete kinds are stored as ``value - start`` (what an embedding reads); ``unflatten_obs`` adds start back. A float64
Box leaf travels as float32 (as any float observation the policy reads); every other leaf reads back bit for bit.

Why one flat buffer and not one row field per leaf, measured on a MiniGrid-like Dict (image Box 7x7x3 uint8 +
direction Discrete(4)) on a 2-core Intel Xeon VM (Python 3.11, NumPy 2.4; timeit, best of 5):

* bytes per step: flat uint8 147 + 1 = 148 B (19,092 B of obs in a 129-step row). One field per leaf: 147 B +
  the direction as int64, 8 B = 155 B, and every extra row field adds its own entry to the row table (name, shape,
  dtype in each message header), its own shared-memory array per slot, poison fill and validation pass: a
  two-field row is not smaller than the flat one, and every stage of the row path would have to learn structure.
* flatten cost (``ObsFlattener.flatten``, every leaf checked): about 6-7 us for one observation, 7-10 us for a
  batch of 64 (a vector env's step: 0.1-0.16 us per observation). Copying the two leaves into two separate
  per-leaf buffers unchecked costs 0.3-0.4 us; MiniGrid's own ``step`` costs about 100 us, so the checked flatten
  adds 6-7 % to a Python env's step and nothing measurable to a vector env's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.base import FLOAT32_EXACT, EnvSpec, ObsLeaf
from envs.errors import EnvConfigError


def flat_dtype(leaves: Sequence[ObsLeaf]) -> str:
    """uint8 when every leaf is exact in uint8, else float32."""
    return "uint8" if all(leaf.fits_uint8() for leaf in leaves) else "float32"


def structured_obs(leaves: Sequence[ObsLeaf]) -> dict[str, Any]:
    """``obs_shape``, ``obs_dtype`` and ``obs_leaves`` for ``EnvSpec(**structured_obs(leaves), ...)``: the leaves
    laid out one after another in the given order (their own offsets ignored), in the flat dtype they need."""
    if not leaves:
        raise EnvConfigError("a structured observation needs at least one leaf")
    laid, offset = [], 0
    for leaf in leaves:
        laid.append(dataclasses.replace(leaf, offset=offset))
        offset += leaf.size
    return {"obs_shape": (offset,), "obs_dtype": flat_dtype(laid), "obs_leaves": tuple(laid)}


def leaf_label(leaf: ObsLeaf) -> str:
    """How messages name a leaf: "leaf 'image'" (or "the observation" for a one-leaf observation)."""
    return f"leaf {leaf.name!r}" if leaf.path else "the observation"


def int_range(leaf: ObsLeaf, dtype: str) -> tuple[int, int]:
    """The values an integer or bool box leaf may take in a flat obs of ``dtype``: its dtype's and the buffer's."""
    own = np.dtype(leaf.dtype)
    low, high = (0, 1) if own == np.bool_ else (int(np.iinfo(own).min), int(np.iinfo(own).max))
    carried = (0, 255) if dtype == "uint8" else (-FLOAT32_EXACT, FLOAT32_EXACT)
    return max(low, carried[0]), min(high, carried[1])


def _first_bad(bad: np.ndarray, values: np.ndarray) -> str:
    """The first offending value (and its index) of an array, for messages."""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{values[index].item()!r}" + (f" at index {list(index)}" if index else "")


@dataclass(frozen=True, kw_only=True)
class LeafCheck:
    """What checking and writing one leaf needs, worked out once per spec (``ObsFlattener``)."""

    leaf: ObsLeaf
    """The leaf."""
    columns: slice
    """Where the leaf lies in the flat obs."""
    shape: tuple[int, ...]
    """The leaf's own shape."""
    size: int
    """Values of the leaf."""
    floats: bool
    """A float Box leaf: any numbers are accepted, non-finite ones refused."""
    low: np.ndarray | int
    """Smallest allowed value (per element of the leaf's shape for the discrete kinds)."""
    count: np.ndarray | int
    """Allowed values from ``low`` on (value - low must lie in [0, count))."""
    exact_dtypes: tuple[np.dtype, ...]
    """Integer dtypes whose every value is allowed (no range check needed)."""
    allowed: str
    """The allowed values, for messages."""


def leaf_check(leaf: ObsLeaf, dtype: str) -> LeafCheck:
    """The LeafCheck of a leaf in a flat obs of ``dtype``."""
    where = {"leaf": leaf, "columns": slice(leaf.offset, leaf.offset + leaf.size), "shape": leaf.shape,
             "size": leaf.size}
    own = np.dtype(leaf.dtype)
    if leaf.kind == "box" and own.kind == "f":
        return LeafCheck(**where, floats=True, low=0, count=0, exact_dtypes=(), allowed="finite numbers")
    if leaf.kind == "box":
        low, high = int_range(leaf, dtype)
        exact = tuple(np.dtype(d) for d in ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int64")
                      if low <= np.iinfo(d).min and np.iinfo(d).max <= high) + (np.dtype(bool),)
        return LeafCheck(**where, floats=False, low=low, count=high - low + 1, exact_dtypes=exact,
                         allowed=f"[{low}, {high}]")
    if leaf.kind == "multi_binary":
        return LeafCheck(**where, floats=False, low=0, count=2, exact_dtypes=(np.dtype(bool),), allowed="{0, 1}")
    low_values = np.asarray(leaf.start, dtype=np.int64).reshape(leaf.shape)
    count = np.asarray(leaf.nvec, dtype=np.int64).reshape(leaf.shape)
    allowed = (f"[{leaf.start[0]}, {leaf.start[0] + leaf.nvec[0]})" if leaf.kind == "discrete"
               else "[start[i], start[i] + nvec[i]) per component")
    return LeafCheck(**where, floats=False, low=low_values, count=count, exact_dtypes=(), allowed=allowed)


def find_leaf_value(raw: Any, leaf: ObsLeaf, where: str) -> Any:
    """The part of a structured observation at the leaf's path; EnvConfigError naming the missing key or index."""
    node = raw
    for depth, key in enumerate(leaf.path):
        if isinstance(key, str) and isinstance(node, Mapping) and key in node:
            node = node[key]
            continue
        if isinstance(key, int) and isinstance(node, (tuple, list)) and 0 <= key < len(node):
            node = node[key]
            continue
        at = ".".join(str(part) for part in leaf.path[:depth]) or "the top"
        if isinstance(key, str):
            have = sorted(map(str, node)) if isinstance(node, Mapping) else type(node).__name__
            raise EnvConfigError(f"{where} an observation without key {key!r} at {at} (for {leaf_label(leaf)}); "
                                 f"it has {have}")
        have = f"{len(node)} items" if isinstance(node, (tuple, list)) else type(node).__name__
        raise EnvConfigError(f"{where} an observation without item {key} at {at} (for {leaf_label(leaf)}); it has "
                             f"{have}")
    return node


class ObsFlattener:
    """Writes structured observations into the flat obs of one spec, every leaf checked (the checks are worked out
    once here, so a step pays only for the comparisons)."""

    def __init__(self, spec: EnvSpec) -> None:
        if not spec.obs_leaves:
            raise EnvConfigError("ObsFlattener needs an EnvSpec with observation leaves (EnvSpec.obs_leaves)")
        self.spec = spec
        self._checks = [leaf_check(leaf, spec.obs_dtype) for leaf in spec.obs_leaves]

    def flatten(self, raw: Any, *, lead: tuple[int, ...] = (), out: np.ndarray | None = None,
                where: str = "the env returned") -> np.ndarray:
        """Observation(s) with leading batch shape ``lead`` as the flat obs [*lead, N]; see ``flatten_obs``."""
        if out is None:
            out = np.zeros((*lead, *self.spec.obs_shape), dtype=self.spec.obs_dtype)
        for check in self._checks:
            array = np.asarray(find_leaf_value(raw, check.leaf, where))
            values = self._checked(array, check, lead, where)
            out[..., check.columns] = values.reshape((*lead, check.size))
        return out

    @staticmethod
    def _checked(array: np.ndarray, check: LeafCheck, lead: tuple[int, ...], where: str) -> np.ndarray:
        """The leaf's values as the flat buffer holds them; EnvConfigError naming the leaf on a mismatch."""
        leaf = check.leaf
        kind = array.dtype.kind
        if array.shape != (*lead, *check.shape) or kind not in ("fiub" if check.floats else "iub"):
            numbers = "numbers" if check.floats else "integers"
            raise EnvConfigError(f"{where} {leaf_label(leaf)} with shape {array.shape} dtype {array.dtype}; expected "
                                 f"shape {(*lead, *leaf.shape)} of {numbers} ({leaf.kind} {leaf.dtype})")
        if check.floats:
            if kind == "f" and not np.isfinite(array).all():
                raise EnvConfigError(f"{where} {leaf_label(leaf)} holds a non-finite value "
                                     f"{_first_bad(~np.isfinite(array), array)}")
            return array
        if array.dtype in check.exact_dtypes:
            return array
        values = array.astype(np.int64) - check.low
        bad = (values < 0) | (values >= check.count)
        if bad.any():
            raise EnvConfigError(f"{where} {leaf_label(leaf)} with dtype {array.dtype} holds {_first_bad(bad, array)}, "
                                 f"outside {check.allowed} ({leaf.kind} {leaf.dtype})")
        return values if leaf.kind in ("discrete", "multi_discrete") else array


def flatten_obs(raw: Any, spec: EnvSpec, *, lead: tuple[int, ...] = (), out: np.ndarray | None = None,
                where: str = "the env returned") -> np.ndarray:
    """A structured observation (nested dicts / tuples of arrays, each with leading batch shape ``lead``) as the
    flat obs [*lead, N] of ``spec``, every leaf checked (shape, integer or number dtype, range, finite floats);
    written into ``out`` when given (a native env's ``buffers.obs`` rows), else into a new zeroed array.
    EnvConfigError starting with ``where`` and naming the leaf on a mismatch. (A caller that flattens every step
    keeps an ``ObsFlattener``.)"""
    return ObsFlattener(spec).flatten(raw, lead=lead, out=out, where=where)


def unflatten_obs(flat: np.ndarray, leaves: Sequence[ObsLeaf]) -> Any:
    """The structured observation(s) a flat obs [..., N] holds: dicts for Dict levels, tuples for Tuple levels,
    each leaf [..., *shape] in its own dtype (discrete kinds with start added back)."""
    flat = np.asarray(flat)
    lead = flat.shape[:-1]
    values: dict[tuple[str | int, ...], np.ndarray] = {}
    for leaf in leaves:
        part = flat[..., leaf.offset:leaf.offset + leaf.size]
        if leaf.kind in ("discrete", "multi_discrete"):
            part = part.astype(np.int64) + np.asarray(leaf.start, dtype=np.int64)
        values[leaf.path] = part.reshape((*lead, *leaf.shape)).astype(leaf.dtype)
    if () in values:
        return values[()]
    return _nest(values)


def _nest(values: dict[tuple[str | int, ...], np.ndarray]) -> Any:
    """Nested dicts / tuples from {path: value} (paths of one level's keys all str or all int)."""
    children: dict[str | int, dict[tuple[str | int, ...], np.ndarray]] = {}
    for path, value in values.items():
        children.setdefault(path[0], {})[path[1:]] = value
    built = {key: (child[()] if () in child else _nest(child)) for key, child in children.items()}
    if all(isinstance(key, int) for key in built):
        return tuple(built[key] for key in sorted(built))
    return built


def random_flat_obs(spec: EnvSpec, batch: int, rng: np.random.Generator) -> np.ndarray:
    """``batch`` valid random flat observations of a structured spec (discrete values in range, token leaves with
    real and padding rows, uint8 boxes as bytes, float boxes N(0, 4)), for tests and the export check."""
    obs = np.zeros((batch, *spec.obs_shape), dtype=spec.obs_dtype)
    for leaf in spec.obs_leaves:
        shape = (batch, leaf.size)
        if leaf.kind in ("discrete", "multi_discrete"):
            values = rng.integers(0, np.asarray(leaf.nvec), size=shape)
        elif leaf.kind == "multi_binary":
            values = rng.integers(0, 2, size=shape)
        elif leaf.tokens is not None:
            rows = rng.integers(0, leaf.tokens.num_features, size=(batch, leaf.shape[0], 3))
            rows[..., 0] = np.where(rng.random((batch, leaf.shape[0])) < 0.5,
                                    rng.integers(0, leaf.tokens.num_locations, size=(batch, leaf.shape[0])),
                                    leaf.tokens.pad_value)
            values = rows.reshape(shape)
        elif np.dtype(leaf.dtype).kind == "f":
            values = 2.0 * rng.standard_normal(shape)
        else:
            low, high = int_range(leaf, spec.obs_dtype)
            values = rng.integers(max(low, 0), min(high, 255) + 1, size=shape)
        obs[:, leaf.offset:leaf.offset + leaf.size] = values
    return obs
