"""Action distributions (policies/distributions.py) against independent NumPy formulas on random inputs:
categorical (masked, multi-component) and diagonal Gaussian log-probs, entropies, KLs, and sampling; plus the
PPO minibatch loss with masked multi-discrete and with continuous actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs.base import EnvSpec
from envs.spaces import ActionSpace
from configs.schema import ModelSection
from learner.ppo.losses import Minibatch, minibatch_losses
from policies.distributions import ActionDistribution
from policies.factory import make_policy

NVEC = (4, 2, 3)


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_categorical_parts(logits: np.ndarray, mask: np.ndarray | None) -> list[np.ndarray]:
    """Per-component log-probs in float64; illegal actions get -inf (a component with no legal action: none)."""
    parts, offset = [], 0
    for n in NVEC:
        block = logits[..., offset:offset + n].astype(np.float64)
        if mask is not None:
            legal = mask[..., offset:offset + n].astype(bool)
            legal |= ~legal.any(-1, keepdims=True)
            block = np.where(legal, block, -np.inf)
        parts.append(np_log_softmax(block))
        offset += n
    return parts


def random_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    mask = (rng.random((*shape, sum(NVEC))) < 0.6).astype(np.uint8)
    mask[0, :] = 0  # a row with nothing legal anywhere: left unmasked
    return mask


@pytest.mark.parametrize("masked", [False, True])
def test_multi_discrete_log_prob_entropy_kl_match_numpy(masked: bool) -> None:
    rng = np.random.default_rng(0)
    dist = ActionDistribution(ActionSpace.multi_discrete(NVEC))
    logits = rng.normal(size=(6, 5, sum(NVEC))).astype(np.float32) * 2
    ref = rng.normal(size=logits.shape).astype(np.float32) * 2
    mask = random_mask(rng, (6, 5)) if masked else None
    parts = np_categorical_parts(logits, mask)
    ref_parts = np_categorical_parts(ref, mask)
    # actions: legal ones
    actions = np.stack([np.array([[rng.choice(np.flatnonzero(np.isfinite(p[i, t]))) for t in range(5)]
                                  for i in range(6)]) for p in parts], axis=-1)
    want_logp = sum(np.take_along_axis(p, actions[..., k:k + 1], -1)[..., 0] for k, p in enumerate(parts))
    want_ent = sum(-(np.exp(p) * np.where(np.isfinite(p), p, 0)).sum(-1) for p in parts)
    with np.errstate(invalid="ignore"):  # -inf - -inf at illegal actions, which have probability 0
        want_kl = sum((np.exp(p) * np.where(np.isfinite(p), p - q, 0)).sum(-1) for p, q in zip(parts, ref_parts))
    t_mask = None if mask is None else torch.from_numpy(mask)
    got_logp = dist.log_prob(torch.from_numpy(logits), t_mask, torch.from_numpy(actions))
    np.testing.assert_allclose(got_logp.numpy(), want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dist.entropy(torch.from_numpy(logits), t_mask).numpy(), want_ent, rtol=1e-5, atol=1e-5)
    got_kl = dist.kl(torch.from_numpy(logits), torch.from_numpy(ref), t_mask)
    np.testing.assert_allclose(got_kl.numpy(), want_kl, rtol=1e-4, atol=1e-5)
    assert torch.isfinite(got_kl).all()


def test_discrete_masked_actions_have_zero_probability_and_zero_gradient() -> None:
    dist = ActionDistribution(ActionSpace.discrete(4))
    logits = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.uint8)
    actions, logp = dist.sample(logits, mask, torch.Generator().manual_seed(0))
    assert actions.dtype == torch.int32 and actions.shape == (3,)
    lp_all = torch.stack([dist.log_prob(logits, mask, torch.full((3,), a)) for a in range(4)], -1)
    assert (lp_all[0, [1, 3]].exp() == 0).all() and (lp_all[1, :3].exp() == 0).all()
    assert lp_all[1, 3].item() == pytest.approx(0.0, abs=1e-6)  # the only legal action is certain
    np.testing.assert_allclose(lp_all[2].exp().sum().item(), 1.0, rtol=1e-6)  # nothing legal: unmasked
    dist.entropy(logits, mask).sum().backward()
    assert logits.grad[0, 1] == 0 and logits.grad[1, :3].abs().sum() == 0
    assert torch.isfinite(logits.grad).all()


def test_categorical_sampling_frequencies_follow_the_masked_softmax() -> None:
    dist = ActionDistribution(ActionSpace.multi_discrete((3, 2)))
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.3, -0.3]]).repeat(40000, 1)
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.uint8).repeat(40000, 1)
    actions, logp = dist.sample(logits, mask, torch.Generator().manual_seed(1))
    p0 = np.exp(np_log_softmax(np.array([0.5, -1.0])))
    p1 = np.exp(np_log_softmax(np.array([0.3, -0.3])))
    freq0 = np.bincount(actions[:, 0].numpy(), minlength=3) / 40000
    freq1 = np.bincount(actions[:, 1].numpy(), minlength=2) / 40000
    assert freq0[2] == 0.0
    np.testing.assert_allclose(freq0[:2], p0, atol=0.01)
    np.testing.assert_allclose(freq1, p1, atol=0.01)
    np.testing.assert_allclose(logp.numpy(), dist.log_prob(logits, mask, actions).numpy(), rtol=1e-6)


def test_gaussian_log_prob_entropy_kl_match_numpy() -> None:
    rng = np.random.default_rng(2)
    d = 3
    dist = ActionDistribution(ActionSpace.box([-1.0] * d, [1.0] * d))
    mean, log_std = rng.normal(size=(5, 4, d)), rng.normal(size=(5, 4, d)) * 0.5
    ref_mean, ref_log_std = rng.normal(size=(5, 4, d)), rng.normal(size=(5, 4, d)) * 0.5
    actions = rng.normal(size=(5, 4, d)) * 2  # outside the bounds too: the density is of the unclipped sample
    params = torch.from_numpy(np.concatenate([mean, log_std], -1).astype(np.float32))
    ref = torch.from_numpy(np.concatenate([ref_mean, ref_log_std], -1).astype(np.float32))
    var, ref_var = np.exp(2 * log_std), np.exp(2 * ref_log_std)
    want_logp = (-(actions - mean) ** 2 / (2 * var) - 0.5 * np.log(2 * np.pi * var)).sum(-1)
    want_ent = (0.5 * np.log(2 * np.pi * np.e * var)).sum(-1)
    want_kl = (np.log(np.sqrt(ref_var / var)) + (var + (mean - ref_mean) ** 2) / (2 * ref_var) - 0.5).sum(-1)
    got = dist.log_prob(params, None, torch.from_numpy(actions.astype(np.float32)))
    np.testing.assert_allclose(got.numpy(), want_logp, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dist.entropy(params, None).numpy(), want_ent, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dist.kl(params, ref, None).numpy(), want_kl, rtol=1e-4, atol=1e-4)


def test_gaussian_sampling_moments_and_kl_by_monte_carlo() -> None:
    dist = ActionDistribution(ActionSpace.box([0.0, 0.0], [1.0, 1.0]))
    params = torch.tensor([[0.3, -2.0, np.log(0.5), np.log(2.0)]], dtype=torch.float32).repeat(100000, 1)
    ref = torch.tensor([[0.0, -1.0, 0.0, np.log(1.5)]], dtype=torch.float32).repeat(100000, 1)
    actions, logp = dist.sample(params, None, torch.Generator().manual_seed(3))
    assert actions.dtype == torch.float32 and actions.shape == (100000, 2)
    np.testing.assert_allclose(actions.mean(0).numpy(), [0.3, -2.0], atol=0.02)
    np.testing.assert_allclose(actions.std(0).numpy(), [0.5, 2.0], rtol=0.02)
    mc_kl = (logp - dist.log_prob(ref, None, actions)).mean().item()
    assert mc_kl == pytest.approx(dist.kl(params[:1], ref[:1], None).item(), abs=0.02)


@pytest.mark.parametrize("space, mask_size", [(ActionSpace.multi_discrete(NVEC), sum(NVEC)),
                                              (ActionSpace.box([-2.0, -2.0], [2.0, 2.0]), 0)])
def test_minibatch_loss_with_masks_and_continuous_actions_matches_numpy(space: ActionSpace, mask_size: int) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    spec = EnvSpec(num_agents=1, obs_shape=(3,), obs_dtype="float32", action=space, action_mask=mask_size > 0)
    policy = make_policy(spec, ModelSection(hidden_size=8, num_layers=1))
    M, T = 6, 4
    obs = torch.from_numpy(rng.normal(size=(M, T, 3)).astype(np.float32))
    mask = random_mask(rng, (M, T)) if mask_size else np.zeros((M, T, 0), dtype=np.uint8)
    with torch.no_grad():
        params, values = policy(obs)
    p = params.numpy().astype(np.float64)
    if space.kind == "box":
        actions = rng.normal(size=(M, T, 2)).astype(np.float32)
        mean, log_std = p[..., :2], p[..., 2:]
        logp = (-(actions - mean) ** 2 / (2 * np.exp(2 * log_std)) - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        entropy = (log_std + 0.5 + 0.5 * np.log(2 * np.pi)).sum(-1)
    else:
        parts = np_categorical_parts(p, mask)
        actions = np.stack([np.array([[rng.choice(np.flatnonzero(np.isfinite(q[i, t]))) for t in range(T)]
                                      for i in range(M)]) for q in parts], axis=-1).astype(np.int64)
        logp = sum(np.take_along_axis(q, actions[..., k:k + 1], -1)[..., 0] for k, q in enumerate(parts))
        entropy = sum(-(np.exp(q) * np.where(np.isfinite(q), q, 0)).sum(-1) for q in parts)
    old_logprobs = logp + 0.3 * rng.normal(size=logp.shape)
    advantages = rng.normal(size=(M, T))
    returns = rng.normal(size=(M, T))
    clip = 0.2
    ratio = np.exp(logp - old_logprobs)
    adv = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
    want_pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip)).mean()
    want_v = ((values.numpy() - returns) ** 2).mean()
    mb = Minibatch(obs=obs, actions=torch.from_numpy(actions), action_masks=torch.from_numpy(mask),
                   dones=torch.zeros(M, T), states=torch.zeros(M, 0),
                   old_logprobs=torch.from_numpy(old_logprobs.astype(np.float32)), old_values=values,
                   advantages=torch.from_numpy(advantages.astype(np.float32)),
                   returns=torch.from_numpy(returns.astype(np.float32)), is_weights=torch.ones(M))
    coefs = torch.tensor([clip, 0.2, 0.01, 0.5, 0.0])
    out = minibatch_losses(policy, None, mb, coefs, norm_adv=True, clip_vloss=False, vf_warmup=False)
    assert out["policy_loss"].item() == pytest.approx(want_pg, rel=1e-4, abs=1e-5)
    assert out["value_loss"].item() == pytest.approx(want_v, rel=1e-4)
    assert out["entropy"].item() == pytest.approx(entropy.mean(), rel=1e-4)
    assert out["loss"].item() == pytest.approx(want_pg + 0.5 * want_v - 0.01 * entropy.mean(), rel=1e-4, abs=1e-5)
    out["loss"].backward()
    assert all(torch.isfinite(q.grad).all() for q in policy.parameters() if q.grad is not None)
