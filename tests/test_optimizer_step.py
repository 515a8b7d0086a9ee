"""Non-finite gradient steps skipped on the device by a fused Adam: weights and Adam state untouched, the skips
counted once per update, the same results as the host-sync fallback; on CUDA, no sync in the minibatch loop."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from configs.plan import make_plan
from configs.schema import ModelSection
from learner.update.batch import RowBatch
from learner.ppo.losses import minibatch_losses
from learner.update.optimizer_step import is_fused, step_unless_nonfinite
from learner.ppo.update import ppo_update
from learner.ppo.algorithm import make_optimizer
from learner.ppo.schedules import UpdateSchedule
from policies.factory import make_policy
from tests.test_ppo import HORIZON, ROWS, SPEC, make_case, make_trainer


def schedule(trainer) -> UpdateSchedule:
    return UpdateSchedule(learning_rate=1e-2, ent_coef=trainer.ent_coef, clip_coef=trainer.clip_coef,
                          anneal_beta=0.6, kl_coef=0.0, vf_warmup=False)


def update(policy, optimizer, batch, trainer, *, loss_fn=minibatch_losses, seed=0, device="cpu"):
    return ppo_update(policy, optimizer, batch, trainer=trainer, plan=make_plan(trainer, num_agents=1),
                      schedule=schedule(trainer), generator=torch.Generator(device=device).manual_seed(seed),
                      loss_fn=loss_fn)


def adam_state(optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in optimizer.state[p].items()} for p in optimizer.param_groups[0]["params"]]


def poisoned(batch: RowBatch) -> RowBatch:
    rewards = batch.rewards.clone()
    rewards[:, 2] = float("nan")  # every row, so every minibatch
    return RowBatch(**{**batch.__dict__, "rewards": rewards})


def nan_on_calls(calls: set[int]):
    """minibatch_losses whose loss is NaN on the given (0-based) calls."""
    count = [0]

    def loss_fn(*args, **kwargs):
        out = minibatch_losses(*args, **kwargs)
        if count[0] in calls:
            out = {**out, "loss": out["loss"] * float("nan")}
        count[0] += 1
        return out
    return loss_fn


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_make_optimizer_is_fused_on_cpu(kind):
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=1))
    assert is_fused(make_optimizer(policy, make_trainer(optimizer=kind)))
    assert not is_fused(torch.optim.Adam(policy.parameters()))
    assert not is_fused(torch.optim.SGD(policy.parameters(), lr=0.1))


def test_step_unless_nonfinite_skips_on_the_flag():
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = torch.optim.Adam([param], lr=0.1, fused=True)
    param.grad = torch.tensor([0.5, 0.5])
    assert float(step_unless_nonfinite(optimizer, torch.tensor(0.7))) == 0.0
    after_one = param.detach().clone()
    state = {k: v.clone() for k, v in optimizer.state[param].items()}
    assert float(state["step"]) == 1.0
    for bad in (float("nan"), float("inf")):
        param.grad = torch.tensor([bad, 0.5])
        assert float(step_unless_nonfinite(optimizer, torch.tensor(bad))) == 1.0
        assert torch.equal(param.detach(), after_one)
        for key, value in optimizer.state[param].items():
            assert torch.equal(value, state[key]), key
    assert not hasattr(optimizer, "found_inf")


def test_nan_gradient_step_leaves_weights_and_adam_state():
    trainer = make_trainer()  # one minibatch: one optimizer step per update
    policy, batch, _ = make_case(5, 0.25)
    optimizer = make_optimizer(policy, trainer)
    assert is_fused(optimizer)
    first = update(policy, optimizer, batch, trainer)
    assert (first["gradient_steps"], first["skipped_steps"]) == (1.0, 0.0)
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    state = adam_state(optimizer)
    assert all(float(s["step"]) == 1.0 and s["exp_avg"].abs().sum() > 0 for s in state)

    metrics = update(policy, optimizer, poisoned(batch), trainer)
    assert (metrics["gradient_steps"], metrics["skipped_steps"]) == (0.0, 1.0)
    assert metrics["grad_norm"] != metrics["grad_norm"]  # NaN: no step was taken
    for name, value in policy.state_dict().items():
        assert torch.equal(value, weights[name]), name
    for kept, now in zip(state, adam_state(optimizer)):
        assert kept.keys() == now.keys()
        for key in kept:
            assert torch.equal(now[key], kept[key]), key


def test_fused_skips_match_the_sync_fallback():
    """Four steps, the second and fourth NaN: the fused optimizer and a plain Adam (host-sync branch) take the same
    two steps, count the same skips and report the mean norm of the steps taken."""
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 2, update_epochs=2)
    policy, batch, _ = make_case(7, 0.25)
    twin = copy.deepcopy(policy)
    fused = make_optimizer(policy, trainer)
    plain = torch.optim.Adam(twin.parameters(), lr=trainer.learning_rate, eps=trainer.adam_eps)
    got = update(policy, fused, batch, trainer, loss_fn=nan_on_calls({1, 3}))
    expected = update(twin, plain, batch, trainer, loss_fn=nan_on_calls({1, 3}))
    assert (got["gradient_steps"], got["skipped_steps"]) == (expected["gradient_steps"], expected["skipped_steps"])
    assert (got["gradient_steps"], got["skipped_steps"]) == (2.0, 2.0)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert all(float(fused.state[p]["step"]) == 2.0 for p in policy.parameters())
    for (name, value), other in zip(policy.state_dict().items(), twin.state_dict().values()):
        assert torch.allclose(value, other, rtol=1e-5, atol=1e-7), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_minibatch_loop_does_not_sync():
    """With target_kl off, nothing between the first loss and the last optimizer step waits for the GPU."""
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 4, update_epochs=2, target_kl=None)
    policy, batch, _ = make_case(3, 0.25)
    device = torch.device("cuda")
    policy = policy.to(device)
    batch = RowBatch(**{name: tensor.to(device) for name, tensor in batch.__dict__.items()})
    optimizer = make_optimizer(policy, trainer)
    assert is_fused(optimizer)
    marks: dict[str, int] = {}
    step = optimizer.step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def loss_fn(*args, **kwargs):
            marks.setdefault("first_loss", len(caught))
            return minibatch_losses(*args, **kwargs)

        def counted_step(*args, **kwargs):
            out = step(*args, **kwargs)
            marks["last_step"] = len(caught)
            return out

        optimizer.step = counted_step
        torch.cuda.set_sync_debug_mode("warn")
        try:
            metrics = update(policy, optimizer, batch, trainer, loss_fn=loss_fn, device="cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert metrics["gradient_steps"] == 8.0
    syncs = [str(w.message) for w in caught[marks["first_loss"]:marks["last_step"]]
             if "synchroniz" in str(w.message)]
    assert syncs == []
