"""The PPO stability options (target_kl, norm_value_targets, entropy_floor) against independent NumPy / pure-Python
re-implementations, the value-health warning, and their config errors. Off (the default) is the seeds' update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.loader import ConfigError, load_config
from configs.plan import make_plan
from learner.run.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from learner.ppo.entropy_control import MAX_MULTIPLIER, STEP, next_multiplier
from learner.monitor.health import ValueHealthMonitor
from learner.ppo.losses import minibatch_losses
from learner.ppo.update import ppo_update
from learner.monitor.prometheus_metrics import LearnerMetrics
from learner.ppo.schedules import UpdateSchedule, schedule_for
from learner.ppo.value_normalization import VARIANCE_EPSILON, RunningMeanStd
from telemetry.registry import new_registry
from tests.test_algorithm import assert_same, make_ppo, params, same_number
from tests.test_ppo import HORIZON, ROWS, make_case, make_trainer, reference_gae, reference_metrics

SEEDED = dict(minibatch_size=ROWS * HORIZON // 2, learning_rate=1e-2, total_timesteps=8 * ROWS * HORIZON,
              update_epochs=3, ent_coef_schedule="linear")


def frozen_schedule(trainer, *, beta: float = 0.6) -> UpdateSchedule:
    """The trainer's coefficients with learning rate 0: the policy does not move during the update."""
    return UpdateSchedule(learning_rate=0.0, ent_coef=trainer.ent_coef, clip_coef=trainer.clip_coef,
                          anneal_beta=beta, kl_coef=0.0, vf_warmup=False)


# ---------------------------------------------------------------- off is the seeds' update


def test_options_off_or_never_acting_give_bit_identical_updates():
    """Absent options, explicit off values and options set where they never act: the same metrics and weights."""
    _, batch, _ = make_case(3, logp_noise=0.25)
    runs = [make_ppo(make_trainer(**SEEDED)),
            make_ppo(make_trainer(**SEEDED, target_kl=None, norm_value_targets=False, entropy_floor=None)),
            make_ppo(make_trainer(**SEEDED, target_kl=1e9, entropy_floor=1e-12))]
    for update in range(3):
        results = [ppo.update(batch, update_index=update) for ppo in runs]
        for metrics in results[1:]:
            for key, value in results[0].items():
                assert same_number(metrics[key], value), (update, key)
        for ppo in runs[1:]:
            assert_same(params(ppo.policy), params(runs[0].policy))
            assert_same(ppo.optimizer.state_dict()["state"][0], runs[0].optimizer.state_dict()["state"][0])
    assert results[0]["early_stopped"] == 0.0 and results[0]["minibatch_steps"] == 6.0
    assert results[2]["ent_coef_multiplier"] == 1.0 and "ent_coef_multiplier" not in results[0]


# ---------------------------------------------------------------- target_kl


def recording_loss(kls: list[float]):
    """minibatch_losses that also records each minibatch's approx_kl."""
    def loss_fn(*args, **kwargs):
        out = minibatch_losses(*args, **kwargs)
        kls.append(float(out["approx_kl"]))
        return out
    return loss_fn


def run_recorded(trainer, *, seed: int, logp_noise: float) -> tuple[dict[str, float], list[float]]:
    policy, batch, _ = make_case(seed, logp_noise)
    plan = make_plan(trainer, num_agents=1)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    kls: list[float] = []
    metrics = ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan, schedule=frozen_schedule(trainer),
                         generator=torch.Generator().manual_seed(seed), loss_fn=recording_loss(kls))
    return metrics, kls


def expected_stop(kls: list[float], *, per_epoch: int, accumulation: int, target_kl: float) -> int:
    """Pure Python: the minibatches taken before the running mean KL of an epoch first exceeds target_kl at an
    optimizer step (every ``accumulation`` minibatches)."""
    for index in range(len(kls)):
        in_epoch = index % per_epoch + 1
        if in_epoch % accumulation:
            continue
        epoch = kls[index - in_epoch + 1:index + 1]
        if sum(epoch) / len(epoch) > target_kl:
            return index + 1
    return len(kls)


def test_target_kl_stops_at_once_when_the_kl_is_forced_large():
    trainer = make_trainer(**SEEDED, target_kl=0.01)
    metrics, kls = run_recorded(trainer, seed=1, logp_noise=3.0)
    assert kls[0] > 0.01
    assert metrics["early_stopped"] == 1.0 and metrics["minibatch_steps"] == 1.0 and metrics["gradient_steps"] == 1.0
    off, off_kls = run_recorded(make_trainer(**SEEDED), seed=1, logp_noise=3.0)
    assert off["early_stopped"] == 0.0 and off["minibatch_steps"] == 6.0 and len(off_kls) == 6


@pytest.mark.parametrize("accumulation", [1, 2])
def test_target_kl_stop_point_matches_the_running_epoch_mean(accumulation):
    """Learning rate 0 keeps every minibatch's KL the same with or without early stopping (same draws), so each
    threshold's stop point can be predicted from the KLs of a run without it."""
    base = dict(SEEDED, minibatch_size=ROWS * HORIZON // 4, gradient_accumulation=accumulation)
    _, kls = run_recorded(make_trainer(**base), seed=4, logp_noise=0.4)
    assert len(kls) == 12
    running = sorted({sum(kls[s:i + 1]) / (i + 1 - s) for i in range(12) for s in [i - i % 4]})
    thresholds = [(a + b) / 2 for a, b in zip(running, running[1:])][::3] + [running[-1] * 2]
    stops = set()
    for target_kl in thresholds:
        metrics, _ = run_recorded(make_trainer(**base, target_kl=target_kl), seed=4, logp_noise=0.4)
        expected = expected_stop(kls, per_epoch=4, accumulation=accumulation, target_kl=target_kl)
        assert metrics["minibatch_steps"] == expected, target_kl
        assert metrics["early_stopped"] == float(expected < 12)
        stops.add(expected)
    assert len(stops) >= 2 and 12 in stops  # the thresholds exercise stopping and not stopping


# ---------------------------------------------------------------- value-target normalisation


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30), min_size=1, max_size=6))
def test_running_mean_std_matches_numpy(chunks):
    stats = RunningMeanStd()
    for chunk in chunks:
        stats.update(torch.tensor(chunk, dtype=torch.float32))
    seen = np.concatenate([np.asarray(c, dtype=np.float32).astype(np.float64) for c in chunks])
    assert float(stats.count) == len(seen)
    assert float(stats.mean) == pytest.approx(seen.mean(), rel=1e-9, abs=1e-9)
    assert float(stats.var) == pytest.approx(seen.var(), rel=1e-7, abs=1e-7)
    x = np.linspace(-5, 5, 7)
    std = np.sqrt(seen.var() + VARIANCE_EPSILON)
    normalized = stats.normalize(torch.tensor(x)).numpy()
    np.testing.assert_allclose(normalized, (x - seen.mean()) / std, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats.denormalize(torch.tensor(normalized)).numpy(), x, rtol=1e-9, atol=1e-6)


def test_running_mean_std_edge_cases():
    stats = RunningMeanStd()
    assert float(stats.mean) == 0.0 and float(stats.var) == 1.0  # before any data: the identity (up to eps)
    stats.update(torch.empty(0))
    assert float(stats.count) == 0.0
    stats.update(torch.full((5,), 3.0))  # constant returns: variance 0, std sqrt(eps), no division by 0
    assert float(stats.var) == 0.0 and float(stats.mean) == 3.0
    assert torch.equal(stats.normalize(torch.full((2,), 3.0)), torch.zeros(2))


def normalize_np(x, mean, var):
    return (x - mean) / np.sqrt(var + VARIANCE_EPSILON)


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_value_loss_in_normalized_space_matches_numpy(clip_vloss):
    trainer = make_trainer(clip_vloss=clip_vloss, norm_value_targets=True)
    policy, batch, data = make_case(6, logp_noise=0.25)
    prior = np.random.default_rng(6).normal(2.0, 3.0, size=50)  # statistics from earlier updates
    stats = RunningMeanStd()
    stats.update(torch.tensor(prior))
    mean0, var0 = prior.mean(), prior.var()

    # NumPy: the actors' values are normalised; denormalise them (and the bootstraps that exist) for GAE
    std0 = np.sqrt(var0 + VARIANCE_EPSILON)
    raw = dict(data)
    raw["values"] = data["values"].astype(np.float64) * std0 + mean0
    raw["bootstrap"] = np.where(data["bootstrap"] != 0, data["bootstrap"] * std0 + mean0, 0.0)
    expected = reference_metrics(policy, raw, trainer, 0.6)
    rewards = raw["rewards"].astype(np.float64) + trainer.gamma * raw["bootstrap"]
    returns = reference_gae(raw["values"], rewards, data["dones"], expected["_ratios"], trainer.gamma,
                            trainer.gae_lambda, trainer.vtrace_rho_clip, trainer.vtrace_c_clip)
    returns = returns + raw["values"][:, :HORIZON]
    seen = np.concatenate([prior, returns.ravel()])
    mean1, var1 = seen.mean(), seen.var()
    targets = normalize_np(returns, mean1, var1)
    old_values = normalize_np(raw["values"][:, :HORIZON], mean1, var1)
    with torch.no_grad():
        newvalue = policy(torch.from_numpy(data["obs"][:, :HORIZON]))[1].numpy().astype(np.float64)
    if clip_vloss:
        v_clipped = old_values + np.clip(newvalue - old_values, -trainer.vf_clip_coef, trainer.vf_clip_coef)
        v_loss = np.maximum((newvalue - targets) ** 2, (v_clipped - targets) ** 2).mean()
        assert (np.abs(newvalue - old_values) > trainer.vf_clip_coef).any()  # the clip is exercised
    else:
        v_loss = ((newvalue - targets) ** 2).mean()

    metrics = ppo_update(policy, torch.optim.Adam(policy.parameters()), batch, trainer=trainer,
                         plan=make_plan(trainer, num_agents=1), schedule=frozen_schedule(trainer),
                         generator=torch.Generator().manual_seed(0), value_normalizer=stats)
    assert metrics["value_loss"] == pytest.approx(v_loss, rel=1e-4)
    for key in ("policy_loss", "advantage_mean", "explained_variance", "entropy"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-5), key
    assert float(stats.mean) == pytest.approx(mean1, rel=1e-6) and float(stats.var) == pytest.approx(var1, rel=1e-6)


def test_value_normalizer_and_entropy_multiplier_go_through_a_checkpoint(tmp_path):
    trainer = make_trainer(**SEEDED, norm_value_targets=True, entropy_floor=10.0)
    _, batch, _ = make_case(2, logp_noise=0.25)
    trained = make_ppo(trainer)
    for update in range(2):
        trained.update(batch, update_index=update)
    path = save_checkpoint(tmp_path, learned=trained.state_dict(), state=TrainerState(update=2), keep=1)
    assert {"value_normalizer.safetensors", "entropy_control.safetensors"} <= {p.name for p in path.iterdir()}
    resumed = make_ppo(trainer, seed=5)
    resumed.load_state_dict(load_checkpoint(path).learned)
    assert float(resumed.value_normalizer.count) == 2 * ROWS * HORIZON
    assert_same(dict(resumed.value_normalizer.state_dict()), dict(trained.value_normalizer.state_dict()))
    assert float(resumed.entropy_control.multiplier) == STEP ** 2
    assert_same(params(resumed.policy), params(trained.policy))


# ---------------------------------------------------------------- entropy floor


def multipliers_np(entropies: np.ndarray, floor: float) -> np.ndarray:
    """NumPy: the multiplier in force at each update, starting at 1."""
    out = np.ones(len(entropies) + 1)
    for k, h in enumerate(entropies):
        factor = 1.0 if np.isnan(h) else (STEP if h < floor else 1.0 / STEP)
        out[k + 1] = np.clip(out[k] * factor, 1.0, MAX_MULTIPLIER)
    return out


@settings(max_examples=50, deadline=None)
@given(entropies=st.lists(st.one_of(st.floats(0.0, 2.0), st.just(float("nan"))), max_size=40),
       floor=st.floats(0.01, 2.0))
def test_entropy_multiplier_sequence_matches_numpy(entropies, floor):
    multiplier, seen = 1.0, [1.0]
    for h in entropies:
        multiplier = next_multiplier(multiplier, h, floor)
        seen.append(multiplier)
    np.testing.assert_allclose(seen, multipliers_np(np.asarray(entropies, dtype=np.float64), floor), rtol=1e-12)


def test_entropy_floor_raises_the_scheduled_coefficient_and_skips_warmup():
    trainer = make_trainer(**SEEDED, entropy_floor=10.0, vf_warmup=1)  # 10 nats: always below the floor
    plan = make_plan(trainer, num_agents=1)
    _, batch, _ = make_case(3, logp_noise=0.25)
    ppo = make_ppo(trainer)
    expected = multipliers_np(np.zeros(7), 10.0)  # the warm-up update does not count
    for update in range(8):
        metrics = ppo.update(batch, update_index=update)
        scheduled = schedule_for(trainer, update, plan.total_epochs).ent_coef
        multiplier = expected[max(0, update - 1)]
        assert metrics["ent_coef_scheduled"] == scheduled
        assert metrics["ent_coef_multiplier"] == multiplier
        assert metrics["ent_coef"] == pytest.approx(scheduled * multiplier, rel=1e-12)
    assert metrics["ent_coef_multiplier"] == MAX_MULTIPLIER and scheduled < trainer.ent_coef  # capped; linear decay


# ---------------------------------------------------------------- value-health warning


def feed(monitor: ValueHealthMonitor, evs, returns) -> list[int]:
    """The updates (0-based) after which a warning line came."""
    return [k for k, ev in enumerate(evs)
            if monitor.observe(explained_variance=ev, episode_returns=returns).warning is not None]


def test_health_warns_once_per_stall_and_again_after_recovery():
    varied = [0.0, 10.0, 3.0, 7.0]
    evs = [0.01] * 30 + [0.5] + [-0.2] * 25 + [float("nan")] + [0.0] * 19
    monitor = ValueHealthMonitor()
    assert feed(monitor, evs, varied) == [19, 50]  # 20th low update; after recovery at 30, the 20th low again
    assert monitor.warnings == 2 and monitor.stalled
    warning = ValueHealthMonitor(patience=1).observe(explained_variance=0.0, episode_returns=varied).warning
    for cause in ("saturated inputs", "uint8", "learning rate", "0.05"):
        assert cause in warning


def test_health_is_quiet_when_returns_are_constant_or_the_variance_is_fine():
    assert feed(ValueHealthMonitor(), [0.0] * 50, [1.0] * 100) == []
    assert feed(ValueHealthMonitor(), [0.0] * 50, []) == []
    assert feed(ValueHealthMonitor(), [0.05] * 50, [0.0, 5.0]) == []
    assert feed(ValueHealthMonitor(), [0.0] * 19, [0.0, 5.0]) == []
    assert feed(ValueHealthMonitor(), ([0.0] * 19 + [None]) * 3, [0.0, 5.0]) == []  # a gap breaks the streak


def test_health_goes_to_prometheus():
    registry = new_registry("learner")
    metrics = LearnerMetrics(registry)
    monitor = ValueHealthMonitor(patience=3)
    for ev in [0.0, 0.0, 0.0, 0.0, 0.9, 0.0]:
        metrics.observe_value_health(monitor.observe(explained_variance=ev, episode_returns=[0.0, 1.0]))
    assert registry.get_sample_value("sluice_value_health_warnings_total") == 1.0
    assert registry.get_sample_value("sluice_value_low_explained_variance_updates") == 1.0
    assert registry.get_sample_value("sluice_value_stalled") == 0.0


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("key", ["target_kl", "entropy_floor"])
@pytest.mark.parametrize("value", [0, -0.5])
def test_config_refuses_non_positive_values(key, value):
    with pytest.raises(ConfigError, match=rf"trainer\.{key}: {float(value)!r} is out of range; allowed: > 0\.0"):
        load_config(overrides=[f"trainer.{key}={value}"])


def test_config_defaults_are_off_and_values_load():
    trainer = load_config().trainer
    assert trainer.target_kl is None and trainer.entropy_floor is None and trainer.norm_value_targets is False
    trainer = load_config(overrides=["trainer.target_kl=0.02", "trainer.entropy_floor=0.3",
                                     "trainer.norm_value_targets=true"]).trainer
    assert (trainer.target_kl, trainer.entropy_floor, trainer.norm_value_targets) == (0.02, 0.3, True)
    with pytest.raises(ConfigError, match=r"trainer\.norm_value_targets: expected true or false"):
        load_config(overrides=["trainer.norm_value_targets=1"])
