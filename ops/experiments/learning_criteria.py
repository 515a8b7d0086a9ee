"""Issue 16's learning check on one training curve, against the random policy's mean return (pure: records in,
booleans out; ``gridworld_seeds.py`` runs it on every seed).

The curve is the learner's metrics.jsonl: per update, ``agent_steps`` and ``episode_return_mean`` (the mean
return of the last 100 finished agent episodes). "Above random" means strictly greater than the random policy's
mean return; "below" means not above. The three criteria:

(a) ``above_random_by_1m``: the curve is above random at some record with at most 1M agent steps.
(b) ``final_at_least_3x_random``: the last record's return beats random by at least twice random's magnitude,
    ``final - random >= 2 * |random|``, and strictly beats it. For a positive random return (every gridworld:
    rewards are +1 per converted item) this is exactly ``final >= 3 * random``; the reading keeps "three times
    as good" meaningful when random's return is zero (then: ``final > 0``) or negative (then: ``final >= |random|``).
(c) ``no_long_phase_below_random``: after the first record above random, no phase below it lasts more than 2M
    agent steps. A phase runs from its first record below random to the next record above it (or to the last
    record when the run ends below). A curve never above random passes (c) vacuously and fails (a).

Records arrive once per update (trainer.batch_size agent steps), so a phase's edges are known to that resolution.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ABOVE_BY_AGENT_STEPS = 1_000_000
"""(a): the curve must be above random by this many agent steps."""
FINAL_MULTIPLE = 3.0
"""(b): the final return must be this many times as good as random's."""
MAX_BELOW_AGENT_STEPS = 2_000_000
"""(c): the longest phase below random allowed after the first time above it."""
UNNAMED_EPISODE_KEYS = ("episode_return_mean", "episode_length_mean")
"""metrics.jsonl's ``episode_*_mean`` keys that are not named episode stats."""


@dataclass(frozen=True, kw_only=True)
class CurvePoint:
    """One metrics.jsonl record's place on the learning curve."""

    agent_steps: int
    """Agent steps trained when the record was written."""
    return_mean: float
    """The last-100 mean episode return then."""


@dataclass(frozen=True, kw_only=True)
class CriteriaResult:
    """The three criteria on one curve, with the figures they were decided on."""

    first_above_agent_steps: int | None
    """Agent steps of the first record above random (None: never above)."""
    longest_below_agent_steps: int
    """Agent steps of the longest phase below random after the first time above (0: none)."""
    final_return: float | None
    """The last record's last-100 mean return (None: an empty curve)."""
    above_random_by_1m: bool
    """(a) above random at or before 1M agent steps."""
    final_at_least_3x_random: bool
    """(b) the final return at least 3x random's (see the module docstring for zero or negative random)."""
    no_long_phase_below_random: bool
    """(c) no phase below random longer than 2M agent steps after the first time above."""

    @property
    def passed(self) -> bool:
        """All three criteria hold."""
        return self.above_random_by_1m and self.final_at_least_3x_random and self.no_long_phase_below_random


def curve_from_records(records: Iterable[Mapping[str, Any]]) -> list[CurvePoint]:
    """The curve of metrics.jsonl records, in file order (records without a return yet are skipped)."""
    return [CurvePoint(agent_steps=int(record["agent_steps"]), return_mean=float(record["episode_return_mean"]))
            for record in records if record.get("episode_return_mean") is not None]


def beats_by_multiple(final: float, random_return: float, multiple: float = FINAL_MULTIPLE) -> bool:
    """``final`` is at least ``multiple`` times as good as ``random_return``: it beats it by (multiple - 1) times
    random's magnitude, and strictly (so that a zero random return needs a positive final)."""
    return final - random_return >= (multiple - 1.0) * abs(random_return) and final > random_return


def longest_phase_below(curve: Sequence[CurvePoint], random_return: float, start: int) -> int:
    """Agent steps of the longest phase below ``random_return`` in ``curve[start:]`` (0 if none)."""
    longest = 0
    phase_start: int | None = None
    for point in curve[start:]:
        if point.return_mean > random_return:
            if phase_start is not None:
                longest = max(longest, point.agent_steps - phase_start)
            phase_start = None
        elif phase_start is None:
            phase_start = point.agent_steps
    if phase_start is not None:
        longest = max(longest, curve[-1].agent_steps - phase_start)
    return longest


def evaluate_curve(curve: Sequence[CurvePoint], *, random_return: float,
                   above_by_agent_steps: int = ABOVE_BY_AGENT_STEPS, final_multiple: float = FINAL_MULTIPLE,
                   max_below_agent_steps: int = MAX_BELOW_AGENT_STEPS) -> CriteriaResult:
    """The three criteria (module docstring) of ``curve`` against the random policy's ``random_return``."""
    first_above = next((i for i, point in enumerate(curve) if point.return_mean > random_return), None)
    first_above_steps = curve[first_above].agent_steps if first_above is not None else None
    longest_below = longest_phase_below(curve, random_return, first_above) if first_above is not None else 0
    final = curve[-1].return_mean if curve else None
    return CriteriaResult(
        first_above_agent_steps=first_above_steps,
        longest_below_agent_steps=longest_below,
        final_return=final,
        above_random_by_1m=first_above_steps is not None and first_above_steps <= above_by_agent_steps,
        final_at_least_3x_random=final is not None and beats_by_multiple(final, random_return, final_multiple),
        no_long_phase_below_random=longest_below <= max_below_agent_steps,
    )


def return_at_marks(curve: Sequence[CurvePoint], marks: Iterable[int]) -> dict[int, float]:
    """The last-100 mean return when each mark was reached (the first record at or past it); marks the curve
    never reached are left out."""
    reached = {}
    for mark in marks:
        point = next((point for point in curve if point.agent_steps >= mark), None)
        if point is not None:
            reached[mark] = point.return_mean
    return reached


def last_episode_stats(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The named episode stats' last reported means (``episode_<name>_mean`` keys other than return and length),
    by name, e.g. {"items_collected": 4.2}."""
    stats: dict[str, float] = {}
    for record in records:
        for key, value in record.items():
            named = key.startswith("episode_") and key.endswith("_mean") and key not in UNNAMED_EPISODE_KEYS
            if named and value is not None:
                stats[key.removeprefix("episode_").removesuffix("_mean")] = float(value)
    return stats
