"""The per-rank batch plan of the data-parallel learner (configs/rank_plan.py): shares and errors with their numbers."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.plan import PlanError, make_plan
from configs.rank_plan import make_rank_plan
from configs.schema import TrainerSection

HORIZON = 4


def trainer(segments: int, minibatch_segments: int, **overrides: object) -> TrainerSection:
    base = dict(batch_size=segments * HORIZON, minibatch_size=minibatch_segments * HORIZON, bptt_horizon=HORIZON,
                num_workers=1, forward_pass_minibatch_target_size=1, async_factor=1)
    base.update(overrides)
    return TrainerSection(**base)


def test_one_rank_is_the_run_plan():
    config = trainer(64, 16)
    plan = make_rank_plan(config, num_agents=1, world_size=1)
    assert plan.run == plan.rank == make_plan(config, num_agents=1)


@settings(max_examples=50, deadline=None)
@given(world_size=st.integers(1, 8), rank_minibatch=st.integers(1, 6), minibatches=st.integers(1, 5))
def test_ranks_share_rows_and_minibatches_evenly(world_size, rank_minibatch, minibatches):
    segments = world_size * rank_minibatch * minibatches
    config = trainer(segments, world_size * rank_minibatch)
    plan = make_rank_plan(config, num_agents=1, world_size=world_size)
    assert plan.run == make_plan(config, num_agents=1)
    assert (plan.rank.segments, plan.rank.minibatch_segments) == (segments // world_size, rank_minibatch)
    assert plan.rank.num_minibatches == plan.run.num_minibatches == minibatches
    unchanged = {"segments", "minibatch_segments"}
    assert {k: v for k, v in plan.rank.as_dict().items() if k not in unchanged} == \
        {k: v for k, v in plan.run.as_dict().items() if k not in unchanged}
    assert plan.as_dict() == {"world_size": world_size, "rank_segments": segments // world_size,
                              "rank_minibatch_segments": rank_minibatch, "num_minibatches": minibatches}
    assert dataclasses.replace(plan.rank, segments=segments, minibatch_segments=rank_minibatch * world_size) \
        == plan.run


def test_segments_not_divisible_by_ranks():
    with pytest.raises(PlanError) as info:
        make_rank_plan(trainer(12, 12), num_agents=1, world_size=8)
    assert ("segments (12) must be divisible by the learner ranks (8) so every rank holds the same share: "
            "remainder 4") in str(info.value)


def test_minibatch_segments_not_divisible_by_ranks():
    with pytest.raises(PlanError) as info:
        make_rank_plan(trainer(12, 3), num_agents=1, world_size=2)
    assert ("minibatch_segments (3) must be divisible by the learner ranks (2) so every rank draws the same "
            "share of a minibatch: remainder 1") in str(info.value)


def test_minibatch_smaller_than_ranks():
    with pytest.raises(PlanError, match=r"minibatch_segments \(2\) must be divisible by the learner ranks \(4\)"):
        make_rank_plan(trainer(8, 2), num_agents=1, world_size=4)


def test_run_plan_errors_come_first():
    with pytest.raises(PlanError, match=r"must be divisible by minibatch_segments \(5 = minibatch_size 20"):
        make_rank_plan(trainer(12, 5), num_agents=1, world_size=1)


@pytest.mark.parametrize("world_size", [0, -2])
def test_world_size_at_least_one(world_size):
    with pytest.raises(PlanError, match=rf"the learner world size \(ranks\) must be >= 1, got {world_size}"):
        make_rank_plan(trainer(8, 8), num_agents=1, world_size=world_size)
