"""Merging running statistics over learner ranks (policies/running_stats.py): ``merged_moments`` and
``RunningMeanStd.update(values, gather=...)`` against NumPy on the concatenated samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.running_stats import RunningMeanStd, merged_moments

VALUE = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False)
SHAPE = st.sampled_from([(), (3,)])


@st.composite
def sample_sets(draw: st.DrawFn) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """A shape and K in 1..4 sample sets of 0..20 samples each, at least one of them non-empty."""
    shape = draw(SHAPE)
    sizes = draw(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=4).filter(any))
    width = int(np.prod(shape))
    sets = [np.array(draw(st.lists(VALUE, min_size=size * width, max_size=size * width)),
                     dtype=np.float64).reshape(size, *shape) for size in sizes]
    return shape, sets


def _moments(samples: np.ndarray, shape: tuple[int, ...]) -> tuple[float, np.ndarray, np.ndarray]:
    """count, mean, population variance (zeros for no samples), by NumPy."""
    if len(samples) == 0:
        return 0.0, np.zeros(shape), np.zeros(shape)
    return float(len(samples)), samples.mean(axis=0), samples.var(axis=0)


@settings(max_examples=150, deadline=None)
@given(case=sample_sets(), garbage=VALUE)
def test_merged_moments_equal_numpy_on_the_concatenated_samples(case: tuple[tuple[int, ...], list[np.ndarray]],
                                                                garbage: float) -> None:
    shape, sets = case
    moments = [_moments(samples, shape) for samples in sets]
    # An empty set's mean and variance are meaningless: anything there must add nothing.
    means = [mean if count else np.full(shape, garbage) for count, mean, _ in moments]
    variances = [var if count else np.full(shape, abs(garbage)) for count, _, var in moments]
    total, mean, variance = merged_moments(torch.tensor([count for count, _, _ in moments], dtype=torch.float64),
                                           torch.tensor(np.stack(means)), torch.tensor(np.stack(variances)))
    everything = np.concatenate(sets)
    assert float(total) == len(everything)
    assert tuple(mean.shape) == shape and tuple(variance.shape) == shape
    np.testing.assert_allclose(mean.numpy(), everything.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(variance.numpy(), everything.var(axis=0), rtol=1e-9, atol=1e-9)


def test_merged_moments_of_only_empty_sets_is_zero() -> None:
    total, mean, variance = merged_moments(torch.zeros(2, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64),
                                           torch.ones(2, 3, dtype=torch.float64))
    assert float(total) == 0
    assert torch.equal(mean, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(variance, torch.zeros(3, dtype=torch.float64))


def _fake_gather(rank: int, sets: list[np.ndarray], shape: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Rank ``rank``'s all-gather for one update: update gathers count, mean, variance in that order; each call checks
    this rank's own contribution and returns every rank's, stacked in rank order."""
    per_rank = [_moments(samples, shape) for samples in sets]
    calls = iter(range(3))

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        quantity = next(calls)
        stacked = torch.tensor(np.stack([np.asarray(moments[quantity], dtype=np.float64) for moments in per_rank]))
        torch.testing.assert_close(tensor, stacked[rank:rank + 1], rtol=1e-12, atol=1e-12)
        return stacked

    return gather


@settings(max_examples=60, deadline=None)
@given(case=sample_sets(), prior=st.lists(VALUE, min_size=3, max_size=12))
def test_update_with_gather_equals_one_update_on_all_ranks_samples(case: tuple[tuple[int, ...], list[np.ndarray]],
                                                                    prior: list[float]) -> None:
    shape, sets = case
    width = int(np.prod(shape))
    earlier = np.array(prior[: len(prior) // width * width], dtype=np.float64).reshape(-1, *shape)
    ranks = [RunningMeanStd(shape) for _ in sets]
    single = RunningMeanStd(shape)
    for stats in [*ranks, single]:
        stats.update(torch.tensor(earlier))
    for rank, stats in enumerate(ranks):
        stats.update(torch.tensor(sets[rank]), gather=_fake_gather(rank, sets, shape))
    single.update(torch.tensor(np.concatenate(sets)))
    everything = np.concatenate([earlier, *sets])
    for stats in ranks:
        assert float(stats.count) == float(single.count) == len(everything)
        torch.testing.assert_close(stats.mean, single.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(stats.var, single.var, rtol=0, atol=1e-9)
        np.testing.assert_allclose(stats.mean.numpy(), everything.mean(axis=0), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(stats.var.numpy(), everything.var(axis=0), rtol=1e-9, atol=1e-9)


def test_a_rank_without_samples_takes_the_others_statistics() -> None:
    shape = (3,)
    sets = [np.zeros((0, 3)), np.arange(12, dtype=np.float64).reshape(4, 3), np.full((2, 3), -5.0)]
    ranks = [RunningMeanStd(shape) for _ in sets]
    for rank, stats in enumerate(ranks):
        stats.update(torch.tensor(sets[rank]), gather=_fake_gather(rank, sets, shape))
    everything = np.concatenate(sets)
    for stats in ranks:
        assert float(stats.count) == 6
        np.testing.assert_allclose(stats.mean.numpy(), everything.mean(axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(stats.var.numpy(), everything.var(axis=0), rtol=0, atol=1e-12)


def test_no_rank_with_samples_leaves_the_statistics_unchanged() -> None:
    sets = [np.zeros((0,)), np.zeros((0,))]
    ranks = [RunningMeanStd(()) for _ in sets]
    for rank, stats in enumerate(ranks):
        stats.update(torch.tensor([1.0, 3.0]))
        stats.update(torch.tensor(sets[rank]), gather=_fake_gather(rank, sets, ()))
        assert (float(stats.count), float(stats.mean), float(stats.var)) == (2.0, 2.0, 1.0)


def test_update_refuses_values_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"RunningMeanStd of shape \(3,\) got values of shape \(4, 2\)"):
        RunningMeanStd((3,)).update(torch.zeros(4, 2))
