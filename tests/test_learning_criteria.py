"""Issue 16's learning criteria (ops/experiments/learning_criteria.py, what gridworld_seeds scores every seed with):
hand-made curves, a synthetic metrics list, and a whole-array NumPy reference. Pure functions: no processes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ops.experiments import learning_criteria as criteria


def grid_curve(*points: tuple[float, float]) -> list[criteria.CurvePoint]:
    """A hand-made curve from (million agent steps, last-100 mean return) pairs."""
    return [criteria.CurvePoint(agent_steps=int(m * 1e6), return_mean=r) for m, r in points]


def test_grid_criteria_pass_a_curve_that_rises_early_and_stays_above() -> None:
    curve = grid_curve((0.5, 1.0), (1.0, 1.5), (2.0, 1.2), (4.0, 3.0), (8.0, 4.5))
    result = criteria.evaluate_curve(curve, random_return=1.32)
    assert result.first_above_agent_steps == 1_000_000 and result.final_return == 4.5
    assert result.above_random_by_1m and result.final_at_least_3x_random and result.no_long_phase_below_random
    assert result.passed
    # the dip at 2M (one record) is a phase of 2M agent steps to the next record above: exactly the limit
    assert result.longest_below_agent_steps == 2_000_000


def test_grid_criteria_fail_a_dip_below_random_longer_than_2m() -> None:
    curve = grid_curve((0.5, 2.0), (1.0, 1.0), (2.0, 1.1), (3.1, 1.3), (3.2, 2.0), (8.0, 5.0))
    result = criteria.evaluate_curve(curve, random_return=1.32)
    assert result.above_random_by_1m and result.final_at_least_3x_random
    assert result.longest_below_agent_steps == 2_200_000
    assert not result.no_long_phase_below_random and not result.passed


def test_grid_criteria_fail_a_run_that_ends_in_a_long_dip() -> None:
    curve = grid_curve((0.5, 5.0), (1.0, 1.0), (3.5, 0.5))
    result = criteria.evaluate_curve(curve, random_return=1.0)
    assert result.longest_below_agent_steps == 2_500_000 and not result.no_long_phase_below_random


def test_grid_criteria_fail_a_late_start_and_a_weak_finish() -> None:
    late = criteria.evaluate_curve(grid_curve((1.0, 1.0), (8.0, 0.8), (9.0, 9.0)),
                                        random_return=1.0)
    assert late.first_above_agent_steps == 9_000_000 and not late.above_random_by_1m
    assert late.final_at_least_3x_random and late.no_long_phase_below_random
    weak = criteria.evaluate_curve(grid_curve((0.5, 2.0), (8.0, 2.9)), random_return=1.0)
    assert weak.above_random_by_1m and not weak.final_at_least_3x_random
    never = criteria.evaluate_curve(grid_curve((0.5, 0.2), (8.0, 0.9)), random_return=1.0)
    assert never.first_above_agent_steps is None and never.longest_below_agent_steps == 0
    assert not never.above_random_by_1m and never.no_long_phase_below_random and not never.passed
    empty = criteria.evaluate_curve([], random_return=1.0)
    assert empty.final_return is None and not empty.passed


def test_grid_criteria_read_3x_as_twice_randoms_magnitude_above_it() -> None:
    beats = criteria.beats_by_multiple
    assert beats(3.0, 1.0) and not beats(2.99, 1.0)
    assert beats(0.1, 0.0) and not beats(0.0, 0.0)  # zero random: strictly better is needed
    assert beats(10.0, -10.0) and not beats(9.9, -10.0)  # negative random: improve by 2 |random|


def test_grid_criteria_read_a_synthetic_metrics_list() -> None:
    records = [
        {"update": 1, "agent_steps": 65536, "episode_return_mean": None, "episode_length_mean": None},
        {"update": 2, "agent_steps": 131072, "episode_return_mean": 2.0, "episode_length_mean": 1000.0,
         "episode_items_collected_mean": 3.0, "episode_items_converted_mean": None},
        {"update": 3, "agent_steps": 1_048_576, "episode_return_mean": 3.5, "episode_length_mean": 1000.0,
         "episode_items_collected_mean": 5.0, "episode_items_converted_mean": 3.5},
    ]
    curve = criteria.curve_from_records(records)
    assert [(p.agent_steps, p.return_mean) for p in curve] == [(131072, 2.0), (1_048_576, 3.5)]
    assert criteria.return_at_marks(curve, [100_000, 1_000_000, 2_000_000]) == {100_000: 2.0, 1_000_000: 3.5}
    assert criteria.last_episode_stats(records) == {"items_collected": 5.0, "items_converted": 3.5}
    result = criteria.evaluate_curve(curve, random_return=1.0)
    assert result.passed and result.first_above_agent_steps == 131072


def reference_criteria(steps: np.ndarray, returns: np.ndarray, random_return: float) -> tuple:
    """The three criteria by whole-array NumPy: first above, longest phase below after it, and the booleans."""
    above = returns > random_return
    if not above.any():
        return None, 0, False, bool(returns[-1] - random_return >= 2 * abs(random_return)
                                    and returns[-1] > random_return), True
    first = int(np.argmax(above))
    tail_steps, tail_above = steps[first:], above[first:]
    starts = np.flatnonzero(~tail_above & np.concatenate([[True], tail_above[:-1]]))
    next_above = [np.flatnonzero(tail_above[start:]) for start in starts]
    ends = [tail_steps[start + later[0]] if later.size else tail_steps[-1] for start, later in zip(starts, next_above)]
    longest = int(max((end - tail_steps[start] for start, end in zip(starts, ends)), default=0))
    final_ok = bool(returns[-1] - random_return >= 2 * abs(random_return) and returns[-1] > random_return)
    return int(steps[first]), longest, bool(steps[first] <= 1_000_000), final_ok, longest <= 2_000_000


@given(gaps=st.lists(st.integers(1, 1_500_000), min_size=1, max_size=40),
       returns=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0, 6.0]), min_size=40, max_size=40),
       random_return=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]))
def test_grid_criteria_match_a_numpy_reference(gaps, returns, random_return) -> None:
    steps = np.cumsum(gaps)
    values = np.asarray(returns[:len(steps)])
    curve = [criteria.CurvePoint(agent_steps=int(s), return_mean=float(r)) for s, r in zip(steps, values)]
    result = criteria.evaluate_curve(curve, random_return=random_return)
    got = (result.first_above_agent_steps, result.longest_below_agent_steps, result.above_random_by_1m,
           result.final_at_least_3x_random, result.no_long_phase_below_random)
    assert got == reference_criteria(steps, values, random_return)
