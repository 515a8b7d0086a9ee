"""The tanh-squashed Gaussian (policies/tanh_gaussian.py) and COMA's networks against independent NumPy formulas:
log-prob by the change of variables (1 - tanh(u)^2 = 1 / cosh(u)^2, in float64, which loses no precision where
tanh(u) rounds to 1), near the bounds (|u| up to 20), against a histogram of samples and a finite-difference Jacobian of the inverse map; sampling
inside the Box; mode; entropy; the actor and critic shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.coma.critic import CentralCritic
from policies import tanh_gaussian
from policies.gaussian_actor import GaussianActor


def np_normal_log_pdf(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)


def np_log_prob(mean, log_std, u, low, high) -> np.ndarray:
    """Change of variables u -> tanh(u) -> affine, in float64; log(1 - tanh(u)^2) = -2 log cosh(u)."""
    std = np.exp(np.clip(log_std, -20.0, 2.0))
    tanh_jacobian = -2.0 * np.log(np.cosh(u))
    affine_jacobian = np.log((high - low) / 2.0)
    return (np_normal_log_pdf(u, mean, std) - tanh_jacobian - affine_jacobian).sum(-1)


def random_box(rng: np.random.Generator, dims: int) -> tuple[np.ndarray, np.ndarray]:
    low = rng.uniform(-3.0, 1.0, dims)
    return low, low + rng.uniform(0.1, 4.0, dims)


def t64(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dims=st.integers(1, 5), scale=st.sampled_from([0.1, 1.0, 5.0, 15.0]))
def test_log_prob_matches_numpy_change_of_variables(seed, dims, scale):
    rng = np.random.default_rng(seed)
    mean, log_std = rng.normal(0, 2, (16, dims)), rng.uniform(-4, 3, (16, dims))
    u = rng.normal(0, scale, (16, dims))
    low, high = random_box(rng, dims)
    got = tanh_gaussian.log_prob(t64(mean), t64(log_std), t64(u), t64(low), t64(high)).numpy()
    np.testing.assert_allclose(got, np_log_prob(mean, log_std, u, low, high), rtol=1e-9, atol=1e-7)


def test_log_one_minus_tanh_squared_stable_form_and_its_asymptote():
    u = np.linspace(-20, 20, 1001)
    got = tanh_gaussian.log_one_minus_tanh_squared(t64(u)).numpy()
    np.testing.assert_allclose(got, -2.0 * np.log(np.cosh(u)), rtol=1e-12, atol=1e-12)
    small = np.linspace(-3, 3, 101)  # where the textbook form is still accurate
    np.testing.assert_allclose(tanh_gaussian.log_one_minus_tanh_squared(t64(small)).numpy(),
                               np.log(1.0 - np.tanh(small) ** 2), rtol=1e-10, atol=1e-12)
    far = np.array([-100.0, -40.0, 40.0, 100.0])  # 1 - tanh^2 = 4 e^{-2|u|} (1 + O(e^{-2|u|}))
    np.testing.assert_allclose(tanh_gaussian.log_one_minus_tanh_squared(t64(far)).numpy(),
                               np.log(4.0) - 2.0 * np.abs(far), rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_near_the_bounds_is_finite_and_matches_numpy(dtype):
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.uniform(10, 20, (64, 2)), -rng.uniform(10, 20, (64, 2))])
    mean, log_std = rng.normal(0, 1, u.shape), rng.uniform(-1, 2, u.shape)
    low, high = np.array([-1.0, 0.0]), np.array([1.0, 2.5])
    args = [torch.as_tensor(x, dtype=dtype) for x in (mean, log_std, u, low, high)]
    got = tanh_gaussian.log_prob(*args).double().numpy()
    assert np.isfinite(got).all()
    expected = np_log_prob(mean, log_std, u, low, high)
    asymptote = (np_normal_log_pdf(u, mean, np.exp(log_std)) - (np.log(4.0) - 2.0 * np.abs(u))
                 - np.log((high - low) / 2)).sum(-1)  # 1 - tanh(u)^2 ~ 4 exp(-2|u|) for large |u|
    np.testing.assert_allclose(expected, asymptote, rtol=1e-6)
    if dtype == torch.float32:  # a sum of terms of size ~100: float32 rounding
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-10)
    actions = tanh_gaussian.squash(args[2], args[3], args[4]).numpy()
    assert (actions >= low).all() and (actions <= high).all()


def test_log_prob_agrees_with_finite_difference_jacobian_of_the_inverse_map():
    """p_a(a) = p_u(g(a)) |g'(a)| with g the inverse of the squash, g' by central differences."""
    rng = np.random.default_rng(7)
    low, high, mean, std = -0.5, 2.0, 0.3, 0.8
    actions = rng.uniform(low + 0.01, high - 0.01, 200)

    def inverse(a):
        return np.arctanh(2.0 * (a - low) / (high - low) - 1.0)

    step = 1e-6
    derivative = (inverse(actions + step) - inverse(actions - step)) / (2 * step)
    expected = np_normal_log_pdf(inverse(actions), mean, std) + np.log(derivative)
    got = tanh_gaussian.log_prob(t64(np.full((200, 1), mean)), t64(np.full((200, 1), math.log(std))),
                                 t64(inverse(actions)[:, None]), t64([low]), t64([high])).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_log_prob_is_the_density_of_sampled_actions_by_histogram():
    low, high = torch.tensor([-2.0]), torch.tensor([3.0])
    mean, log_std = torch.full((400_000, 1), 0.4), torch.full((400_000, 1), math.log(0.9))
    _, actions, _ = tanh_gaussian.sample(mean, log_std, low, high, torch.Generator().manual_seed(0))
    counts, edges = np.histogram(actions.numpy()[:, 0], bins=50, range=(-2.0, 3.0))
    points_per_bin = 200  # midpoint rule inside each bin: the bin probability implied by exp(log_prob)
    width = (edges[1] - edges[0]) / points_per_bin
    grid = -2.0 + width * (np.arange(50 * points_per_bin) + 0.5)
    u = torch.atanh(t64(2.0 * (grid + 2.0) / 5.0 - 1.0))[:, None]
    size = len(grid)
    density = tanh_gaussian.log_prob(torch.full((size, 1), 0.4, dtype=torch.float64),
                                     torch.full((size, 1), math.log(0.9), dtype=torch.float64), u, low.double(),
                                     high.double()).exp().numpy()
    bin_probability = density.reshape(50, points_per_bin).sum(-1) * width
    assert abs(bin_probability.sum() - 1.0) < 1e-3  # it is a density on [low, high]
    expected = bin_probability * len(actions)
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 100.0  # 49 degrees of freedom: p < 1e-4 above 100
    assert np.abs(counts / len(actions) - bin_probability).max() < 0.003


def test_sample_stays_in_the_box_and_returns_its_own_log_prob():
    rng = np.random.default_rng(11)
    low, high = (torch.as_tensor(x, dtype=torch.float32) for x in random_box(rng, 3))
    mean = torch.as_tensor(rng.normal(0, 10, (1000, 3)), dtype=torch.float32)
    log_std = torch.as_tensor(rng.uniform(-25, 5, (1000, 3)), dtype=torch.float32)
    u, actions, logp = tanh_gaussian.sample(mean, log_std, low, high, torch.Generator().manual_seed(1))
    assert u.shape == actions.shape == (1000, 3) and logp.shape == (1000,)
    assert (actions >= low).all() and (actions <= high).all()
    assert torch.isfinite(logp).all()
    torch.testing.assert_close(logp, tanh_gaussian.log_prob(mean, log_std, u, low, high))
    std = np.exp(np.clip(log_std.numpy(), -20, 2))  # the clamp: u - mean is within 6 clamped stds
    assert (np.abs(u.numpy() - mean.numpy()) <= 6 * std + 1e-6).all()


def test_sample_is_reproducible_with_a_generator_and_reparameterised():
    mean = torch.zeros(4, 2, requires_grad=True)
    log_std = torch.zeros(4, 2, requires_grad=True)
    low, high = -torch.ones(2), torch.ones(2)
    first = tanh_gaussian.sample(mean, log_std, low, high, torch.Generator().manual_seed(5))
    second = tanh_gaussian.sample(mean, log_std, low, high, torch.Generator().manual_seed(5))
    torch.testing.assert_close(first[1], second[1])
    first[1].sum().backward()
    assert mean.grad is not None and mean.grad.abs().sum() > 0 and log_std.grad.abs().sum() > 0


def test_mode_is_the_squashed_mean():
    rng = np.random.default_rng(2)
    mean = rng.normal(0, 3, (20, 4))
    low, high = random_box(rng, 4)
    expected = low + (np.tanh(mean) + 1.0) * (high - low) / 2.0
    np.testing.assert_allclose(tanh_gaussian.mode(t64(mean), t64(low), t64(high)).numpy(), expected, rtol=1e-12)
    assert (tanh_gaussian.mode(t64(np.full((1, 4), 50.0)), t64(low), t64(high)).numpy() == high).all()


def test_gaussian_entropy_matches_numpy_and_log_std_is_clamped():
    log_std = np.array([[-30.0, -1.0, 0.5, 4.0]])
    expected = (np.clip(log_std, -20, 2) + 0.5 * (1 + np.log(2 * np.pi))).sum(-1)
    np.testing.assert_allclose(tanh_gaussian.gaussian_entropy(t64(log_std)).numpy(), expected, rtol=1e-12)
    assert tanh_gaussian.LOG_STD_MIN == -20.0 and tanh_gaussian.LOG_STD_MAX == 2.0


@pytest.mark.parametrize(("low", "high", "words"), [
    ([-1.0, 0.0], [1.0], "shape"),
    ([-np.inf], [1.0], "finite"),
    ([1.0], [1.0], "high > low"),
])
def test_box_bounds_errors_name_the_problem(low, high, words):
    with pytest.raises(ValueError, match=words):
        tanh_gaussian.check_box_bounds(t64(low), t64(high))
    tanh_gaussian.check_box_bounds(t64([-1.0, 0.0]), t64([1.0, 0.5]))


def test_gaussian_actor_and_central_critic_shapes():
    actor = GaussianActor(obs_dim=18, action_dim=5)
    widths = [m.out_features for m in actor.net if isinstance(m, torch.nn.Linear)]
    assert widths == [256, 256, 10] and any(isinstance(m, torch.nn.ReLU) for m in actor.net)
    mean, log_std = actor(torch.randn(7, 3, 18) * 1e3)
    assert mean.shape == log_std.shape == (7, 3, 5)
    assert log_std.min() >= tanh_gaussian.LOG_STD_MIN and log_std.max() <= tanh_gaussian.LOG_STD_MAX
    critic = CentralCritic(state_dim=20, joint_action_dim=15, num_agents=3, hidden=[32, 16])
    assert critic(torch.randn(9, 20), torch.randn(9, 15)).shape == (9, 3)
    with pytest.raises(ValueError, match="hidden width"):
        GaussianActor(obs_dim=4, action_dim=2, hidden=[0])
    with pytest.raises(ValueError, match="num_agents"):
        CentralCritic(state_dim=4, joint_action_dim=2, num_agents=0)
