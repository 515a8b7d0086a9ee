"""Observation encoders (policies/encoders.py): the auto choice, config errors, NumPy references of the cnn and
token encoders, padding invariance, flat policies unchanged, and gridworld policies end to end."""

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
from envs.base import EnvSpec, StepBuffers, TokenLayout
from envs.builtin.cartpole import CartPoleVec
from envs.builtin.connect_four.game import ConnectFourVec
from envs.errors import EnvConfigError
from envs.builtin.gridworld import GridworldVec
from envs.registry import env_spec
from envs.spaces import ActionSpace
from learner.build import make_algorithm
from policies.encoders import CNNEncoder, TokenEncoder, encoder_kind, make_encoder, masked_mean
from policies.factory import load_state_arrays, make_policy, state_arrays
from policies.layers import ObsInput
from tests.token_env import PAD, PaddedTokenVec

ROOT = Path(__file__).resolve().parents[1]
GRID = GridworldVec.spec_for(3, 11, 11)
TOKENS = PaddedTokenVec.spec_for(16)
SMALL = ModelSection(hidden_size=8, num_layers=1)


def grid_spec(shape: tuple[int, ...], dtype: str = "uint8", layout: str | None = None) -> EnvSpec:
    """A spec of this obs shape; rank-3 shapes declare image_layout chw unless ``layout`` says otherwise."""
    layout = ("chw" if len(shape) == 3 else "") if layout is None else layout
    return EnvSpec(num_agents=1, obs_shape=shape, obs_dtype=dtype, action=ActionSpace.discrete(3), image_layout=layout)


# --- flat observations: exactly today's network -------------------------------------------------------------------

CARTPOLE_KEYS = {
    "mlp": ["torso.0.weight", "torso.0.bias", "torso.2.weight", "torso.2.bias", "critic_torso.0.weight",
            "critic_torso.0.bias", "critic_torso.2.weight", "critic_torso.2.bias", "actor.linear.weight",
            "actor.linear.bias", "critic.weight", "critic.bias"],
    "lstm": ["torso.0.weight", "torso.0.bias", "torso.2.weight", "torso.2.bias", "cell.weight_ih", "cell.weight_hh",
             "cell.bias_ih", "cell.bias_hh", "actor.linear.weight", "actor.linear.bias", "critic.weight",
             "critic.bias"],
}
# Recorded with the code before encoders existed (torch.manual_seed(7), default ModelSection).
CARTPOLE_FIRST_FORWARD = {
    "mlp": ([[0.0008972, 0.0010414], [0.003741, 0.0003873]], [0.1547846, -0.3514795], -12.303626736160368),
    "lstm": ([[-0.0001709, 0.0000234], [-0.0003536, -0.0004692]], [0.00426, 0.0149936], 2.927717497534104),
}


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_cartpole_policy_is_unchanged_by_encoders(core: str) -> None:
    torch.manual_seed(7)
    policy = make_policy(CartPoleVec.SPEC, ModelSection(core=core))
    assert isinstance(policy.encoder, ObsInput)
    assert list(policy.state_dict()) == CARTPOLE_KEYS[core]
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4], [1.0, 0.5, -0.25, -1.5]])
    with torch.no_grad():
        logits, values, _ = policy.step(obs, torch.zeros(2, policy.state_size))
    want_logits, want_values, want_sum = CARTPOLE_FIRST_FORWARD[core]
    np.testing.assert_allclose(logits.numpy(), want_logits, atol=1e-6)
    np.testing.assert_allclose(values.numpy(), want_values, atol=1e-6)
    # The orthogonal init's QR rounds differently with torch's thread count and with the CPU's BLAS kernels: over
    # ~10k-40k parameters the sum moved by 1.4e-5 between two x86 machines. 1e-3 still catches any change of
    # initialisation (gain, scheme or draw order), which moves this sum by order 1.
    assert sum(float(t.double().sum()) for t in policy.state_dict().values()) == pytest.approx(want_sum, abs=1e-3)


# --- the auto choice and config errors ----------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "kind"), [
    (GRID, "cnn"), (ConnectFourVec.SPEC, "cnn"), (CartPoleVec.SPEC, "mlp"), (TOKENS, "tokens"),
    (grid_spec((4, 2, 9)), "mlp"), (grid_spec((4, 3, 3)), "cnn"), (grid_spec((3, 4)), "mlp"),
    (grid_spec((2, 3, 3, 3)), "mlp"), (grid_spec((4, 3, 3), layout=""), "mlp"),  # rank 3 alone is not an image
    (grid_spec((3, 3, 4), layout="hwc"), "cnn"), (grid_spec((9, 2, 3), layout="hwc"), "mlp"),
    (grid_spec((210, 160, 3), layout="hwc"), "cnn"),
])
def test_auto_picks_the_encoder_from_the_spec(spec: EnvSpec, kind: str) -> None:
    assert encoder_kind(spec, ModelSection()) == kind
    expected = {"mlp": ObsInput, "cnn": CNNEncoder, "tokens": TokenEncoder}[kind]
    assert isinstance(make_encoder(spec, SMALL), expected)


def test_explicit_encoders_are_honoured() -> None:
    assert encoder_kind(GRID, replace(SMALL, encoder="mlp")) == "mlp"
    assert encoder_kind(TOKENS, replace(SMALL, encoder="mlp")) == "mlp"
    assert encoder_kind(GRID, replace(SMALL, encoder="cnn")) == "cnn"


def test_unknown_encoder_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"model\.encoder: 'conv' is not allowed; allowed: auto, mlp, cnn, tokens"):
        load_config(ROOT / "configs" / "cartpole.yaml", ["model.encoder=conv"])
    with pytest.raises(ConfigError, match=r"model\.cnn_channels: 0 is out of range"):
        load_config(ROOT / "configs" / "cartpole.yaml", ["model.cnn_channels=[16, 0]"])


def test_cnn_on_a_flat_obs_names_the_obs_shape() -> None:
    with pytest.raises(ConfigError, match=r"model\.encoder: 'cnn' needs .*obs_shape is \[4\].*allowed here: auto, mlp"):
        make_policy(CartPoleVec.SPEC, replace(SMALL, encoder="cnn"))


def test_cnn_on_a_rank_3_obs_without_a_layout_says_to_declare_one() -> None:
    with pytest.raises(ConfigError, match=r"model\.encoder: 'cnn' .*obs_shape is \[4, 5, 6\] with image_layout ''"
                                          r" \(declare image_layout .*allowed here: auto, mlp$"):
        make_policy(grid_spec((4, 5, 6), layout=""), replace(SMALL, encoder="cnn"))


def test_tokens_without_a_token_layout_names_the_obs_shape() -> None:
    with pytest.raises(ConfigError, match=r"model\.encoder: 'tokens' needs .*obs_shape is \[6, 11, 11\] .*mlp, cnn"):
        make_policy(GRID, replace(SMALL, encoder="tokens"))


def test_learner_refuses_a_wrong_encoder_before_it_starts() -> None:
    config = load_config(ROOT / "configs" / "cartpole.yaml", ["model.encoder=tokens"])
    with pytest.raises(ConfigError, match=r"obs_shape is \[4\]"):
        make_algorithm(config, env_spec(config.env), make_plan(config.trainer, num_agents=1),
                       device=torch.device("cpu"), seed=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_locations": 0, "num_features": 2, "pad_value": 255}, "must be >= 1"),
    ({"num_locations": 121, "num_features": 2, "pad_value": 7}, "pad_value 7 is a real location"),
    ({"num_locations": 121, "num_features": 2, "pad_value": True}, "pad_value must be an int"),
])
def test_token_layout_validates_itself(kwargs: dict, message: str) -> None:
    with pytest.raises(EnvConfigError, match=message):
        TokenLayout(**kwargs)


@pytest.mark.parametrize(("shape", "dtype", "layout", "message"), [
    ((16, 4), "uint8", (121, 4, 255), r"shape \[L, 3\].*got obs_shape \(16, 4\)"),
    ((16, 3, 1), "uint8", (121, 4, 255), r"shape \[L, 3\]"),
    ((16, 3), "float32", (121, 4, 255), "integer obs_dtype"),
    ((16, 3), "uint8", (121, 4, 300), "too narrow for pad_value 300"),
    ((16, 3), "uint8", (400, 4, -1), "too narrow"),
])
def test_env_spec_checks_its_token_layout(shape: tuple[int, ...], dtype: str, layout: tuple[int, int, int],
                                          message: str) -> None:
    locations, features, pad = layout
    with pytest.raises(EnvConfigError, match=message):
        EnvSpec(num_agents=1, obs_shape=shape, obs_dtype=dtype, action=ActionSpace.discrete(2),
                tokens=TokenLayout(num_locations=locations, num_features=features, pad_value=pad))


# --- cnn: shapes and forward pass against NumPy -------------------------------------------------------------------

def numpy_conv3x3(images: np.ndarray, weight: np.ndarray, bias: np.ndarray, padding: int) -> np.ndarray:
    """Stride-1 cross-correlation [N, C, H, W] x [O, C, 3, 3] -> [N, O, H + 2p - 2, W + 2p - 2] by explicit sums."""
    padded = np.pad(images, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out_h, out_w = padded.shape[2] - 2, padded.shape[3] - 2
    out = np.zeros((images.shape[0], weight.shape[0], out_h, out_w))
    for dy in range(3):
        for dx in range(3):
            window = padded[:, :, dy:dy + out_h, dx:dx + out_w]
            out += np.einsum("nchw,oc->nohw", window, weight[:, :, dy, dx])
    return out + bias[None, :, None, None]


@settings(max_examples=25, deadline=None)
@given(channels=st.integers(1, 3), height=st.integers(3, 9), width=st.integers(3, 9),
       conv_channels=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_cnn_matches_a_numpy_reference(channels: int, height: int, width: int, conv_channels: list[int],
                                       seed: int) -> None:
    torch.manual_seed(seed)
    spec = grid_spec((channels, height, width))
    model = replace(SMALL, hidden_size=5, cnn_channels=conv_channels)
    encoder = make_encoder(spec, model)
    assert isinstance(encoder, CNNEncoder)
    obs = np.random.default_rng(seed).integers(0, 256, size=(2, 3, channels, height, width), dtype=np.uint8)
    x = obs.reshape(6, channels, height, width).astype(np.float64) / 255.0
    convs = [m for m in encoder.conv if isinstance(m, torch.nn.Conv2d)]
    for conv in convs:
        side_h, side_w = x.shape[2], x.shape[3]
        padding = 0 if min(side_h, side_w) >= 3 else 1  # shrink by 2 while both sides allow a 3x3 window
        x = np.maximum(numpy_conv3x3(x, conv.weight.detach().double().numpy(), conv.bias.detach().double().numpy(),
                                     padding), 0.0)
        assert x.shape[2:] == (side_h + 2 * padding - 2, side_w + 2 * padding - 2)
    assert x.shape[1:] == encoder.conv_output_shape
    w, b = encoder.linear.weight.detach().double().numpy(), encoder.linear.bias.detach().double().numpy()
    want = np.maximum(x.reshape(6, -1) @ w.T + b, 0.0).reshape(2, 3, 5)
    with torch.no_grad():
        got = encoder(torch.from_numpy(obs))
    assert got.shape == (2, 3, 5) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(channels=st.integers(1, 2), height=st.integers(30, 72), width=st.integers(30, 72),
       conv_channels=st.lists(st.integers(1, 3), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_cnn_steps_two_pixels_over_large_images_like_a_numpy_reference(channels: int, height: int, width: int,
                                                                       conv_channels: list[int], seed: int) -> None:
    """Above 32 pixels on both sides a layer's output is the stride-1 output at every other row and column."""
    torch.manual_seed(seed)
    encoder = make_encoder(grid_spec((channels, height, width)), replace(SMALL, hidden_size=4,
                                                                          cnn_channels=conv_channels))
    obs = np.random.default_rng(seed).integers(0, 256, size=(2, channels, height, width), dtype=np.uint8)
    x = obs.astype(np.float64) / 255.0
    for conv in (m for m in encoder.conv if isinstance(m, torch.nn.Conv2d)):
        step = 2 if min(x.shape[2], x.shape[3]) > 32 else 1
        full = numpy_conv3x3(x, conv.weight.detach().double().numpy(), conv.bias.detach().double().numpy(), 0)
        x = np.maximum(full[:, :, ::step, ::step], 0.0)
    assert x.shape[1:] == encoder.conv_output_shape
    w, b = encoder.linear.weight.detach().double().numpy(), encoder.linear.bias.detach().double().numpy()
    with torch.no_grad():
        got = encoder(torch.from_numpy(obs))
    np.testing.assert_allclose(got.numpy(), np.maximum(x.reshape(2, -1) @ w.T + b, 0.0), rtol=1e-4, atol=1e-5)


def test_large_images_are_downsampled_and_boards_are_not() -> None:
    atari = make_encoder(grid_spec((4, 84, 84)), ModelSection())
    assert atari.conv_output_shape == (16, 20, 20)  # 84 -> 41 -> 20
    screen = make_encoder(grid_spec((3, 280, 480)), ModelSection())  # PettingZoo's cooperative_pong_v6
    assert screen.conv_output_shape == (16, 69, 119) and screen.linear.in_features == 16 * 69 * 119
    assert make_encoder(grid_spec((2, 32, 40)), ModelSection()).conv_output_shape == (16, 28, 36)  # no stride


def test_cnn_shapes_for_the_built_in_grids() -> None:
    grid = make_encoder(GRID, ModelSection())
    assert grid.conv_output_shape == (16, 7, 7)
    connect_four = make_encoder(ConnectFourVec.SPEC, ModelSection(cnn_channels=[8, 8, 8]))
    assert connect_four.conv_output_shape == (8, 2, 3)  # 6x7 -> 4x5 -> 2x3 -> 2x3 (padded once below 3)


# --- tokens: pooling against NumPy, padding never matters ---------------------------------------------------------

def numpy_token_encoder(encoder: TokenEncoder, obs: np.ndarray) -> np.ndarray:
    """The token encoder of one batch [N, L, 3] in NumPy float64: masked mean over the real rows' entries."""
    weights = {name: t.detach().double().numpy() for name, t in encoder.state_dict().items()}
    out = []
    for rows in obs.astype(np.int64):
        real = rows[rows[:, 0] != PAD]
        if len(real) == 0:
            pooled = np.zeros(encoder.out_features)
        else:
            loc, feat, value = real[:, 0], real[:, 1], real[:, 2] / 255.0
            embedded = (weights["location.weight"][loc] + weights["feature.weight"][feat]
                        + value[:, None] * weights["feature_value.weight"][feat])
            entries = np.maximum(embedded @ weights["entry.weight"].T + weights["entry.bias"], 0.0)
            pooled = entries.mean(axis=0)
        out.append(np.maximum(pooled @ weights["output.weight"].T + weights["output.bias"], 0.0))
    return np.array(out)


def random_tokens(rng: np.random.Generator, batch: int, rows: int, real_fraction: float) -> np.ndarray:
    obs = rng.integers(0, 256, size=(batch, rows, 3), dtype=np.uint8)
    real = rng.random((batch, rows)) < real_fraction
    obs[:, :, 0] = np.where(real, rng.integers(0, 121, size=(batch, rows)), PAD)
    obs[:, :, 1] = rng.integers(0, 4, size=(batch, rows))
    return obs


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 12), real_fraction=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_token_encoder_matches_a_numpy_masked_mean(seed: int, rows: int, real_fraction: float) -> None:
    torch.manual_seed(seed)
    encoder = make_encoder(TOKENS, SMALL)
    obs = random_tokens(np.random.default_rng(seed), 5, rows, real_fraction)
    with torch.no_grad():
        got = encoder(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(got, numpy_token_encoder(encoder, obs), rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3), min_size=12, max_size=12),
       mask=st.lists(st.booleans(), min_size=4, max_size=4))
def test_masked_mean_matches_numpy(values: list[float], mask: list[bool]) -> None:
    entries = np.array(values).reshape(4, 3)
    real = np.array(mask)
    want = entries[real].mean(axis=0) if real.any() else np.zeros(3)
    got = masked_mean(torch.tensor(entries), torch.tensor(real)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), extra=st.integers(0, 20), real_fraction=st.sampled_from([0.0, 0.2, 0.7]))
def test_padding_rows_never_change_the_output(seed: int, extra: int, real_fraction: float) -> None:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    encoder = make_encoder(TOKENS, SMALL)
    obs = random_tokens(rng, 1, 8, real_fraction)[0]
    padding = rng.integers(0, 256, size=(extra, 3), dtype=np.uint8)
    padding[:, 0] = PAD
    appended = np.concatenate([obs, padding])
    shuffled = appended[rng.permutation(len(appended))]  # padding rows moved in among the real ones
    scribbled = shuffled.copy()
    is_pad = scribbled[:, 0] == PAD
    scribbled[is_pad, 1:] = rng.integers(0, 256, size=(int(is_pad.sum()), 2), dtype=np.uint8)
    with torch.no_grad():
        base = encoder(torch.from_numpy(obs))
        for variant in (appended, shuffled, scribbled):
            np.testing.assert_allclose(encoder(torch.from_numpy(variant)).numpy(), base.numpy(), rtol=1e-5, atol=1e-6)


def test_all_padding_gives_zero_features_and_finite_gradients() -> None:
    spec = EnvSpec(num_agents=1, obs_shape=(6, 3), obs_dtype="int64", action=ActionSpace.discrete(2),
                   tokens=TokenLayout(num_locations=5, num_features=3, pad_value=-1))
    policy = make_policy(spec, replace(SMALL, encoder="tokens"))
    obs = torch.full((2, 6, 3), 2**62, dtype=torch.int64)
    obs[..., 0] = -1  # every row padding; the other columns hold absurd values no encoder may read
    features = policy.encoder(obs)
    assert torch.equal(features, torch.zeros(2, SMALL.hidden_size))
    logits, values = policy(obs)
    (logits.sum() + values.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters() if p.grad is not None)


# --- policies end to end ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("core", ["mlp", "lstm"])
@pytest.mark.parametrize("spec", [GRID, TOKENS], ids=["gridworld", "tokens"])
def test_encoded_policy_round_trips_through_state_arrays(core: str, spec: EnvSpec) -> None:
    torch.manual_seed(0)
    model = ModelSection(core=core, hidden_size=16)
    policy, copy = make_policy(spec, model), make_policy(spec, model)
    assert any(name.startswith("encoder.") for name in policy.state_dict())
    load_state_arrays(copy, state_arrays(policy))
    buffers = StepBuffers.allocate(spec, 4)
    if spec is GRID:
        GridworldVec(num_envs=4, num_agents=3, obs_height=11, obs_width=11, max_steps=50).reset(buffers, seed=3)
    else:
        PaddedTokenVec(num_envs=4, max_steps=8, rows=16).reset(buffers, seed=3)
    obs = torch.from_numpy(buffers.obs)
    state = torch.zeros(len(obs), policy.state_size)
    with torch.no_grad():
        want, got = policy.step(obs, state), copy.step(obs, state)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_the_learner_builds_for_the_gridworld_config() -> None:
    config = load_config(ROOT / "configs" / "grid_3agents.yaml")
    spec = env_spec(config.env)
    algorithm = make_algorithm(config, spec, make_plan(config.trainer, num_agents=config.env.num_agents),
                               device=torch.device("cpu"), seed=0)
    assert isinstance(algorithm.policy.encoder, CNNEncoder)
    with torch.no_grad():
        logits, values = algorithm.policy(torch.zeros(5, *spec.obs_shape, dtype=torch.uint8))
    assert logits.shape == (5, spec.num_actions) and values.shape == (5,)


def test_the_token_env_is_mostly_padding() -> None:
    env = PaddedTokenVec(num_envs=8, max_steps=4, rows=32, cues=3)
    buffers = StepBuffers.allocate(env.spec, 8)
    env.reset(buffers, seed=1)
    for step in range(1, 5):
        real = buffers.obs[:, :, 0] != PAD
        assert (real.sum(axis=1) == 3).all()
        cue = np.argmax(real & (buffers.obs[:, :, 1] == 0), axis=1)
        buffers.actions[:] = buffers.obs[np.arange(8), cue, 2] // 64  # the paying action
        env.step(buffers)
        assert (buffers.rewards == 1).all()
        assert buffers.episode_done.all() == (step == 4)
    np.testing.assert_array_equal(buffers.episode_return, 4.0)
