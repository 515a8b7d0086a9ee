"""Rules that sit on a config field's type: ``Annotated[int, Range(low=1)]`` bounds a number, ``Literal[...]`` lists
the allowed strings.

``configs.loader`` reads them from the type hints (``typing.get_type_hints(cls, include_extras=True)``), so a rule
moves and is renamed with its field. On a list's item type (``list[PositiveInt]``) a range bounds every item. Rules
that read more than one field, or look inside a value, live in ``configs.rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True, kw_only=True)
class Range:
    """The numbers a field allows: low and high (None = unbounded), each inclusive or not."""

    low: float | None = None
    """Smallest allowed value (None: no lower bound); write it as the field's type (1, 0.0), messages show it so."""
    high: float | None = None
    """Largest allowed value (None: no upper bound)."""
    low_inclusive: bool = True
    """low itself is allowed (>=) or not (>)."""
    high_inclusive: bool = True
    """high itself is allowed (<=) or not (<)."""

    def allows(self, value: float) -> bool:
        """Whether ``value`` lies in the range."""
        too_low = self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive))
        too_high = self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive))
        return not (too_low or too_high)

    def describe(self) -> str:
        """The range as error messages write it, e.g. ``> 0.0 and <= 1.0``."""
        left = "unbounded" if self.low is None else f"{'>=' if self.low_inclusive else '>'} {self.low}"
        right = "" if self.high is None else f" and {'<=' if self.high_inclusive else '<'} {self.high}"
        return left + right


@dataclass(frozen=True, kw_only=True)
class MayBeEmpty:
    """On a list field: [] is a value it allows (the loader otherwise asks a list for at least one item)."""


PositiveInt = Annotated[int, Range(low=1)]
"""An integer >= 1 (a count, a size, an interval)."""
NonNegativeInt = Annotated[int, Range(low=0)]
"""An integer >= 0."""
PositiveFloat = Annotated[float, Range(low=0.0, low_inclusive=False)]
"""A number > 0.0 (a rate, a clip, a timeout)."""
NonNegativeFloat = Annotated[float, Range(low=0.0)]
"""A number >= 0.0 (a coefficient where 0 means off)."""
Fraction = Annotated[float, Range(low=0.0, high=1.0)]
"""A number in [0.0, 1.0]."""
PositiveFraction = Annotated[float, Range(low=0.0, high=1.0, low_inclusive=False)]
"""A number in (0.0, 1.0] (a discount, a decay rate, an update rate)."""
