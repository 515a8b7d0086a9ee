"""seeds/003 additions to the update: KL to a reference policy, value warm-up, zero-initialised value head,
gradient accumulation, AdamW; plus the update's metrics and its handling of degenerate inputs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from configs.plan import make_plan
from configs.schema import ModelSection
from learner.ppo.advantage import compute_advantages
from learner.update.batch import RowBatch
from learner.ppo.losses import Minibatch, minibatch_losses
from learner.ppo.update import current_logprobs, ppo_update, sampling_probs
from learner.ppo.algorithm import make_optimizer, make_reference, zero_value_head
from learner.ppo.schedules import UpdateSchedule
from policies.factory import make_policy
from tests.test_ppo import HORIZON, ROWS, SPEC, log_softmax, make_case, make_trainer, reference_metrics


def schedule(trainer, *, lr=0.0, beta=0.6, kl_coef=0.0, vf_warmup=False) -> UpdateSchedule:
    return UpdateSchedule(learning_rate=lr, ent_coef=trainer.ent_coef, clip_coef=trainer.clip_coef,
                          anneal_beta=beta, kl_coef=kl_coef, vf_warmup=vf_warmup)


def perturbed_copy(policy, seed: int, scale: float = 0.5):
    other = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


def update(policy, batch, trainer, sched, *, reference=None, optimizer=None, seed=0):
    optimizer = optimizer or torch.optim.Adam(policy.parameters(), lr=1e-3)
    return ppo_update(policy, optimizer, batch, trainer=trainer, plan=make_plan(trainer, num_agents=1),
                      schedule=sched, generator=torch.Generator().manual_seed(seed), reference=reference)


def numpy_kl(policy, reference, obs) -> float:
    with torch.no_grad():
        logp = log_softmax(policy(torch.from_numpy(obs))[0].numpy().astype(np.float64))
        ref = log_softmax(reference(torch.from_numpy(obs))[0].numpy().astype(np.float64))
    return float((np.exp(logp) * (logp - ref)).sum(-1).mean())


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_total_loss_with_entropy_and_kl_matches_reference(kl_coef):
    trainer = make_trainer(ent_coef=0.05, vf_coef=0.7)
    policy, batch, data = make_case(4, 0.25)
    reference = perturbed_copy(policy, seed=1)
    metrics = update(policy, batch, trainer, schedule(trainer, kl_coef=kl_coef), reference=reference)
    expected = reference_metrics(policy, data, trainer, 0.6)
    kl = numpy_kl(policy, reference, data["obs"][:, :HORIZON]) if kl_coef else 0.0
    assert kl_coef == 0.0 or kl > 0.01  # the case really has a KL to penalise
    assert metrics["kl_loss"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
    total = (expected["policy_loss"] + 0.7 * expected["value_loss"] - 0.05 * expected["entropy"] + kl_coef * kl)
    assert metrics["total_loss"] == pytest.approx(total, rel=1e-4)
    assert metrics["kl_coef"] == kl_coef


def test_kl_of_the_policy_to_itself_is_zero():
    trainer = make_trainer()
    policy, batch, _ = make_case(1, 0.1)
    metrics = update(policy, batch, trainer, schedule(trainer, kl_coef=1.0), reference=make_reference(policy))
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=1e-7)


def test_vf_warmup_optimises_only_the_value_loss():
    trainer = make_trainer(ent_coef=0.05)
    policy, batch, data = make_case(6, 0.25)
    expected = reference_metrics(policy, data, trainer, 0.6)
    actor = {k: v.clone() for k, v in policy.state_dict().items() if not k.startswith("critic")}
    critic = {k: v.clone() for k, v in policy.state_dict().items() if k.startswith("critic")}
    metrics = update(policy, batch, trainer, schedule(trainer, lr=1e-2, vf_warmup=True))
    assert metrics["total_loss"] == pytest.approx(0.5 * expected["value_loss"], rel=1e-4)
    state = policy.state_dict()
    for k, v in actor.items():  # separate torsos: the policy cannot move during the warm-up
        assert torch.equal(state[k], v), k
    assert any(not torch.equal(state[k], v) for k, v in critic.items())
    assert metrics["vf_warmup"] == 1.0

    policy, batch, _ = make_case(6, 0.25)  # without the warm-up the policy moves
    update(policy, batch, trainer, schedule(trainer, lr=1e-2))
    assert not torch.equal(policy.state_dict()["actor.linear.weight"], actor["actor.linear.weight"])


def test_zero_initial_vf_gives_zero_values():
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=2))
    zero_value_head(policy)
    _, values = policy(torch.randn(5, 3, 4))
    assert torch.equal(values, torch.zeros(5, 3))


@pytest.mark.parametrize("kind, cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_optimizer_choice_and_weight_decay(kind, cls):
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=1))
    optimizer = make_optimizer(policy, make_trainer(optimizer=kind, weight_decay=0.01, adam_eps=1e-5))
    assert type(optimizer) is cls
    assert optimizer.param_groups[0]["weight_decay"] == 0.01 and optimizer.param_groups[0]["eps"] == 1e-5


def test_gradient_accumulation_averages_minibatch_gradients():
    """Two minibatches, one optimizer step: the step follows the mean of their gradients (plain SGD)."""
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 2, gradient_accumulation=2, max_grad_norm=1e9)
    policy, batch, _ = make_case(8, 0.25)
    twin = copy.deepcopy(policy)
    lr, seed = 0.1, 11
    metrics = update(policy, batch, trainer, schedule(trainer, lr=lr),
                     optimizer=torch.optim.SGD(policy.parameters(), lr=lr), seed=seed)
    assert metrics["gradient_steps"] == 1.0

    # the same update by hand
    obs, actions = batch.obs[:, :HORIZON], batch.actions[:, :HORIZON]
    dones = batch.dones[:, :HORIZON]
    masks = batch.action_masks[:, :HORIZON]
    ratios = torch.exp(current_logprobs(twin, obs, actions, masks, dones, batch.states)
                       - batch.logprobs[:, :HORIZON])
    adv = compute_advantages(batch.values, batch.rewards + trainer.gamma * batch.bootstrap, batch.dones, ratios,
                             gamma=trainer.gamma, gae_lambda=trainer.gae_lambda)
    probs = sampling_probs(adv, 0.0)
    gen = torch.Generator().manual_seed(seed)
    coefs = torch.tensor([trainer.clip_coef, trainer.vf_clip_coef, trainer.ent_coef, trainer.vf_coef, 0.0])
    total = 0.0
    for _ in range(2):
        idx = torch.multinomial(probs, ROWS // 2, replacement=False, generator=gen)
        mb = Minibatch(obs=obs[idx], actions=actions[idx], action_masks=masks[idx], dones=dones[idx],
                       states=batch.states[idx],
                       old_logprobs=batch.logprobs[idx, :HORIZON], old_values=batch.values[idx, :HORIZON],
                       advantages=adv[idx], returns=(adv + batch.values[:, :HORIZON])[idx],
                       is_weights=torch.ones(ROWS // 2))
        total = total + minibatch_losses(twin, None, mb, coefs, norm_adv=True, clip_vloss=True,
                                         vf_warmup=False)["loss"]
    (total / 2).backward()
    with torch.no_grad():
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(policy.state_dict()[name].numpy(), (p - lr * p.grad).numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=name)


def test_without_accumulation_every_minibatch_steps():
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 4, update_epochs=3)
    policy, batch, _ = make_case(2, 0.25)
    assert update(policy, batch, trainer, schedule(trainer, lr=1e-3))["gradient_steps"] == 12.0


def test_metrics_of_an_update():
    trainer = make_trainer(prio_alpha=0.6)
    policy, batch, _ = make_case(3, 0.25)
    metrics = update(policy, batch, trainer, schedule(trainer, lr=1e-3, beta=0.7))
    for key in ("policy_loss", "value_loss", "entropy", "kl_loss", "total_loss", "approx_kl", "clipfrac",
                "explained_variance", "grad_norm", "learning_rate", "ent_coef", "clip_coef", "anneal_beta",
                "kl_coef", "vf_warmup", "is_weight_mean", "is_weight_min", "is_weight_max", "gradient_steps"):
        assert key in metrics and np.isfinite(metrics[key]), key
    assert metrics["is_weight_min"] <= metrics["is_weight_mean"] <= metrics["is_weight_max"]
    assert metrics["is_weight_min"] < metrics["is_weight_max"]  # prioritized: weights differ


def test_all_zero_advantages_sample_uniformly():
    for alpha in (0.0, 0.6, 1.0):
        probs = sampling_probs(torch.zeros(6, 4), alpha)
        assert torch.allclose(probs, torch.full((6,), 1 / 6))
        assert torch.allclose((6 * probs) ** -0.8, torch.ones(6))


def test_non_finite_batch_skips_steps_and_keeps_weights():
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 2)
    policy, batch, _ = make_case(5, 0.25)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    rewards = batch.rewards.clone()
    rewards[:, 2] = float("nan")  # every row, so every minibatch, is poisoned
    bad = RowBatch(**{**batch.__dict__, "rewards": rewards})
    metrics = update(policy, bad, trainer, schedule(trainer, lr=1e-2))
    assert (metrics["gradient_steps"], metrics["skipped_steps"]) == (0.0, 2.0)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e9])
def test_max_grad_norm_bounds_the_step(max_grad_norm):
    """Plain SGD with lr 1: the parameter change is the (clipped) gradient, whose global norm is reported."""
    trainer = make_trainer(max_grad_norm=max_grad_norm)
    policy, batch, _ = make_case(9, 0.25)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = update(policy, batch, trainer, schedule(trainer, lr=1.0),
                     optimizer=torch.optim.SGD(policy.parameters(), lr=1.0))
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(policy.parameters(), before)))
    assert metrics["grad_norm"] > 1e-3  # the pre-clip norm
    assert float(moved) == pytest.approx(min(max_grad_norm, metrics["grad_norm"]), rel=1e-4)
