"""PPO pieces (sampling, beta/lr schedules, explained variance) and the losses of one update, against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from envs.base import EnvSpec
from envs.spaces import ActionSpace
from configs.plan import make_plan
from configs.schema import ModelSection, TrainerSection
from learner.update.batch import TEAM_FIELDS, RowBatch
from learner.ppo.update import explained_variance, ppo_update, sampling_probs
from learner.ppo.schedules import UpdateSchedule, anneal_beta, learning_rate
from policies.factory import make_policy

# ---------------------------------------------------------------- sampling, schedules, explained variance


def test_sampling_probs_alpha_zero_is_exactly_uniform():
    adv = torch.randn(7, 5)
    probs = sampling_probs(adv, 0.0)
    assert probs.shape == (7,)
    assert torch.equal(probs, torch.full((7,), 1.0 / 7))
    assert torch.equal(sampling_probs(torch.zeros(8, 3), 0.0), torch.full((8,), 0.125))


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_sampling_probs_prioritized(alpha):
    rng = np.random.default_rng(0)
    adv = rng.normal(size=(9, 6)).astype(np.float32)
    weights = np.abs(adv.astype(np.float64)).sum(1) ** alpha
    expected = (weights + 1e-6) / (weights.sum() + 1e-6)
    got = sampling_probs(torch.from_numpy(adv), alpha)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)
    assert abs(float(got.sum()) - 1.0) < 1e-4


@pytest.mark.parametrize("alpha, beta0", [(0.0, 0.6), (0.6, 0.6), (1.0, 0.4), (0.5, 1.0)])
@pytest.mark.parametrize("epoch, total", [(0, 100), (50, 100), (100, 100)])
def test_anneal_beta(alpha, beta0, epoch, total):
    trainer = TrainerSection(prio_alpha=alpha, prio_beta0=beta0)
    expected = beta0 + (1 - beta0) * alpha * epoch / total
    assert anneal_beta(trainer, epoch, total) == pytest.approx(expected, rel=1e-12)


def test_anneal_beta_end_points():
    trainer = TrainerSection(prio_alpha=1.0, prio_beta0=0.6)
    assert anneal_beta(trainer, 0, 10) == pytest.approx(0.6)
    assert anneal_beta(trainer, 10, 10) == pytest.approx(1.0)


@pytest.mark.parametrize("epoch, total", [(0, 1000), (500, 1000), (1000, 1000), (250, 1000)])
def test_cosine_learning_rate(epoch, total):
    initial, minimum = 0.000457, 0.00003
    progress = epoch / total
    expected = minimum + 0.5 * (initial - minimum) * (1 + math.cos(math.pi * progress))
    assert learning_rate("cosine", initial, minimum, epoch, total) == pytest.approx(expected, rel=1e-12)


def test_cosine_learning_rate_end_points_and_constant():
    assert learning_rate("cosine", 0.000457, 0.00003, 0, 100) == pytest.approx(0.000457)
    assert learning_rate("cosine", 0.000457, 0.00003, 50, 100) == pytest.approx((0.000457 + 0.00003) / 2)
    assert learning_rate("cosine", 0.000457, 0.00003, 100, 100) == pytest.approx(0.00003)
    for epoch in (0, 37, 100):
        assert learning_rate("constant", 0.000457, 0.00003, epoch, 100) == 0.000457
    with pytest.raises(ValueError, match="allowed: constant, cosine, linear, logarithmic"):
        learning_rate("exponential", 0.1, 0.0, 0, 10)


def test_explained_variance():
    rng = np.random.default_rng(1)
    target = rng.normal(size=(6, 4))
    predicted = target + 0.3 * rng.normal(size=(6, 4))
    expected = 1 - np.var(target - predicted) / np.var(target)
    got = explained_variance(torch.from_numpy(predicted), torch.from_numpy(target))
    assert got == pytest.approx(expected, rel=1e-9)
    assert explained_variance(torch.from_numpy(target), torch.from_numpy(target)) == pytest.approx(1.0)
    assert math.isnan(explained_variance(torch.zeros(3, 2), torch.ones(3, 2)))


# ---------------------------------------------------------------- one update against NumPy

ROWS, HORIZON, OBS = 8, 4, 4
SPEC = EnvSpec(num_agents=1, obs_shape=(OBS,), obs_dtype="float32", action=ActionSpace.discrete(2))


def make_trainer(**kw) -> TrainerSection:
    base = dict(batch_size=ROWS * HORIZON, minibatch_size=ROWS * HORIZON, bptt_horizon=HORIZON, num_workers=1,
                forward_pass_minibatch_target_size=1, update_epochs=1, gamma=0.99, gae_lambda=0.95,
                clip_coef=0.1, vf_clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)
    base.update(kw)
    return TrainerSection(**base)


def reference_gae(values, rewards, dones, ratios, gamma, lam, rho_clip, c_clip):
    rows, horizon = ratios.shape
    out = np.zeros((rows, horizon))
    for s in range(rows):
        last = 0.0
        for t in reversed(range(horizon)):
            notdone = 1.0 - dones[s, t + 1]
            delta = min(rho_clip, ratios[s, t]) * (rewards[s, t + 1] + gamma * values[s, t + 1] * notdone
                                                   - values[s, t])
            last = delta + gamma * lam * min(c_clip, ratios[s, t]) * last * notdone
            out[s, t] = last
    return out


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def make_case(seed: int, logp_noise: float):
    torch.manual_seed(seed)
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=1))
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(ROWS, HORIZON + 1, OBS)).astype(np.float32)
    actions = rng.integers(0, 2, size=(ROWS, HORIZON + 1))
    with torch.no_grad():
        logits, _ = policy(torch.from_numpy(obs))
    logp_all = log_softmax(logits.numpy().astype(np.float64))
    current = np.take_along_axis(logp_all, actions[..., None], -1)[..., 0]
    behaviour = (current + logp_noise * rng.normal(size=current.shape)).astype(np.float32)
    dones = (rng.random((ROWS, HORIZON + 1)) < 0.2).astype(np.float32)
    bootstrap = np.where(rng.random((ROWS, HORIZON + 1)) < 0.5, rng.normal(size=dones.shape), 0.0) * dones
    data = dict(obs=obs, actions=actions, logprobs=behaviour,
                values=rng.normal(size=(ROWS, HORIZON + 1)).astype(np.float32),
                rewards=rng.normal(size=(ROWS, HORIZON + 1)).astype(np.float32),
                dones=dones, bootstrap=bootstrap.astype(np.float32))
    batch = RowBatch(obs=torch.from_numpy(obs), actions=torch.from_numpy(actions).long(),
                     action_masks=torch.zeros((ROWS, HORIZON + 1, 0), dtype=torch.uint8),
                     states=torch.zeros((ROWS, 0)), versions=torch.zeros(ROWS, dtype=torch.int64),
                     **{k: torch.from_numpy(data[k]) for k in ("logprobs", "values", "rewards", "dones", "bootstrap")},
                     **{name: torch.zeros((ROWS, HORIZON + 1, 0)) for name in TEAM_FIELDS})  # width 0: per-agent rows
    return policy, batch, data


def reference_metrics(policy, data, trainer: TrainerSection, beta: float) -> dict[str, float]:
    """The seed's losses for one minibatch holding every row, in float64 NumPy."""
    d = {k: np.asarray(v, dtype=np.float64) for k, v in data.items()}
    obs = data["obs"][:, :HORIZON]
    actions = data["actions"][:, :HORIZON]
    with torch.no_grad():
        logits, newvalue = policy(torch.from_numpy(obs))
    logp_all = log_softmax(logits.numpy().astype(np.float64))
    newvalue = newvalue.numpy().astype(np.float64)
    newlogp = np.take_along_axis(logp_all, actions[..., None], -1)[..., 0]
    entropy = -(np.exp(logp_all) * logp_all).sum(-1)
    old_logp = d["logprobs"][:, :HORIZON]
    old_values = d["values"][:, :HORIZON]

    ratios = np.exp(newlogp - old_logp)  # the policy is unchanged: pi_current == the minibatch policy
    rewards = d["rewards"] + trainer.gamma * d["bootstrap"]
    adv = reference_gae(d["values"], rewards, d["dones"], ratios, trainer.gamma, trainer.gae_lambda,
                        trainer.vtrace_rho_clip, trainer.vtrace_c_clip)
    returns = adv + old_values

    if trainer.prio_alpha == 0.0:
        probs = np.full(ROWS, 1.0 / ROWS)
    else:
        w = np.abs(adv).sum(1) ** trainer.prio_alpha
        probs = (w + 1e-6) / (w.sum() + 1e-6)
    is_weights = (ROWS * probs) ** (-beta)

    mb_adv = adv
    if trainer.norm_adv:
        mb_adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    mb_adv = is_weights[:, None] * mb_adv
    c = trainer.clip_coef
    pg = np.maximum(-mb_adv * ratios, -mb_adv * np.clip(ratios, 1 - c, 1 + c)).mean()
    if trainer.clip_vloss:
        v_clipped = old_values + np.clip(newvalue - old_values, -trainer.vf_clip_coef, trainer.vf_clip_coef)
        v_loss = np.maximum((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = ((newvalue - returns) ** 2).mean()
    return {
        "policy_loss": pg, "value_loss": v_loss, "entropy": entropy.mean(),
        "approx_kl": ((ratios - 1) - np.log(ratios)).mean(),
        "clipfrac": (np.abs(ratios - 1) > c).mean(),
        "is_weight_mean": is_weights.mean(),
        "advantage_mean": adv.mean(), "ratio_mean": ratios.mean(),
        "explained_variance": 1 - np.var(returns - old_values) / np.var(returns),
        "_ratios": ratios,
    }


def run_update(trainer: TrainerSection, *, seed=0, logp_noise=0.25, beta=0.6):
    policy, batch, data = make_case(seed, logp_noise)
    plan = make_plan(trainer, num_agents=1)
    assert (plan.segments, plan.minibatch_segments, plan.num_minibatches) == (ROWS, ROWS, 1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3, eps=1e-8)
    metrics = ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan,
                         schedule=UpdateSchedule(learning_rate=0.0, ent_coef=trainer.ent_coef,
                                                 clip_coef=trainer.clip_coef, anneal_beta=beta, kl_coef=0.0,
                                                 vf_warmup=False),
                         generator=torch.Generator().manual_seed(seed))
    for k, v in policy.state_dict().items():  # lr 0: the weights did not move
        assert torch.equal(v, before[k]), k
    return metrics, reference_metrics(policy, data, trainer, beta)


LOSS_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "is_weight_mean", "advantage_mean",
             "ratio_mean", "explained_variance")


def assert_metrics(metrics, expected):
    for key in LOSS_KEYS:
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-5), key
    assert metrics["gradient_steps"] == 1.0 and metrics["skipped_steps"] == 0.0
    assert metrics["learning_rate"] == 0.0


@pytest.mark.parametrize("clip_vloss", [True, False])
@pytest.mark.parametrize("norm_adv", [True, False])
def test_update_losses_match_reference(clip_vloss, norm_adv):
    metrics, expected = run_update(make_trainer(clip_vloss=clip_vloss, norm_adv=norm_adv))
    ratios = expected["_ratios"]
    # the case exercises the clip: some ratios leave [0.9, 1.1], some stay inside
    assert 0 < expected["clipfrac"] < 1 and (ratios < 0.9).any() and (ratios > 1.1).any()
    assert_metrics(metrics, expected)
    assert metrics["is_weight_mean"] == pytest.approx(1.0)


def test_clip_vloss_changes_value_loss():
    on, exp_on = run_update(make_trainer(clip_vloss=True))
    off, exp_off = run_update(make_trainer(clip_vloss=False))
    assert exp_on["value_loss"] > exp_off["value_loss"]  # max over two squares
    assert on["value_loss"] == pytest.approx(exp_on["value_loss"], rel=1e-4)
    assert off["value_loss"] == pytest.approx(exp_off["value_loss"], rel=1e-4)


@pytest.mark.parametrize("rho_clip, c_clip", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.8)])
def test_update_vtrace_clips(rho_clip, c_clip):
    trainer = make_trainer(vtrace_rho_clip=rho_clip, vtrace_c_clip=c_clip, gamma=0.977, gae_lambda=0.916)
    metrics, expected = run_update(trainer, seed=3, logp_noise=0.5)
    assert_metrics(metrics, expected)


@pytest.mark.parametrize("alpha, beta", [(0.6, 0.6), (1.0, 0.8)])
def test_update_prioritized_is_weights(alpha, beta):
    metrics, expected = run_update(make_trainer(prio_alpha=alpha), seed=5, beta=beta)
    assert expected["is_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    assert_metrics(metrics, expected)


def test_update_with_zero_noise_has_unit_ratios():
    metrics, expected = run_update(make_trainer(), seed=2, logp_noise=0.0)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["clipfrac"] == 0.0
    assert_metrics(metrics, expected)
