"""Action spaces an env can declare, and how each travels through Sluice.

One agent's action is one of:

* ``discrete``: one integer in ``[0, n)`` (wire shape ``()``, int32);
* ``multi_discrete``: ``k`` integers, component ``i`` in ``[0, nvec[i])`` (wire shape ``(k,)``, int32);
* ``box``: ``d`` float32 values (wire shape ``(d,)``); the policy samples from a Gaussian and the env
  receives the sample clipped to ``[low, high]`` (the log-probability is of the unclipped sample).

Discrete kinds may come with an action mask: ``mask_size = sum(nvec)`` uint8 flags per agent and step (1 =
legal), one block of ``nvec[i]`` flags per component.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from envs.errors import EnvConfigError

ACTION_KINDS = ("discrete", "multi_discrete", "box")


@dataclass(frozen=True, kw_only=True)
class ActionSpace:
    """One agent's action space; build it with ``discrete``, ``multi_discrete`` or ``box``."""

    kind: str
    """One of ACTION_KINDS."""
    nvec: tuple[int, ...] = ()
    """Categories per component (discrete: one entry; box: empty)."""
    low: tuple[float, ...] = ()
    """Lower bound per dimension (box only; may be -inf)."""
    high: tuple[float, ...] = ()
    """Upper bound per dimension (box only; may be +inf)."""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise EnvConfigError(f"action space kind {self.kind!r}; allowed: {', '.join(map(repr, ACTION_KINDS))}")
        if self.kind == "box":
            if self.nvec or not self.low or len(self.low) != len(self.high):
                raise EnvConfigError("a box action space needs low and high of one equal, nonzero length and no nvec")
            if any(not lo <= hi for lo, hi in zip(self.low, self.high)):
                raise EnvConfigError(f"box action bounds need low <= high, got low={self.low} high={self.high}")
        else:
            if not self.nvec or any(n < 1 for n in self.nvec) or self.low or self.high:
                raise EnvConfigError(f"a {self.kind} action space needs nvec of positive sizes and no bounds, "
                                 f"got nvec={self.nvec}")
            if self.kind == "discrete" and len(self.nvec) != 1:
                raise EnvConfigError(f"a discrete action space has one component, got nvec={self.nvec}")

    @staticmethod
    def discrete(n: int) -> "ActionSpace":
        """``n`` choices."""
        return ActionSpace(kind="discrete", nvec=(int(n),))

    @staticmethod
    def multi_discrete(nvec: tuple[int, ...] | list[int]) -> "ActionSpace":
        """One choice per component, ``nvec[i]`` choices for component ``i``."""
        return ActionSpace(kind="multi_discrete", nvec=tuple(int(n) for n in nvec))

    @staticmethod
    def box(low: Any, high: Any) -> "ActionSpace":
        """Continuous actions of ``len(low)`` dimensions within ``[low, high]``."""
        lo = np.asarray(low, dtype=np.float64).reshape(-1)
        hi = np.asarray(high, dtype=np.float64).reshape(-1)
        return ActionSpace(kind="box", low=tuple(float(x) for x in lo), high=tuple(float(x) for x in hi))

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one agent's action: () for discrete, (k,) for multi_discrete, (d,) for box."""
        if self.kind == "discrete":
            return ()
        return (len(self.nvec),) if self.kind == "multi_discrete" else (len(self.low),)

    @property
    def dtype(self) -> str:
        """NumPy dtype of actions: int32 for the discrete kinds, float32 for box."""
        return "float32" if self.kind == "box" else "int32"

    @property
    def size(self) -> int:
        """Scalars per action (1 for discrete)."""
        return math.prod(self.shape)

    @property
    def num_actions(self) -> int:
        """Choices of a discrete space (ValueError for the other kinds)."""
        if self.kind != "discrete":
            raise EnvConfigError(f"num_actions is defined for discrete action spaces, this one is {self.kind}")
        return self.nvec[0]

    @property
    def param_size(self) -> int:
        """Outputs of the policy's action head: sum(nvec) logits, or a mean and a log-std per box dimension."""
        return 2 * len(self.low) if self.kind == "box" else sum(self.nvec)

    @property
    def num_logits(self) -> int:
        """Logits of the discrete kinds, which is also the width of an action mask (sum(nvec)); 0 for box."""
        return 0 if self.kind == "box" else sum(self.nvec)

    def describe(self) -> str:
        """Human form for messages, e.g. ``Discrete(5)``, ``MultiDiscrete([3, 2])``, ``Box(2,)``."""
        if self.kind == "discrete":
            return f"Discrete({self.nvec[0]})"
        if self.kind == "multi_discrete":
            return f"MultiDiscrete({list(self.nvec)})"
        return f"Box({len(self.low)},)"

    def check_actions(self, actions: np.ndarray, who: str) -> None:
        """ValueError naming ``who`` and the first bad action if any discrete action is out of range."""
        if self.kind == "box":
            return
        nvec = np.asarray(self.nvec).reshape((1,) * (actions.ndim - len(self.shape)) + self.shape)
        bad = (actions < 0) | (actions >= nvec)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise EnvConfigError(f"{who}: action {actions[index]} at index {index} is out of range for "
                             f"{self.describe()}")
