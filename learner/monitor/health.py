"""A training-health check on the value head, fed from each update's metrics and the recent episode returns.

When the value head's explained variance stays below ``threshold`` for ``patience`` consecutive updates while the
episode returns vary (their std above ``min_return_std``), the value function is not learning what there is to
learn: ``ValueHealthMonitor.observe`` returns one warning line then, and again only after the explained variance
has recovered (an update at or above the threshold) and relapsed. An update without a finite explained variance
(constant returns in the batch, an algorithm that reports none) or with constant episode returns breaks the streak.
The learner logs the line and exports the streak and the warnings to Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class ValueHealth:
    """The check's state after one update."""

    low_streak: int
    """Consecutive updates so far with explained variance below the threshold while returns varied."""
    stalled: bool
    """The streak reached ``patience`` and the explained variance has not recovered since."""
    warnings: int
    """Warnings given since the start (each a stall that began)."""
    warning: str | None
    """The warning line to log after this update (None: nothing new to say)."""


class ValueHealthMonitor:
    """Counts updates whose value head explains (almost) nothing of returns that do vary."""

    def __init__(self, *, threshold: float = 0.05, patience: int = 20, min_return_std: float = 1e-6) -> None:
        """``threshold``: explained variance below it is low; ``patience``: low updates in a row before the warning;
        ``min_return_std``: episode returns with a std at most this are constant (nothing to explain)."""
        self.threshold = threshold
        self.patience = patience
        self.min_return_std = min_return_std
        self.low_streak = 0
        self.stalled = False
        self.warnings = 0

    def observe(self, *, explained_variance: float | None, episode_returns: Sequence[float]) -> ValueHealth:
        """One update's explained variance and the returns of the recent episodes."""
        return_std = float(np.std(episode_returns)) if len(episode_returns) else 0.0
        finite = explained_variance is not None and math.isfinite(explained_variance)
        warning = None
        if finite and explained_variance >= self.threshold:
            self.low_streak = 0
            self.stalled = False
        elif finite and return_std > self.min_return_std:
            self.low_streak += 1
            if self.low_streak >= self.patience and not self.stalled:
                self.stalled = True
                self.warnings += 1
                warning = self._warning(return_std)
        else:
            self.low_streak = 0
        return ValueHealth(low_streak=self.low_streak, stalled=self.stalled, warnings=self.warnings, warning=warning)

    def _warning(self, return_std: float) -> str:
        return (f"learner: warning: the value head's explained variance has stayed below {self.threshold:g} for "
                f"{self.low_streak} updates while episode returns vary (std {return_std:.3g}); likely causes: "
                f"saturated inputs (observations far outside the network's range), uint8 observations with constant "
                f"padding, or a learning rate too high or too low")
