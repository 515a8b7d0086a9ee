"""trainer.autocast: bf16 losses and a bf16 PPO update against float32 ones, and the config's checks."""

from __future__ import annotations

import copy

import pytest
import torch

from configs.loader import ConfigError, load_config
from configs.plan import make_plan
from configs.schema import ModelSection
from learner.ppo import algorithm as ppo_algorithm
from learner.ppo.autocast import autocast_context
from learner.ppo.losses import Minibatch, minibatch_losses
from learner.ppo.update import ppo_update
from learner.ppo.algorithm import make_optimizer
from learner.ppo.schedules import UpdateSchedule
from policies.factory import make_policy
from tests.test_ppo import HORIZON, ROWS, SPEC, make_case, make_trainer

BF16_RTOL = 2e-2
"""bfloat16 keeps 8 significant bits (about 3 decimal digits): losses agree with float32 to 2%."""
BF16_ATOL = 2e-3
"""For terms near 0 (approx_kl, kl_loss), where a relative bound says nothing."""
CPU = torch.device("cpu")


def random_minibatch(seed: int) -> tuple[torch.nn.Module, Minibatch]:
    """A 64-wide policy and a minibatch of random rows, with a behaviour policy a little off the current one."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = make_policy(SPEC, ModelSection(hidden_size=64, num_layers=2))
    obs = torch.randn(ROWS, HORIZON, *SPEC.obs_shape, generator=gen)
    actions = torch.randint(0, 2, (ROWS, HORIZON), generator=gen)
    dones = (torch.rand(ROWS, HORIZON, generator=gen) < 0.2).float()
    with torch.no_grad():
        params, _ = policy.forward_rows(obs, dones, torch.zeros(ROWS, 0))
        current = policy.distribution.log_prob(params, None, actions)
    advantages = torch.randn(ROWS, HORIZON, generator=gen)
    old_values = torch.randn(ROWS, HORIZON, generator=gen)
    return policy, Minibatch(obs=obs, actions=actions, action_masks=torch.zeros(ROWS, HORIZON, 0, dtype=torch.uint8),
                             dones=dones, states=torch.zeros(ROWS, 0),
                             old_logprobs=current + 0.2 * torch.randn(ROWS, HORIZON, generator=gen),
                             old_values=old_values, advantages=advantages, returns=advantages + old_values,
                             is_weights=torch.rand(ROWS, generator=gen) + 0.5)


def test_autocast_context_casts_matmuls_only_under_bf16():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast_context(CPU, "none"):
        assert (a @ b).dtype == torch.float32
    with autocast_context(CPU, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="allowed: none, bf16"):
        autocast_context(CPU, "fp16")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_reference", [False, True])
def test_bf16_minibatch_losses_match_float32(seed, with_reference):
    policy, mb = random_minibatch(seed)
    reference = copy.deepcopy(policy) if with_reference else None
    if reference is not None:
        with torch.no_grad():
            for p in reference.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 100)))
    coefs = torch.tensor([0.2, 0.2, 0.01, 0.5, 0.1 if with_reference else 0.0])
    kwargs = dict(norm_adv=True, clip_vloss=True, vf_warmup=False)
    full = minibatch_losses(policy, reference, mb, coefs, **kwargs)
    with autocast_context(CPU, "bf16"):
        half = minibatch_losses(policy, reference, mb, coefs, **kwargs)
    assert half["loss"] != full["loss"]  # the forward passes did run in bfloat16
    for key in ("loss", "policy_loss", "value_loss", "entropy", "kl_loss", "approx_kl"):
        assert float(half[key].detach()) == pytest.approx(float(full[key].detach()), rel=BF16_RTOL, abs=BF16_ATOL), key
    # a ratio within rounding of 1 +- clip_coef may land on the other side of it: a few of the 32 steps
    assert abs(float(half["clipfrac"]) - float(full["clipfrac"])) <= 3 / (ROWS * HORIZON)

    grads = []
    for out in (full, half):
        policy.zero_grad()
        out["loss"].float().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert torch.linalg.vector_norm(grads[1] - grads[0]) <= 5 * BF16_RTOL * torch.linalg.vector_norm(grads[0])


def run_update(autocast: str, seed: int) -> tuple[dict[str, float], torch.Tensor]:
    """One update of 4 Adam steps; its metrics and how far it moved the weights (all of them, flattened)."""
    trainer = make_trainer(minibatch_size=ROWS * HORIZON // 2, update_epochs=2, autocast=autocast)
    policy, batch, _ = make_case(seed, 0.25)
    before = torch.cat([p.detach().flatten() for p in policy.parameters()])
    optimizer = make_optimizer(policy, trainer)
    schedule = UpdateSchedule(learning_rate=1e-3, ent_coef=trainer.ent_coef, clip_coef=trainer.clip_coef,
                              anneal_beta=0.6, kl_coef=0.0, vf_warmup=False)
    metrics = ppo_update(policy, optimizer, batch, trainer=trainer, plan=make_plan(trainer, num_agents=1),
                         schedule=schedule, generator=torch.Generator().manual_seed(seed),
                         autocast=trainer.autocast)
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    return metrics, torch.cat([p.detach().flatten() for p in policy.parameters()]) - before


@pytest.mark.parametrize("seed", [0, 4])
def test_bf16_update_metrics_match_float32(seed):
    full, full_moved = run_update("none", seed)
    half, half_moved = run_update("bf16", seed)
    assert half["total_loss"] != full["total_loss"]
    for key in ("total_loss", "policy_loss", "value_loss", "entropy", "advantage_mean", "ratio_mean",
                "explained_variance", "grad_norm", "is_weight_mean"):
        assert half[key] == pytest.approx(full[key], rel=BF16_RTOL, abs=BF16_ATOL), key
    assert half["approx_kl"] == pytest.approx(full["approx_kl"], abs=BF16_ATOL)
    assert (half["gradient_steps"], half["skipped_steps"]) == (full["gradient_steps"], full["skipped_steps"]) == (4, 0)
    # the steps go the same way: Adam's first steps move each weight by about lr * sign(gradient)
    assert torch.nn.functional.cosine_similarity(half_moved, full_moved, dim=0) > 0.99


def test_ppo_passes_the_configured_autocast(monkeypatch):
    seen = []
    monkeypatch.setattr(ppo_algorithm, "ppo_update", lambda *args, **kwargs: seen.append(kwargs["autocast"]) or {})
    monkeypatch.setattr(ppo_algorithm, "batch_frozen_fraction", lambda *args: None)
    trainer = make_trainer(autocast="bf16")
    algorithm = ppo_algorithm.PPO(spec=SPEC, model=ModelSection(hidden_size=8, num_layers=1), trainer=trainer,
                                  plan=make_plan(trainer, num_agents=1), device=CPU, minibatch_seed=0)
    _, batch, _ = make_case(0, 0.25)
    algorithm.update(batch, update_index=0)
    assert seen == ["bf16"]


def test_config_autocast_defaults_and_typo():
    assert load_config(None, []).trainer.autocast == "none"
    assert load_config(None, ["trainer.autocast=bf16"]).trainer.autocast == "bf16"
    with pytest.raises(ConfigError) as info:
        load_config(None, ["trainer.autocast=fp16"])
    assert "trainer.autocast: 'fp16' is not allowed; allowed: none, bf16" in str(info.value)


def test_config_rejects_bf16_with_coma():
    coma = ["trainer.algorithm=coma", "trainer.batch_size=2000"]
    assert load_config(None, coma).trainer.autocast == "none"
    with pytest.raises(ConfigError) as info:
        load_config(None, [*coma, "trainer.autocast=bf16"])
    message = str(info.value)
    assert "trainer.autocast 'bf16'" in message and "trainer.algorithm coma" in message and "must be none" in message
