"""The NumPy twin of small MLP policies on an actor host (actors/small_mlp.py): used exactly where it computes the
torch module's function (the eligibility rules), params and values equal to the module's (with obs_norm, box heads and
LSTM cells, whose next states too), draws distributed as the masked categorical or the box's Gaussian with the
module's log-probs, and ``Inference`` running it, following weight loads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actors.inference import Inference
from actors.small_mlp import SmallMLP
from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from policies.factory import make_policy, state_arrays

FLAT = EnvSpec(num_agents=1, obs_shape=(5,), obs_dtype="float32", action=ActionSpace.discrete(3))
BYTES = EnvSpec(num_agents=1, obs_shape=(2, 4), obs_dtype="uint8", action=ActionSpace.multi_discrete((3, 2, 4)),
                action_mask=True)
BOX = EnvSpec(num_agents=1, obs_shape=(5,), obs_dtype="float32", action=ActionSpace.box([-1.0, -1.0], [1.0, 1.0]))
IMAGE = EnvSpec(num_agents=1, obs_shape=(2, 5, 5), obs_dtype="uint8", action=ActionSpace.discrete(3),
                image_layout="chw")
MLP = ModelSection(hidden_size=16, num_layers=2)
NORM = ModelSection(hidden_size=16, num_layers=2, obs_norm=True)


def with_statistics(policy: torch.nn.Module, seed: int) -> None:
    """Running observation statistics of a trained-looking size (the initial ones are the identity)."""
    stats = policy.encoder.obs_norm.stats
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        stats.mean.copy_(torch.randn(stats.mean.shape, generator=generator, dtype=torch.float64))
        stats.var.copy_(torch.rand(stats.var.shape, generator=generator, dtype=torch.float64) * 4 + 0.01)
        stats.count.fill_(1000.0)


def random_weights(policy: torch.nn.Module, seed: int) -> None:
    """Weights of a trained-looking size (the initial heads are nearly zero, which would hide errors)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.7)


def loaded_twin(spec: EnvSpec, model: ModelSection, *, seed: int, weights_seed: int,
                version: int) -> tuple[Inference, torch.nn.Module]:
    """An ``Inference`` running the twin, loaded with the weights (and observation statistics, with obs_norm) of a
    module of random weights, and that module."""
    inference = Inference(spec, model, seed=seed)
    assert inference.small is not None
    trained = make_policy(spec, model)
    random_weights(trained, weights_seed)
    if model.obs_norm:
        with_statistics(trained, weights_seed + 1)
    inference.load(version, state_arrays(trained))
    return inference, trained


def observations(spec: EnvSpec, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.obs_dtype == "uint8":
        return rng.integers(0, 256, (n, *spec.obs_shape)).astype(np.uint8)
    return (rng.standard_normal((n, *spec.obs_shape)) * 2).astype(np.float32)


@pytest.mark.parametrize(("spec", "model", "eligible"), [
    (FLAT, MLP, True),
    (BYTES, MLP, True),
    (FLAT, ModelSection(hidden_size=8, num_layers=0), True),
    (FLAT, ModelSection(hidden_size=8, num_layers=3, shared_torso=True), True),
    (FLAT, ModelSection(hidden_size=8, num_layers=2, obs_norm=True), True),
    (BOX, MLP, True),
    (FLAT, ModelSection(hidden_size=8, num_layers=1, core="lstm"), True),
    (BOX, ModelSection(hidden_size=8, num_layers=0, core="lstm", obs_norm=True), True),
    (IMAGE, ModelSection(hidden_size=8, num_layers=1), False),  # a CNN encoder
])
def test_the_twin_stands_in_only_for_what_it_computes(spec: EnvSpec, model: ModelSection, eligible: bool) -> None:
    assert (SmallMLP.of(make_policy(spec, model), seed=0) is not None) == eligible


@pytest.mark.parametrize("spec", [FLAT, BYTES, BOX])
@pytest.mark.parametrize("model", [MLP, ModelSection(hidden_size=8, num_layers=0),
                                   ModelSection(hidden_size=12, num_layers=3, shared_torso=True), NORM])
def test_params_and_values_match_the_torch_module(spec: EnvSpec, model: ModelSection) -> None:
    policy = make_policy(spec, model)
    random_weights(policy, 1)
    if model.obs_norm:
        with_statistics(policy, 4)
    obs = observations(spec, 37, 2)
    logits, values, states = SmallMLP.of(policy, seed=0).step(obs, np.zeros((37, 0), np.float32))
    assert states.shape == (37, 0)
    with torch.no_grad():
        want_logits, want_values = policy(torch.from_numpy(obs))
    assert logits.dtype == np.float32 and values.dtype == np.float32 and values.shape == (37,)
    np.testing.assert_allclose(logits, want_logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, want_values.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [FLAT, BYTES, BOX])
@pytest.mark.parametrize("model", [ModelSection(hidden_size=16, num_layers=1, core="lstm"),
                                   ModelSection(hidden_size=8, num_layers=0, core="lstm", obs_norm=True)])
def test_lstm_steps_match_the_torch_module_from_any_state(spec: EnvSpec, model: ModelSection) -> None:
    policy = make_policy(spec, model)
    random_weights(policy, 6)
    if model.obs_norm:
        with_statistics(policy, 7)
    twin = SmallMLP.of(policy, seed=0)
    assert twin.state_size == policy.state_size
    states = (np.random.default_rng(8).standard_normal((29, policy.state_size)) * 1.5).astype(np.float32)
    states[:5] = 0.0  # agents whose episode just began
    for t in range(3):  # the twin's states fed back, as the host does
        obs = observations(spec, 29, 9 + t)
        params, values, next_states = twin.step(obs, states)
        with torch.no_grad():
            want_params, want_values, want_states = policy.step(torch.from_numpy(obs), torch.from_numpy(states))
        np.testing.assert_allclose(params, want_params.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(values, want_values.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(next_states, want_states.numpy(), rtol=1e-5, atol=1e-5)
        assert next_states.dtype == np.float32 and next_states.shape == states.shape
        states = next_states


def test_draws_follow_the_masked_softmax_with_the_modules_log_probs() -> None:
    policy = make_policy(BYTES, MLP)
    twin = SmallMLP.of(policy, seed=3)
    n = 40000
    logits = np.tile(np.array([[0.5, -1.0, 2.0, 0.3, -0.3, 1.0, 0.0, -2.0, 0.7]], dtype=np.float32), (n, 1))
    masks = np.tile(np.array([[1, 1, 0, 1, 1, 0, 0, 0, 0]], dtype=np.uint8), (n, 1))  # the last component: none legal
    actions, logprobs = twin.draw(logits, masks)
    assert actions.dtype == np.int32 and actions.shape == (n, 3) and logprobs.dtype == np.float32

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max())
        return e / e.sum()

    for component, (columns, legal) in enumerate(((slice(0, 3), [0, 1]), (slice(3, 5), [0, 1]),
                                                  (slice(5, 9), [0, 1, 2, 3]))):
        want = np.zeros(logits.shape[1] and columns.stop - columns.start)
        want[legal] = softmax(logits[0, columns][legal].astype(np.float64))
        freq = np.bincount(actions[:, component], minlength=len(want)) / n
        np.testing.assert_allclose(freq, want, atol=0.01)
        assert set(np.unique(actions[:, component])) <= set(legal)
    want_logprobs = policy.distribution.log_prob(torch.from_numpy(logits), torch.from_numpy(masks),
                                                 torch.from_numpy(actions.astype(np.int64)))
    np.testing.assert_allclose(logprobs, want_logprobs.numpy(), rtol=1e-5, atol=1e-5)
    unmasked_actions, unmasked_logprobs = twin.draw(logits[:100], None)
    want_unmasked = policy.distribution.log_prob(torch.from_numpy(logits[:100]), None,
                                                 torch.from_numpy(unmasked_actions.astype(np.int64)))
    np.testing.assert_allclose(unmasked_logprobs, want_unmasked.numpy(), rtol=1e-5, atol=1e-5)


def test_box_draws_are_the_gaussian_with_the_modules_log_probs() -> None:
    policy = make_policy(BOX, MLP)
    twin = SmallMLP.of(policy, seed=9)
    n = 40000
    params = np.tile(np.array([[0.5, -2.0, -0.7, 0.4]], dtype=np.float32), (n, 1))  # means, then log-stds
    actions, logprobs = twin.draw(params, None)
    assert actions.dtype == np.float32 and actions.shape == (n, 2) and logprobs.dtype == np.float32
    std = np.exp(params[0, 2:])
    assert (np.abs(actions.mean(axis=0) - params[0, :2]) < 4 * std / np.sqrt(n)).all()
    np.testing.assert_allclose(actions.std(axis=0), std, rtol=0.02)
    z = (actions - params[0, :2]) / std
    assert np.abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 0.03  # independent dimensions
    for edge in (-1.0, 0.0, 1.0):  # the normal's CDF, not only its moments
        np.testing.assert_allclose((z[:, 0] < edge).mean(), 0.5 * (1 + math.erf(edge / math.sqrt(2))), atol=0.01)
    want = policy.distribution.log_prob(torch.from_numpy(params), None, torch.from_numpy(actions))
    np.testing.assert_allclose(logprobs, want.numpy(), rtol=1e-5, atol=1e-5)


def test_inference_runs_the_box_and_normalising_twin_and_follows_loaded_weights() -> None:
    inference, trained = loaded_twin(BOX, NORM, seed=2, weights_seed=3, version=1)
    obs = observations(BOX, 30, 5)
    decisions = inference.decide(obs, np.zeros((30, 0), dtype=np.float32), None)
    with torch.no_grad():
        want_params, want_values = trained(torch.from_numpy(obs))
    assert decisions.actions.shape == (30, 2) and decisions.actions.dtype == np.float32
    np.testing.assert_allclose(decisions.values, want_values.numpy(), rtol=1e-5, atol=1e-5)
    want_logprobs = trained.distribution.log_prob(want_params, None, torch.from_numpy(decisions.actions))
    np.testing.assert_allclose(decisions.logprobs, want_logprobs.numpy(), rtol=1e-5, atol=1e-5)


def test_inference_runs_the_lstm_twin_with_each_agents_state() -> None:
    model = ModelSection(hidden_size=8, num_layers=1, core="lstm")
    inference, trained = loaded_twin(BYTES, model, seed=4, weights_seed=5, version=2)
    assert inference.state_size == 16
    obs = observations(BYTES, 20, 6)
    states = np.random.default_rng(7).standard_normal((20, 16)).astype(np.float32)
    masks = np.ones((20, 9), dtype=np.uint8)
    decisions = inference.decide(obs, states, masks)
    with torch.no_grad():
        want_params, want_values, want_states = trained.step(torch.from_numpy(obs), torch.from_numpy(states))
    np.testing.assert_allclose(decisions.states, want_states.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decisions.values, want_values.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inference.values(obs, states), want_values.numpy(), rtol=1e-5, atol=1e-5)
    want_logprobs = trained.distribution.log_prob(want_params, None, torch.from_numpy(decisions.actions).long())
    np.testing.assert_allclose(decisions.logprobs, want_logprobs.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"states shape \(20, 0\) != \(20, 16\)"):
        inference.values(obs, np.zeros((20, 0), np.float32))


def test_inference_runs_the_twin_and_follows_loaded_weights() -> None:
    torch.manual_seed(0)
    inference, trained = loaded_twin(FLAT, MLP, seed=5, weights_seed=7, version=3)
    obs = observations(FLAT, 50, 8)
    decisions = inference.decide(obs, np.zeros((50, 0), dtype=np.float32), None)
    with torch.no_grad():
        want_logits, want_values = trained(torch.from_numpy(obs))
    assert inference.version == 3 and decisions.actions.shape == (50,) and decisions.states.shape == (50, 0)
    np.testing.assert_allclose(decisions.values, want_values.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inference.values(obs, np.zeros((50, 0), np.float32)), want_values.numpy(),
                               rtol=1e-5, atol=1e-5)
    want_logprobs = trained.distribution.log_prob(want_logits, None, torch.from_numpy(decisions.actions).long())
    np.testing.assert_allclose(decisions.logprobs, want_logprobs.numpy(), rtol=1e-5, atol=1e-5)
    again = Inference(FLAT, MLP, seed=5)
    again.load(3, state_arrays(trained))
    assert np.array_equal(again.decide(obs, np.zeros((50, 0), np.float32)).actions, decisions.actions)  # seeded
    with pytest.raises(ValueError, match=r"states shape \(50, 2\) != \(50, 0\)"):
        inference.decide(obs, np.zeros((50, 2), np.float32))


def test_non_finite_outputs_are_refused() -> None:
    twin = SmallMLP.of(make_policy(FLAT, MLP), seed=0)
    logits = np.zeros((4, 3), dtype=np.float32)
    logits[2, 1] = np.nan
    with pytest.raises(ValueError, match="the policy's outputs hold 1 non-finite values"):
        twin.draw(logits, None)
    box = SmallMLP.of(make_policy(BOX, MLP), seed=0)
    with pytest.raises(ValueError, match="the policy's outputs hold 2 non-finite values"):
        box.draw(np.array([[0.0, np.inf, 0.0, -np.inf]], dtype=np.float32), None)
