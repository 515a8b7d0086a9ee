"""The first-layer saturation health metric (learner/update/input_health.py) against a NumPy recomputation, and its warning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from learner.update.input_health import FROZEN_STD, SaturationMonitor, batch_frozen_fraction, frozen_fraction
from policies.factory import make_policy

FLAT = EnvSpec(num_agents=1, obs_shape=(6,), obs_dtype="float32", action=ActionSpace.discrete(3))
GRID = EnvSpec(num_agents=1, obs_shape=(2, 5, 5), obs_dtype="uint8", action=ActionSpace.discrete(3),
               image_layout="chw")
MODEL = ModelSection(hidden_size=32, num_layers=1, encoder="mlp")


def rows(spec: EnvSpec, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return obs, torch.zeros(obs.shape[:2]), torch.zeros(obs.shape[0], 0)


def numpy_frozen(policy: torch.nn.Module, obs: np.ndarray) -> float:
    """tanh(x W^T + b) of the torso's first layer in NumPy, and the share of its units whose std is below FROZEN_STD."""
    first = policy.torso[0]
    weight, bias = first.weight.detach().numpy().astype(np.float64), first.bias.detach().numpy().astype(np.float64)
    activations = np.tanh(obs.reshape(-1, obs.shape[-1]).astype(np.float64) @ weight.T + bias)
    return float(np.mean(activations.std(axis=0, ddof=1) < FROZEN_STD))


@pytest.mark.parametrize(("offset", "scale"), [(0.0, 1.0), (3.0, 0.1), (20.0, 0.05), (100.0, 0.01)])
def test_mlp_fraction_matches_numpy(offset, scale):
    torch.manual_seed(0)
    policy = make_policy(FLAT, MODEL)
    obs = offset + np.random.default_rng(1).normal(size=(8, 5, 6)).astype(np.float32) * scale
    obs[..., :3] = 0.5  # half the inputs constant
    fraction = frozen_fraction(policy, *rows(FLAT, torch.from_numpy(obs)))
    assert fraction == pytest.approx(numpy_frozen(policy, obs), abs=1 / 32 + 1e-9)  # one unit at the boundary


def test_healthy_inputs_freeze_nothing_and_saturating_ones_most():
    torch.manual_seed(0)
    policy = make_policy(FLAT, MODEL)
    obs = torch.randn(8, 5, 6)
    assert frozen_fraction(policy, *rows(FLAT, obs)) == 0.0
    assert frozen_fraction(policy, *rows(FLAT, 1e3 + obs * 1e-2)) > 0.9  # inputs far out: tanh units pinned at +-1
    assert frozen_fraction(policy, *rows(FLAT, torch.full((8, 5, 6), 3.0))) == 1.0  # a constant input


def test_cnn_dead_relus_are_frozen():
    torch.manual_seed(0)
    policy = make_policy(GRID, ModelSection(hidden_size=16, num_layers=1, encoder="cnn", cnn_channels=[4]))
    obs = torch.randint(0, 3, (4, 3, 2, 5, 5), dtype=torch.uint8)
    assert frozen_fraction(policy, *rows(GRID, obs)) < 0.5
    conv = next(module for module in policy.modules() if isinstance(module, torch.nn.Conv2d))
    with torch.no_grad():
        conv.bias.fill_(-100.0)  # no input can make these ReLUs fire
    assert frozen_fraction(policy, *rows(GRID, obs)) == 1.0


def test_batch_fraction_reads_the_first_rows_without_the_bootstrap_step():
    torch.manual_seed(0)
    policy = make_policy(FLAT, MODEL)
    obs = torch.randn(40, 5, 6)
    obs[:, -1] = 1e6  # the bootstrap step would saturate everything if it were read
    obs[32:] = 1e6  # and so would the rows past the sample
    states = torch.zeros(40, 0)
    assert batch_frozen_fraction(policy, obs, torch.zeros(40, 5), states) == 0.0


def test_no_activation_or_one_observation_gives_none():
    policy = torch.nn.Linear(6, 3)
    policy.forward_rows = lambda obs, dones, states: policy(obs)
    assert frozen_fraction(policy, *rows(FLAT, torch.randn(2, 3, 6))) is None
    assert frozen_fraction(make_policy(FLAT, MODEL), *rows(FLAT, torch.randn(1, 1, 6))) is None


def test_monitor_warns_once_per_stall_and_again_after_recovery():
    monitor = SaturationMonitor(threshold=0.5, patience=3)
    lines = [monitor.observe(fraction).warning for fraction in (0.9, 0.9, 0.95, 0.9, 0.9)]
    assert [line is not None for line in lines] == [False, False, True, False, False]
    assert "95% of the first layer's activations have not varied" in lines[2] and "for 3 updates" in lines[2]
    assert monitor.observe(0.1).high_streak == 0  # recovered
    assert monitor.observe(None).high_streak == 0  # not measured: the streak breaks
    lines = [monitor.observe(0.8).warning for _ in range(3)]
    assert lines[-1] is not None and lines[0] is None
