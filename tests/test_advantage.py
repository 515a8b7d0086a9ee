"""V-trace GAE against a plain-Python float64 double loop written from the seed formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.ppo.advantage import _gae_torch, compute_advantages


def reference_gae(values, rewards, dones, ratios, *, gamma, gae_lambda, rho_clip=1.0, c_clip=1.0):
    values, rewards, dones, ratios = (np.asarray(x, dtype=np.float64) for x in (values, rewards, dones, ratios))
    rows, horizon = ratios.shape
    out = np.zeros((rows, horizon), dtype=np.float64)
    for s in range(rows):
        for t in reversed(range(horizon)):
            rho = min(rho_clip, ratios[s, t])
            c = min(c_clip, ratios[s, t])
            notdone = 1.0 - dones[s, t + 1]
            delta = rho * (rewards[s, t + 1] + gamma * values[s, t + 1] * notdone - values[s, t])
            if t == horizon - 1:
                out[s, t] = delta
            else:
                out[s, t] = delta + gamma * gae_lambda * c * out[s, t + 1] * notdone
    return out


def random_inputs(rng, rows, horizon, *, done_p=0.1, ratio_spread=0.6):
    values = rng.normal(size=(rows, horizon + 1)).astype(np.float32)
    rewards = rng.normal(size=(rows, horizon + 1)).astype(np.float32)
    dones = (rng.random((rows, horizon + 1)) < done_p).astype(np.float32)
    ratios = np.exp(rng.normal(scale=ratio_spread, size=(rows, horizon))).astype(np.float32)
    return values, rewards, dones, ratios


def check(values, rewards, dones, ratios, **kw):
    expected = reference_gae(values, rewards, dones, ratios, **kw)
    got = compute_advantages(values, rewards, dones, ratios, **kw)
    assert isinstance(got, np.ndarray) and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    tensors = [torch.from_numpy(x) for x in (values, rewards, dones, ratios)]
    got_t = compute_advantages(*tensors, **kw)
    assert isinstance(got_t, torch.Tensor) and got_t.device.type == "cpu"
    np.testing.assert_allclose(got_t.numpy(), expected, rtol=1e-5, atol=1e-5)
    return expected


CLIPS = [(1.0, 1.0), (0.5, 2.0), (2.0, 0.5), (1.0, 0.5), (2.0, 1.0)]


@pytest.mark.parametrize("rows, horizon", [(1, 1), (3, 1), (5, 4), (8, 16), (2, 64)])
@pytest.mark.parametrize("gamma", [0.977, 0.99, 1.0])
@pytest.mark.parametrize("rho_clip, c_clip", CLIPS)
def test_random_against_reference(rows, horizon, gamma, rho_clip, c_clip):
    rng = np.random.default_rng(rows * 1000 + horizon)
    inputs = random_inputs(rng, rows, horizon, done_p=0.2)
    check(*inputs, gamma=gamma, gae_lambda=0.916, rho_clip=rho_clip, c_clip=c_clip)


def test_ratios_cross_both_clips():
    rng = np.random.default_rng(1)
    values, rewards, dones, _ = random_inputs(rng, 6, 12)
    ratios = np.tile(np.array([0.3, 0.6, 0.9, 1.0, 1.2, 1.7, 2.5, 0.1, 3.0, 0.5, 1.5, 2.0], np.float32), (6, 1))
    for rho_clip, c_clip in CLIPS:
        expected = check(values, rewards, dones, ratios, gamma=0.99, gae_lambda=0.95,
                         rho_clip=rho_clip, c_clip=c_clip)
        unclipped = reference_gae(values, rewards, dones, ratios, gamma=0.99, gae_lambda=0.95,
                                  rho_clip=np.inf, c_clip=np.inf)
        assert not np.allclose(expected, unclipped)  # the clips matter on these ratios


def test_episode_ends_mid_row_cuts_the_trace():
    rng = np.random.default_rng(2)
    values, rewards, _, ratios = random_inputs(rng, 4, 10)
    dones = np.zeros_like(values)
    dones[:, 5] = 1.0  # transition out of step 4 ends the episode
    expected = check(values, rewards, dones, ratios, gamma=0.99, gae_lambda=0.95)
    # step 4's advantage is its own clipped TD error, without bootstrapping
    rho = np.minimum(1.0, ratios[:, 4].astype(np.float64))
    np.testing.assert_allclose(expected[:, 4], rho * (rewards[:, 5] - values[:, 4].astype(np.float64)), rtol=1e-12)
    # and changing anything after the done does not change advantages before it
    values2, rewards2 = values.copy(), rewards.copy()
    values2[:, 6:] += 10.0
    rewards2[:, 6:] -= 5.0
    got = compute_advantages(values2, rewards2, dones, ratios, gamma=0.99, gae_lambda=0.95)
    np.testing.assert_allclose(got[:, :5], expected[:, :5], rtol=1e-5, atol=1e-5)


def test_done_on_last_step():
    rng = np.random.default_rng(3)
    values, rewards, dones, ratios = random_inputs(rng, 5, 7, done_p=0.0)
    dones[:, 7] = 1.0
    expected = check(values, rewards, dones, ratios, gamma=0.977, gae_lambda=0.916)
    rho = np.minimum(1.0, ratios[:, 6].astype(np.float64))
    np.testing.assert_allclose(expected[:, 6], rho * (rewards[:, 7] - values[:, 6].astype(np.float64)), rtol=1e-12)


def test_all_dones():
    rng = np.random.default_rng(4)
    values, rewards, _, ratios = random_inputs(rng, 3, 6)
    dones = np.ones_like(values)
    expected = check(values, rewards, dones, ratios, gamma=0.99, gae_lambda=0.95, rho_clip=2.0, c_clip=0.5)
    rho = np.minimum(2.0, ratios.astype(np.float64))
    np.testing.assert_allclose(expected, rho * (rewards[:, 1:] - values[:, :-1].astype(np.float64)), rtol=1e-12)


def test_hand_computed_tiny_case():
    # one row, T = 2, ratio 1 (no clipping effect): gamma 0.5, lambda 0.5
    values = np.array([[1.0, 2.0, 4.0]], np.float32)
    rewards = np.array([[9.0, 1.0, 3.0]], np.float32)  # rewards[0] is never used
    dones = np.zeros((1, 3), np.float32)
    ratios = np.ones((1, 2), np.float32)
    # delta1 = 3 + 0.5*4 - 2 = 3 ; delta0 = 1 + 0.5*2 - 1 = 1 ; A0 = 1 + 0.25*3 = 1.75
    got = compute_advantages(values, rewards, dones, ratios, gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(got, [[1.75, 3.0]], rtol=1e-6)
    # ratios 2 and 0.5 with rho_clip 1.5, c_clip 0.25:
    # rho = [1.5, 0.5], c0 = 0.25 ; delta1 = 0.5*3 = 1.5 ; delta0 = 1.5*1 = 1.5 ; A0 = 1.5 + 0.25*0.25*1.5
    got = compute_advantages(values, rewards, dones, np.array([[2.0, 0.5]], np.float32), gamma=0.5,
                             gae_lambda=0.5, rho_clip=1.5, c_clip=0.25)
    np.testing.assert_allclose(got, [[1.5 + 0.0625 * 1.5, 1.5]], rtol=1e-6)
    # a done on the last transition: delta1 = 3 - 2 = 1 ; A0 = 1 + 0.25*1 = 1.25
    dones[0, 2] = 1.0
    got = compute_advantages(values, rewards, dones, ratios, gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose(got, [[1.25, 1.0]], rtol=1e-6)


def test_output_type_follows_input_and_inputs_untouched():
    rng = np.random.default_rng(5)
    inputs = random_inputs(rng, 3, 4)
    copies = [x.copy() for x in inputs]
    out = compute_advantages(*inputs, gamma=0.99, gae_lambda=0.95)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    for a, b in zip(inputs, copies):
        np.testing.assert_array_equal(a, b)
    # float64 / bool torch inputs are accepted and give a float32 tensor
    t_in = [torch.from_numpy(x.astype(np.float64)) for x in inputs]
    t_in[2] = t_in[2].bool()
    out_t = compute_advantages(*t_in, gamma=0.99, gae_lambda=0.95)
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.float32
    np.testing.assert_allclose(out_t.numpy(), reference_gae(*inputs, gamma=0.99, gae_lambda=0.95),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, horizon", [(1, 1), (4, 9), (16, 64)])
@pytest.mark.parametrize("rho_clip, c_clip", CLIPS)
def test_torch_device_path_on_cpu(rows, horizon, rho_clip, c_clip):
    rng = np.random.default_rng(7 + rows)
    values, rewards, dones, ratios = random_inputs(rng, rows, horizon, done_p=0.25)
    dones[:, -1] = 1.0
    expected = reference_gae(values, rewards, dones, ratios, gamma=0.977, gae_lambda=0.916,
                             rho_clip=rho_clip, c_clip=c_clip)
    got = _gae_torch(*(torch.from_numpy(x) for x in (values, rewards, dones, ratios)), 0.977, 0.916,
                     rho_clip, c_clip)
    assert isinstance(got, torch.Tensor) and got.shape == (rows, horizon)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_path_matches_reference():
    rng = np.random.default_rng(8)
    inputs = random_inputs(rng, 32, 16)
    got = compute_advantages(*(torch.from_numpy(x).cuda() for x in inputs), gamma=0.99, gae_lambda=0.95,
                             rho_clip=2.0, c_clip=0.5)
    assert got.device.type == "cuda"
    np.testing.assert_allclose(got.cpu().numpy(), reference_gae(*inputs, gamma=0.99, gae_lambda=0.95,
                                                                rho_clip=2.0, c_clip=0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes, name", [
    (((3,), (3,), (3,), (2,)), "values"),
    (((3, 1), (3, 1), (3, 1), (3, 0)), "values"),
    (((3, 5), (3, 4), (3, 5), (3, 4)), "rewards"),
    (((3, 5), (3, 5), (2, 5), (3, 4)), "dones"),
    (((3, 5), (3, 5), (3, 5), (3, 5)), "ratios"),
    (((3, 5), (3, 5), (3, 5), (4, 4)), "ratios"),
])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_shape_errors_name_the_argument(shapes, name, kind):
    arrays = [np.zeros(s, np.float32) for s in shapes]
    if kind == "torch":
        arrays = [torch.from_numpy(a) for a in arrays]
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        compute_advantages(*arrays, gamma=0.99, gae_lambda=0.95)
