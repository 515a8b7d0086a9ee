"""The per-rank batch plan of the data-parallel learner (configs/rank_plan.py): shares and errors with their numbers."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.plan import PlanError, make_plan
from configs.rank_plan import make_rank_plan
from configs.schema import ComaSection, TrainerSection
from learner.cli import main

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
    assert plan.as_dict() == {"ranks": world_size, "rank_segments": segments // world_size,
                              "rank_batch_size": segments // world_size * HORIZON,
                              "rank_minibatch_segments": rank_minibatch,
                              "rank_minibatch_size": rank_minibatch * HORIZON}
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


def test_coma_gradient_steps_split_over_the_ranks():
    coma_trainer = trainer(6, 3, algorithm="coma")  # PPO's minibatches do not apply: 3 rows need not split over 2
    with pytest.raises(PlanError) as info:
        make_rank_plan(coma_trainer, num_agents=1, world_size=2, coma=ComaSection(batch_size=63))
    assert str(info.value) == ("coma.batch_size (63) must be divisible by the learner ranks (2) so every rank draws "
                               "the same share of a gradient step's transitions: remainder 1; change coma.batch_size "
                               "or the rank count")
    assert make_rank_plan(coma_trainer, num_agents=1, world_size=2, coma=ComaSection(batch_size=64)).rank.segments == 3


# ---------------------------------------------------------------- --plan --ranks K via the CLI

SMALL = ["--config", "cartpole", "--set", "trainer.batch_size=4096", "--set", "trainer.minibatch_size=1024",
         "--set", "trainer.bptt_horizon=16", "--plan"]
"""256 segments of 16 steps, minibatches of 64 segments."""


def plan_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("python -m learner: error: ")
    return captured.err.removeprefix("python -m learner: error: ").strip()


def test_plan_shows_one_ranks_share(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rows = plan_json(capsys, [*SMALL, "--ranks", "4"])
    assert (rows["segments"], rows["minibatch_segments"]) == (256, 64)
    assert {k: rows[k] for k in ("ranks", "rank_segments", "rank_batch_size", "rank_minibatch_segments",
                                 "rank_minibatch_size")} == {"ranks": 4, "rank_segments": 64, "rank_batch_size": 1024,
                                                             "rank_minibatch_segments": 16, "rank_minibatch_size": 256}
    assert main([*SMALL, "--ranks", "4"]) == 0
    table = capsys.readouterr().out
    assert "rank_minibatch_size" in table and "1,024" in table


def test_plan_ranks_default_to_torchrun_world_size(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert "ranks" not in plan_json(capsys, SMALL)  # one process: the run's plan alone
    assert "ranks" not in plan_json(capsys, [*SMALL, "--ranks", "1"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert plan_json(capsys, SMALL)["rank_segments"] == 128
    assert plan_json(capsys, [*SMALL, "--ranks", "8"])["rank_segments"] == 32  # --ranks wins


def test_plan_ranks_errors_with_their_numbers(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli_error(capsys, [*SMALL, "--ranks", "3"]) == (
        "segments (256) must be divisible by the learner ranks (3) so every rank holds the same share: remainder 1; "
        "change trainer.batch_size or the rank count")
    assert cli_error(capsys, [*SMALL, "--set", "trainer.minibatch_size=32", "--ranks", "4"]) == (
        "minibatch_segments (2) must be divisible by the learner ranks (4) so every rank draws the same share of a "
        "minibatch: remainder 2; change trainer.minibatch_size or the rank count")
    assert cli_error(capsys, ["--config", "coma_spread", "--plan", "--ranks", "4", "--set", "coma.batch_size=66"]) == (
        "coma.batch_size (66) must be divisible by the learner ranks (4) so every rank draws the same share of a "
        "gradient step's transitions: remainder 2; change coma.batch_size or the rank count")


def test_coma_plan_shows_one_ranks_share_of_a_gradient_step(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rows = plan_json(capsys, ["--config", "coma_spread", "--plan", "--ranks", "2"])
    assert (rows["rank_segments"], rows["rank_batch_size"], rows["rank_coma_transitions_per_gradient_step"]) == \
        (40, 1000, 32)
    assert not any(key.startswith("rank_minibatch") for key in rows)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ranks", "2"], "--ranks only goes with --plan (a training run takes its ranks from torchrun --nproc-per-node)"),
    (["--plan", "--ranks", "0"], "--ranks must be >= 1, got 0"),
    (["--plan", "--ranks", "-3"], "--ranks must be >= 1, got -3"),
])
def test_ranks_usage_errors(capsys, argv, message):
    assert cli_error(capsys, argv) == message
