"""Checking a decoded message's arrays against an expected layout.

:func:`~protocol.framing.decode` guarantees that arrays are well formed; this
module checks that they are the arrays a given receiver expects (names,
dtypes, shapes, finiteness, and a common row count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .framing import ALLOWED_DTYPES, dtype_name
from .messages import Message, ProtocolError

__all__ = ["ANY", "ArraySpec", "check_arrays", "check_leading_dims", "out_of_range_index"]

#: Shape entry meaning "any size" in an :class:`ArraySpec`.
ANY = -1


@dataclass(frozen=True)
class ArraySpec:
    """Expected dtype and shape of one array.

    ``-1`` in ``shape`` matches any size; a leading ``-1`` is the row count,
    which must agree across all arrays whose spec has a leading ``-1``. With
    ``allow_nonfinite=False`` float arrays must not contain NaN or inf.
    """

    dtype: str
    shape: tuple[int, ...]
    allow_nonfinite: bool = True

    def __post_init__(self) -> None:
        name = np.dtype(self.dtype).name
        if name not in ALLOWED_DTYPES:
            raise ValueError(f"ArraySpec dtype {self.dtype!r} is not an allowed wire dtype")
        object.__setattr__(self, "dtype", name)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < ANY for d in self.shape):
            raise ValueError(f"ArraySpec shape {self.shape} may only hold sizes >= 0 or -1")

    def describe(self) -> str:
        """Human form, e.g. ``float32[*, 4]``."""
        dims = ", ".join("*" if d == ANY else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"

    def matches_shape(self, shape: tuple[int, ...]) -> bool:
        """Whether ``shape`` fits this spec."""
        return len(shape) == len(self.shape) and all(
            want in (ANY, got) for want, got in zip(self.shape, shape)
        )


def _describe(array: np.ndarray) -> str:
    dims = ", ".join(str(d) for d in array.shape)
    return f"{array.dtype.name}[{dims}]"


def check_leading_dims(msg: Message, specs: Mapping[str, ArraySpec]) -> int | None:
    """Return the common leading size of arrays whose spec starts with ``-1``.

    Returns ``None`` when no spec has a leading ``-1``. Raises
    ``ProtocolError("bad_array")`` when those arrays disagree. Arrays absent
    from ``msg`` are skipped (:func:`check_arrays` reports them).
    """
    rows: int | None = None
    first = ""
    for name, spec in specs.items():
        if not spec.shape or spec.shape[0] != ANY or name not in msg.arrays:
            continue
        array = msg.arrays[name]
        if array.ndim == 0:
            continue
        if rows is None:
            rows, first = int(array.shape[0]), name
        elif array.shape[0] != rows:
            raise ProtocolError(
                "bad_array",
                f"array '{name}' has {array.shape[0]} rows but array '{first}' has {rows}: "
                "leading dimensions must agree",
            )
    return rows


def check_arrays(msg: Message, specs: Mapping[str, ArraySpec]) -> None:
    """Check that ``msg.arrays`` matches ``specs`` exactly.

    Raises ``ProtocolError("bad_array")`` for a missing or unexpected array, a
    wrong dtype or shape, or disagreeing leading dimensions, and
    ``ProtocolError("non_finite")`` for NaN/inf in a float array whose spec
    has ``allow_nonfinite=False``.
    """
    missing = [name for name in specs if name not in msg.arrays]
    if missing:
        raise ProtocolError(
            "bad_array",
            f"{msg.type.value} message is missing array(s) {', '.join(repr(m) for m in missing)}",
        )
    extra = [name for name in msg.arrays if name not in specs]
    if extra:
        raise ProtocolError(
            "bad_array",
            f"{msg.type.value} message has unexpected array(s) {', '.join(repr(e) for e in extra)}",
        )
    for name, spec in specs.items():
        array = msg.arrays[name]
        if dtype_name(array.dtype) != spec.dtype:
            raise ProtocolError(
                "bad_array",
                f"array '{name}': expected dtype {spec.dtype} ({spec.describe()}), "
                f"got {array.dtype.name} ({_describe(array)})",
            )
        if not spec.matches_shape(array.shape):
            raise ProtocolError(
                "bad_array",
                f"array '{name}': expected shape {spec.describe()}, got {_describe(array)}",
            )
    check_leading_dims(msg, specs)
    for name, spec in specs.items():
        array = msg.arrays[name]
        if spec.allow_nonfinite or array.dtype.kind != "f" or array.size == 0:
            continue
        finite = np.isfinite(array)
        if not finite.all():
            bad = int(finite.size - np.count_nonzero(finite))
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ProtocolError(
                "non_finite",
                f"array '{name}' has {bad} non-finite value(s), first at index {first} "
                f"({array[first]!r})",
            )


def out_of_range_index(actions: np.ndarray, nvec: tuple[int, ...]) -> tuple[int, ...] | None:
    """Index of the first discrete action outside ``[0, nvec[i])`` of its component, or None when all are in range.
    ``actions`` is [..., len(nvec)] for several components, [...] for one. (The ingest's row checks and the learner's
    batch both ask it, so it lives below both.)"""
    if actions.size == 0:
        return None
    high = np.asarray(nvec, dtype=np.int64)
    components = actions.reshape(-1, len(nvec))
    if components.min() >= 0 and (components.max(axis=0) < high).all():
        return None
    bound = high if len(nvec) > 1 else int(high[0])
    return tuple(int(i) for i in np.argwhere((actions < 0) | (actions >= bound))[0])
