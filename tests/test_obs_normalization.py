"""model.obs_norm (policies/obs_normalization.py, policies/running_stats.py): the running statistics and the clipped
normalisation against NumPy, per feature (mlp) and per channel (cnn, chw and hwc), updated only by the learner's
update, frozen in forward passes, carried by the weights and the checkpoint; off builds today's policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.loader import ConfigError, load_config
from configs.plan import make_plan
from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.builtin.cartpole import CartPoleVec
from envs.spaces import ActionSpace
from learner.run.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from learner.ppo.algorithm import PPO
from policies.factory import load_state_arrays, make_policy, state_arrays
from policies.obs_normalization import OBS_CLIP, ObsNormalizer, update_obs_normalizer
from policies.running_stats import VARIANCE_EPSILON, RunningMeanStd
from tests.test_ppo import HORIZON, ROWS, SPEC, make_case, make_trainer
from tests.token_env import PaddedTokenVec

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelSection(hidden_size=8, num_layers=1, cnn_channels=[4], obs_norm=True)
STAT_KEYS = ["encoder.obs_norm.stats.mean", "encoder.obs_norm.stats.var", "encoder.obs_norm.stats.count"]


def normalize_np(x: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """clip((x - mean) / sqrt(var + eps), -5, 5) in float64."""
    return np.clip((x - mean) / np.sqrt(var + VARIANCE_EPSILON), -5.0, 5.0)


def image_spec(shape: tuple[int, ...], layout: str, dtype: str = "float32") -> EnvSpec:
    return EnvSpec(num_agents=1, obs_shape=shape, obs_dtype=dtype, action=ActionSpace.discrete(3),
                   image_layout=layout)


# --- the running statistics ---------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(features=st.integers(1, 5), sizes=st.lists(st.integers(0, 20), min_size=1, max_size=6),
       seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_per_feature_running_mean_std_matches_numpy(features: int, sizes: list[int], seed: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    chunks = [(rng.normal(size=(n, features)) * scale + rng.normal(size=features)).astype(np.float32) for n in sizes]
    stats = RunningMeanStd((features,))
    for chunk in chunks:
        stats.update(torch.from_numpy(chunk))
    seen = np.concatenate(chunks).astype(np.float64)
    assert float(stats.count) == len(seen)
    if len(seen) == 0:  # nothing merged: the identity statistics
        assert torch.equal(stats.mean, torch.zeros(features, dtype=torch.float64))
        assert torch.equal(stats.var, torch.ones(features, dtype=torch.float64))
        return
    np.testing.assert_allclose(stats.mean.numpy(), seen.mean(axis=0), rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(stats.var.numpy(), seen.var(axis=0), rtol=1e-7, atol=1e-9 * scale ** 2)


def test_running_mean_std_rejects_a_wrong_sample_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(3,\) got values of shape \(5, 4\)"):
        RunningMeanStd((3,)).update(torch.zeros(5, 4))
    with pytest.raises(ValueError, match=r"shape \(2, 3\) got values of shape \(3,\)"):
        RunningMeanStd((2, 3)).update(torch.zeros(3))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), spatial=st.sampled_from([0, 2]), spread=st.sampled_from([1e-4, 1.0, 30.0]))
def test_obs_normalizer_matches_numpy(seed: int, spatial: int, spread: float) -> None:
    rng = np.random.default_rng(seed)
    shape = (6, 3) if spatial == 0 else (6, 3, 4, 5)  # [N, F] or [N, C, H, W]
    x = (rng.normal(size=shape) * spread + rng.normal(size=(3,) + (1,) * spatial) * 4).astype(np.float32)
    normalizer = ObsNormalizer(3, spatial_dims=spatial)
    normalizer.update(torch.from_numpy(x))
    per_feature = np.moveaxis(x.astype(np.float64), 1, -1).reshape(-1, 3)
    mean, var = per_feature.mean(axis=0), per_feature.var(axis=0)
    np.testing.assert_allclose(normalizer.stats.mean.numpy(), mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(normalizer.stats.var.numpy(), var, rtol=1e-6, atol=1e-12)
    probe = (rng.normal(size=shape) * spread * 8).astype(np.float32)  # far out: the clip is exercised
    view = (3,) + (1,) * spatial
    want = normalize_np(probe.astype(np.float64), mean.reshape(view), var.reshape(view))
    got = normalizer(torch.from_numpy(probe))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert float(got.abs().max()) <= OBS_CLIP


def test_before_any_update_the_normalizer_is_the_clipped_identity() -> None:
    x = torch.tensor([[-7.0, -0.5, 0.0, 2.0, 6.0]])
    np.testing.assert_allclose(ObsNormalizer(5)(x).numpy(), [[-5.0, -0.5, 0.0, 2.0, 5.0]], rtol=1e-6)


# --- policies: which features, only the learner updates -----------------------------------------------------------

def test_mlp_statistics_are_of_the_flattened_scaled_obs() -> None:
    spec = EnvSpec(num_agents=1, obs_shape=(2, 3), obs_dtype="uint8", action=ActionSpace.discrete(2))
    policy = make_policy(spec, MODEL)
    obs = np.random.default_rng(0).integers(0, 256, size=(4, 5, 2, 3), dtype=np.uint8)
    update_obs_normalizer(policy, torch.from_numpy(obs))
    flat = obs.reshape(20, 6) / 255.0
    stats = policy.encoder.obs_norm.stats
    np.testing.assert_allclose(stats.mean.numpy(), flat.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(stats.var.numpy(), flat.var(axis=0), rtol=1e-5)


@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_cnn_statistics_are_per_channel(layout: str) -> None:
    chw = (3, 5, 4)
    shape = chw if layout == "chw" else (5, 4, 3)
    policy = make_policy(image_spec(shape, layout), MODEL)
    rng = np.random.default_rng(1)
    offsets = np.array([0.0, 10.0, 20.0])  # one per channel, on the channel axis of each layout
    obs = (rng.normal(size=(7, *shape)) + (offsets[:, None, None] if layout == "chw" else offsets)).astype(np.float32)
    update_obs_normalizer(policy, torch.from_numpy(obs))
    channels = np.moveaxis(obs, 1 if layout == "chw" else -1, -1).reshape(-1, 3).astype(np.float64)
    stats = policy.encoder.obs_norm.stats
    np.testing.assert_allclose(stats.mean.numpy(), channels.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(stats.var.numpy(), channels.var(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats.mean.numpy(), [0.0, 10.0, 20.0], atol=0.5)


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_forward_passes_never_move_the_statistics(core: str) -> None:
    policy = make_policy(CartPoleVec.SPEC, replace(MODEL, core=core))
    update_obs_normalizer(policy, torch.randn(10, 4) * 3 + 1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    for mode in (policy.train, policy.eval):
        mode()
        obs = torch.randn(6, 4) * 50
        policy.step(obs, torch.zeros(6, policy.state_size))
        policy.forward_rows(obs.reshape(2, 3, 4), torch.zeros(2, 3), torch.zeros(2, policy.state_size))
    for key, value in policy.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_off_builds_todays_policy_and_on_adds_only_the_statistics() -> None:
    torch.manual_seed(3)
    default = make_policy(CartPoleVec.SPEC, ModelSection())
    torch.manual_seed(3)
    off = make_policy(CartPoleVec.SPEC, ModelSection(obs_norm=False))
    torch.manual_seed(3)
    on = make_policy(CartPoleVec.SPEC, ModelSection(obs_norm=True))
    assert default.encoder.obs_norm is None and off.encoder.obs_norm is None
    assert list(off.state_dict()) == list(default.state_dict())
    assert list(on.state_dict()) == STAT_KEYS + list(default.state_dict())
    for key, value in default.state_dict().items():
        assert torch.equal(on.state_dict()[key], value), key
    assert [name for name, _ in on.named_parameters()] == [name for name, _ in default.named_parameters()]
    obs = torch.randn(5, 4) * 0.5
    with torch.no_grad():  # fresh statistics (mean 0, var 1) are the identity inside the clip
        torch.testing.assert_close(on(obs), default(obs))


def test_obs_norm_with_tokens_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"model\.obs_norm: true does not apply to the tokens encoder.*allowed"):
        make_policy(PaddedTokenVec.spec_for(8), MODEL)
    assert make_policy(PaddedTokenVec.spec_for(8), replace(MODEL, encoder="mlp")).encoder.obs_norm is not None
    config = load_config(ROOT / "configs" / "cartpole.yaml", ["model.obs_norm=true"])
    assert config.model.obs_norm is True


# --- the learner updates them; weights and checkpoints carry them -------------------------------------------------

def make_ppo(model: ModelSection, *, seed: int = 0) -> PPO:
    trainer = make_trainer(learning_rate=1e-2)
    torch.manual_seed(seed)
    return PPO(spec=SPEC, model=model, trainer=trainer, plan=make_plan(trainer, num_agents=1),
               device=torch.device("cpu"), minibatch_seed=seed)


def test_each_update_merges_the_steps_it_trains_on() -> None:
    ppo = make_ppo(MODEL)
    seen = []
    for update in range(3):
        _, batch, data = make_case(update, logp_noise=0.25)
        batch.obs[:, HORIZON] = 1e6  # the bootstrap step of a row is not trained on: it must not count
        ppo.update(batch, update_index=update)
        seen.append(data["obs"][:, :HORIZON].reshape(-1, data["obs"].shape[-1]))
    all_seen = np.concatenate(seen).astype(np.float64)
    stats = ppo.policy.encoder.obs_norm.stats
    assert float(stats.count) == 3 * ROWS * HORIZON
    np.testing.assert_allclose(stats.mean.numpy(), all_seen.mean(axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats.var.numpy(), all_seen.var(axis=0), rtol=1e-6)


def test_statistics_go_through_the_weights_and_a_checkpoint(tmp_path: Path) -> None:
    trained = make_ppo(MODEL)
    for update in range(2):
        trained.update(make_case(update, logp_noise=0.25)[1], update_index=update)
    arrays = state_arrays(trained.policy)
    assert set(STAT_KEYS) <= set(arrays) and arrays[STAT_KEYS[0]].dtype == np.float64
    actor = make_policy(SPEC, MODEL)  # an actor host's copy: it normalises as the learner does
    load_state_arrays(actor, arrays)
    path = save_checkpoint(tmp_path, learned=trained.state_dict(), state=TrainerState(update=2), keep=1)
    resumed = make_ppo(MODEL, seed=9)
    resumed.load_state_dict(load_checkpoint(path).learned)
    obs = torch.randn(5, 4) * 3
    with torch.no_grad():
        want = trained.policy(obs)
        for copy in (actor, resumed.policy):
            assert float(copy.encoder.obs_norm.stats.count) == 2 * ROWS * HORIZON
            for key in STAT_KEYS:
                assert torch.equal(copy.state_dict()[key], trained.policy.state_dict()[key]), key
            for a, b in zip(copy(obs), want):
                assert torch.equal(a, b)
