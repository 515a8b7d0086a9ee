"""The LSTM policy core: unrolling, resets, BPTT gradients, recorded row states, and the unchanged MLP path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.assembler import RowAssembler
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from actors.inference import Inference
from configs.schema import ModelSection
from policies.lstm import LSTMPolicy
from policies.factory import load_state_arrays, make_policy, state_arrays
from policies.mlp import MLPPolicy

SPEC = EnvSpec(num_agents=1, obs_shape=(2, 3), obs_dtype="float32", action=ActionSpace.discrete(3))
LSTM = ModelSection(hidden_size=8, num_layers=2, core="lstm")


def lstm(seed: int = 0, model: ModelSection = LSTM) -> LSTMPolicy:
    torch.manual_seed(seed)
    policy = make_policy(SPEC, model)
    assert isinstance(policy, LSTMPolicy)
    return policy


def random_rows(rng: np.random.Generator, policy: LSTMPolicy, rows: int, steps: int):
    obs = torch.from_numpy(rng.standard_normal((rows, steps, *SPEC.obs_shape)).astype(np.float32))
    state0 = torch.from_numpy(rng.standard_normal((rows, policy.state_size)).astype(np.float32))
    return obs, state0


# (a) forward_rows == sequential step() calls with the resets done by hand ---------------------------------

def test_forward_rows_matches_sequential_steps_with_resets() -> None:
    policy = lstm()
    rng = np.random.default_rng(0)
    S, T = 6, 7
    obs, state0 = random_rows(rng, policy, S, T)
    dones = torch.zeros(S, T)
    dones[0, 3] = 1.0  # mid-row
    dones[1, 0] = 1.0  # at step 0
    dones[2, T - 1] = 1.0  # at the last step
    dones[3, 2] = dones[3, 4] = 1.0  # twice
    dones[4] = 1.0  # every step
    with torch.no_grad():
        logits, values = policy.forward_rows(obs, dones, state0)
        assert logits.shape == (S, T, SPEC.num_actions) and values.shape == (S, T)
        state = state0.clone()
        for t in range(T):
            state[dones[:, t] == 1] = 0.0
            step_logits, step_values, state = policy.step(obs[:, t], state)
            torch.testing.assert_close(logits[:, t], step_logits, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(values[:, t], step_values, rtol=1e-6, atol=1e-6)
        # the resets mattered: without them the rows that had a done come out differently
        no_reset, _ = policy.forward_rows(obs, torch.zeros(S, T), state0)
    assert not torch.allclose(no_reset[:5, -1], logits[:5, -1])
    torch.testing.assert_close(no_reset[5], logits[5])


# (b) no dones: an independent NumPy LSTM (i, f, g, o gates) from the module's weights -----------------------

def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def numpy_unroll(policy: LSTMPolicy, obs: np.ndarray, state0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """logits [S, T, A], values [S, T] in float64, from the weights alone."""
    w = {k: v.detach().numpy().astype(np.float64) for k, v in policy.state_dict().items()}
    S, T = obs.shape[:2]
    x = obs.reshape(S, T, -1).astype(np.float64)
    for i in (0, 2):  # torso: Linear, Tanh, Linear, Tanh
        x = np.tanh(x @ w[f"torso.{i}.weight"].T + w[f"torso.{i}.bias"])
    H = policy.hidden_size
    h, c = state0[:, :H].astype(np.float64), state0[:, H:].astype(np.float64)
    hs = []
    for t in range(T):
        z = (x[:, t] @ w["cell.weight_ih"].T + w["cell.bias_ih"] + h @ w["cell.weight_hh"].T + w["cell.bias_hh"])
        i, f, g, o = z[:, :H], z[:, H:2 * H], z[:, 2 * H:3 * H], z[:, 3 * H:]
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
    hidden = np.stack(hs, axis=1)
    logits = hidden @ w["actor.linear.weight"].T + w["actor.linear.bias"]
    values = (hidden @ w["critic.weight"].T + w["critic.bias"])[..., 0]
    return logits, values


def test_forward_rows_without_dones_is_a_plain_lstm_unroll() -> None:
    policy = lstm(seed=3)
    with torch.no_grad():  # non-zero biases so every term of the gates is exercised
        for p in (policy.cell.bias_ih, policy.cell.bias_hh, policy.actor.linear.weight, policy.critic.bias):
            p.normal_(0.0, 0.5)
    rng = np.random.default_rng(1)
    obs, state0 = random_rows(rng, policy, 5, 9)
    with torch.no_grad():
        logits, values = policy.forward_rows(obs, torch.zeros(5, 9), state0)
    want_logits, want_values = numpy_unroll(policy, obs.numpy(), state0.numpy())
    np.testing.assert_allclose(logits.numpy(), want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values.numpy(), want_values, rtol=1e-5, atol=1e-5)
    # the final state of step() agrees with the unroll too
    state = state0
    with torch.no_grad():
        for t in range(9):
            _, _, state = policy.step(obs[:, t], state)
    H = policy.hidden_size
    h_last = state[:, :H].numpy()
    w = policy.actor.linear
    np.testing.assert_allclose(h_last @ w.weight.detach().numpy().T + w.bias.detach().numpy(),
                               want_logits[:, -1], rtol=1e-5, atol=1e-5)


# (c) gradients flow through time inside a row, and stop at an episode start ---------------------------------

@pytest.mark.parametrize("done_at", [None, 1, 5])
def test_gradient_through_time_stops_at_dones(done_at: int | None) -> None:
    policy = lstm(seed=5)
    rng = np.random.default_rng(2)
    S, T = 3, 6
    obs, state0 = random_rows(rng, policy, S, T)
    obs.requires_grad_(True)
    state0.requires_grad_(True)
    dones = torch.zeros(S, T)
    if done_at is not None:
        dones[:, done_at] = 1.0
    logits, values = policy.forward_rows(obs, dones, state0)
    (logits[:, T - 1].sum() + values[:, T - 1].sum()).backward()
    grad_first = obs.grad[:, 0].abs().sum(dim=(1, 2))
    grad_last = obs.grad[:, T - 1].abs().sum(dim=(1, 2))
    assert (grad_last > 0).all()
    if done_at is None:
        assert (grad_first > 0).all()
        assert (state0.grad.abs().sum(dim=1) > 0).all()
    else:
        assert (grad_first == 0).all()
        assert (state0.grad == 0).all()
        assert (obs.grad[:, done_at].abs().sum(dim=(1, 2)) > 0).all()  # the new episode's first step counts


# (d) the assembler keeps the state each row started from -----------------------------------------------------

def test_assembler_records_state_in_at_row_starts_including_carried_step() -> None:
    horizon, state_size = 4, 3
    asm = RowAssembler(num_agents=2, num_rows=8, horizon=horizon, obs_shape=(1,), obs_dtype="float32",
                       state_size=state_size)
    # step k of agent a carries state [a, k, k] and value k
    for k in range(10):
        ids = np.array([1, 0], dtype=np.int64)
        states = np.array([[1, k, k], [0, k, k]], dtype=np.float32)
        asm.add_steps(ids, np.zeros((2, 1), np.float32), np.zeros(2), np.zeros(2), np.full(2, k), np.zeros(2),
                      np.zeros(2), np.zeros(2), version=k, states=states)
    rows = asm.pop_full(8)
    g = asm.gather(rows)
    assert len(rows) == 6  # 3 rows per agent: steps 0-3, 3-6, 6-9
    for j in range(len(rows)):
        first = int(g["values"][j, 0])
        agent = int(g["states"][j, 0])
        np.testing.assert_array_equal(g["states"][j], [agent, first, first])
    assert sorted(int(v) for v in g["values"][:, 0]) == [0, 0, 3, 3, 6, 6]  # 3 and 6 are carried-over steps
    with pytest.raises(ValueError, match="states shape"):
        asm.add_steps(np.array([0]), np.zeros((1, 1), np.float32), np.zeros(1), np.zeros(1), np.zeros(1),
                      np.zeros(1), np.zeros(1), np.zeros(1), version=0)


# (e) the MLP path is unchanged --------------------------------------------------------------------------------

def test_mlp_has_no_state_and_step_matches_forward() -> None:
    torch.manual_seed(0)
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=2))
    assert isinstance(policy, MLPPolicy) and policy.state_size == 0
    assert list(policy.state_dict()) == [
        "torso.0.weight", "torso.0.bias", "torso.2.weight", "torso.2.bias", "critic_torso.0.weight",
        "critic_torso.0.bias", "critic_torso.2.weight", "critic_torso.2.bias", "actor.linear.weight", "actor.linear.bias",
        "critic.weight", "critic.bias"]  # checkpoints of the MLP keep their names
    obs = torch.randn(4, 5, *SPEC.obs_shape)
    empty = torch.zeros(4, 0)
    with torch.no_grad():
        logits, values = policy(obs)
        rows_logits, rows_values = policy.forward_rows(obs, torch.ones(4, 5), empty)
        step_logits, step_values, state = policy.step(obs[:, 0], empty)
    torch.testing.assert_close(rows_logits, logits)
    torch.testing.assert_close(rows_values, values)
    torch.testing.assert_close(step_logits, logits[:, 0])
    torch.testing.assert_close(step_values, values[:, 0])
    assert state.shape == (4, 0)
    inference = Inference(SPEC, ModelSection(hidden_size=8, num_layers=2), seed=0)
    decisions = inference.decide(obs[:, 0].numpy(), np.zeros((4, 0), np.float32))
    assert decisions.states.shape == (4, 0) and decisions.actions.shape == (4,)
    assert inference.values(obs[:, 0].numpy(), np.zeros((4, 0), np.float32)).shape == (4,)


def test_lstm_state_size_weights_round_trip_and_inference_shapes() -> None:
    policy = lstm()
    assert policy.state_size == 2 * LSTM.hidden_size
    other = lstm(seed=9)
    load_state_arrays(other, state_arrays(policy))
    obs = torch.randn(3, 4, *SPEC.obs_shape)
    state0 = torch.randn(3, policy.state_size)
    with torch.no_grad():
        torch.testing.assert_close(other.forward_rows(obs, torch.zeros(3, 4), state0),
                                   policy.forward_rows(obs, torch.zeros(3, 4), state0))
    inference = Inference(SPEC, LSTM, seed=0)
    zeros = np.zeros((3, policy.state_size), np.float32)
    decisions = inference.decide(obs[:, 0].numpy(), zeros)
    assert decisions.states.shape == (3, policy.state_size) and decisions.states.dtype == np.float32
    assert np.abs(decisions.states).sum() > 0
    with pytest.raises(ValueError, match="states shape"):
        inference.decide(obs[:, 0].numpy(), np.zeros((3, 0), np.float32))
    no_torso = make_policy(SPEC, ModelSection(hidden_size=4, num_layers=0, core="lstm"))
    logits, values = no_torso.forward_rows(obs, torch.zeros(3, 4), torch.zeros(3, 8))
    assert logits.shape == (3, 4, SPEC.num_actions) and values.shape == (3, 4)
