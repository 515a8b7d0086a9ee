"""The update's non-finite guard drops poisoned ROWS, not the update: rows whose log-ratio, advantages or returns
would make a gradient step non-finite are never sampled, the remaining minibatches take their optimizer steps, and
the dropped rows are counted as ``rows_dropped_nonfinite``."""

from __future__ import annotations

import math

import pytest
import torch

from learner.update.batch import RowBatch
from learner.ppo.losses import minibatch_losses
from learner.ppo.update import LOG_RATIO_LIMIT, usable_rows
from learner.ppo.algorithm import make_optimizer
from learner.serve.row_checks import LOG_FLOAT32_TINY
from tests.test_optimizer_step import update
from tests.test_ppo import HORIZON, ROWS, make_case, make_trainer

POISONED_ROWS = (1, 6)


def with_values(batch: RowBatch, name: str, row: int, step: int, value: float) -> RowBatch:
    tensor = getattr(batch, name).clone()
    tensor[row, step] = value
    return RowBatch(**{**batch.__dict__, name: tensor})


def finite_losses():
    """minibatch_losses that records whether each minibatch's loss was finite."""
    seen: list[bool] = []

    def loss_fn(*args, **kwargs):
        out = minibatch_losses(*args, **kwargs)
        seen.append(bool(torch.isfinite(out["loss"])))
        return out
    return loss_fn, seen


POISONS = {
    "logprob_minus_1e6": ("logprobs", -1e6),
    "logprob_above_the_ingest_floor": ("logprobs", LOG_FLOAT32_TINY + 1.0),  # legal on the wire, ratio ~e^86
    "reward_nan": ("rewards", math.nan),
    "value_inf": ("values", math.inf),
    "obs_nan": ("obs", math.nan),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_few_poisoned_rows_are_dropped_and_every_step_is_taken(poison):
    name, value = POISONS[poison]
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 4, update_epochs=2)  # 4 minibatches of 2 rows
    policy, batch, _ = make_case(11, 0.25)
    for row in POISONED_ROWS:
        batch = with_values(batch, name, row, 1, value)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    loss_fn, seen = finite_losses()
    metrics = update(policy, make_optimizer(policy, trainer), batch, trainer, loss_fn=loss_fn)
    assert metrics["rows_dropped_nonfinite"] == len(POISONED_ROWS)
    assert (metrics["gradient_steps"], metrics["skipped_steps"]) == (8.0, 0.0)
    assert all(seen) and len(seen) == 8  # no minibatch held a poisoned row
    for key in ("total_loss", "ratio_mean", "advantage_mean", "explained_variance", "grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert any(not torch.equal(v, before[k]) for k, v in policy.state_dict().items())


def test_a_clean_batch_drops_nothing():
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 4)
    policy, batch, _ = make_case(11, 0.25)
    metrics = update(policy, make_optimizer(policy, trainer), batch, trainer)
    assert metrics["rows_dropped_nonfinite"] == 0.0 and metrics["skipped_steps"] == 0.0


def test_too_few_usable_rows_for_a_minibatch_fall_back_to_skipping_those_steps():
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 4)  # 2 rows per minibatch; only 1 row stays usable
    policy, batch, _ = make_case(11, 0.25)
    for row in range(ROWS - 1):
        batch = with_values(batch, "rewards", row, 2, math.nan)
    metrics = update(policy, make_optimizer(policy, trainer), batch, trainer)
    assert metrics["rows_dropped_nonfinite"] == ROWS - 1
    assert metrics["gradient_steps"] + metrics["skipped_steps"] == 4 and metrics["skipped_steps"] >= 3


def test_usable_rows_bounds_the_log_ratio():
    finite = torch.zeros(3, 2)
    logratios = torch.tensor([[0.0, LOG_RATIO_LIMIT], [LOG_RATIO_LIMIT + 0.5, 0.0], [-1e6, math.nan]])
    assert usable_rows(logratios, finite, finite).tolist() == [True, False, False]
    returns = torch.tensor([[0.0, 0.0], [0.0, 0.0], [math.inf, 0.0]])
    assert usable_rows(torch.zeros(3, 2), finite, returns).tolist() == [True, True, False]
