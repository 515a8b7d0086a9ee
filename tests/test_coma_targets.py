"""COMA's targets (learner/coma/targets.py) against independent NumPy versions on random inputs: the counterfactual
advantage for each default-action mode (with a toy critic whose Q is a known function, so the reference is exact),
the TD target for terminated / truncated / neither / both, and the soft update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.coma.critic import CentralCritic
from learner.coma.targets import counterfactual_advantages, replace_each_agent, soft_update, td_target


class ToyCritic:
    """Q(s, u) = s Ws + u Wu + (u * u) Wq + (s M) * (u P): linear, quadratic and state-action terms; counts calls."""

    def __init__(self, rng: np.random.Generator, state_dim: int, joint_dim: int, agents: int) -> None:
        self.weights = {name: rng.normal(0, 1, shape) for name, shape in (
            ("Ws", (state_dim, agents)), ("Wu", (joint_dim, agents)), ("Wq", (joint_dim, agents)),
            ("M", (state_dim, agents)), ("P", (joint_dim, agents)))}
        self.calls = 0

    def __call__(self, state: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        w = {name: torch.as_tensor(value) for name, value in self.weights.items()}
        return state @ w["Ws"] + joint @ w["Wu"] + (joint * joint) @ w["Wq"] + (state @ w["M"]) * (joint @ w["P"])

    def numpy(self, state: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """One transition: state [S], joint [N * A] -> Q [N]."""
        w = self.weights
        return state @ w["Ws"] + joint @ w["Wu"] + (joint * joint) @ w["Wq"] + (state @ w["M"]) * (joint @ w["P"])


def np_advantages(critic: ToyCritic, state, joint, replacements) -> tuple[np.ndarray, np.ndarray]:
    """Loops: A[b, i] = Q_i(s_b, u_b) - mean_k Q_i(s_b, u_b with agent i's action = replacements[k, b, i])."""
    samples, batch, agents, _ = replacements.shape
    q = np.zeros((batch, agents))
    baseline = np.zeros((batch, agents))
    for b in range(batch):
        q[b] = critic.numpy(state[b], joint[b].reshape(-1))
        for i in range(agents):
            values = []
            for k in range(samples):
                counterfactual = joint[b].copy()
                counterfactual[i] = replacements[k, b, i]
                values.append(critic.numpy(state[b], counterfactual.reshape(-1))[i])
            baseline[b, i] = np.mean(values)
    return q - baseline, q


def random_problem(seed: int, batch: int, agents: int, action_dim: int, state_dim: int = 5):
    rng = np.random.default_rng(seed)
    critic = ToyCritic(rng, state_dim, agents * action_dim, agents)
    state = rng.normal(0, 1, (batch, state_dim))
    joint = rng.uniform(-1, 1, (batch, agents, action_dim))
    return rng, critic, state, joint


shapes = dict(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 6), agents=st.integers(1, 4),
              action_dim=st.integers(1, 3))


@settings(max_examples=30, deadline=None)
@given(**shapes, per_agent_default=st.booleans())
def test_zero_mode_replaces_each_agent_by_the_default_action(seed, batch, agents, action_dim, per_agent_default):
    rng, critic, state, joint = random_problem(seed, batch, agents, action_dim)
    default = rng.uniform(-1, 1, (agents, action_dim) if per_agent_default else (action_dim,))
    got = counterfactual_advantages(critic, torch.as_tensor(state), torch.as_tensor(joint), None,
                                    torch.as_tensor(default), mode="zero")
    replacement = np.broadcast_to(default, joint.shape)[None]
    advantages, q = np_advantages(critic, state, joint, replacement)
    np.testing.assert_allclose(got.advantages.numpy(), advantages, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.q_values.numpy(), q, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.baselines.numpy(), q - advantages, rtol=1e-10, atol=1e-10)
    assert critic.calls == 1


@settings(max_examples=30, deadline=None)
@given(**shapes)
def test_mean_mode_replaces_each_agent_by_its_own_mean_action(seed, batch, agents, action_dim):
    rng, critic, state, joint = random_problem(seed, batch, agents, action_dim)
    means = rng.uniform(-1, 1, joint.shape)
    got = counterfactual_advantages(critic, torch.as_tensor(state), torch.as_tensor(joint), torch.as_tensor(means),
                                    None, mode="mean")
    advantages, _ = np_advantages(critic, state, joint, means[None])
    np.testing.assert_allclose(got.advantages.numpy(), advantages, rtol=1e-10, atol=1e-10)
    assert critic.calls == 1


@settings(max_examples=30, deadline=None)
@given(**shapes, samples=st.integers(1, 5))
def test_sampled_mode_averages_q_over_the_samplers_draws(seed, batch, agents, action_dim, samples):
    rng, critic, state, joint = random_problem(seed, batch, agents, action_dim)
    draws = rng.uniform(-1, 1, (samples, batch, agents, action_dim))
    requested = []

    def sampler(count: int) -> torch.Tensor:
        requested.append(count)
        return torch.as_tensor(draws[:count])

    got = counterfactual_advantages(critic, torch.as_tensor(state), torch.as_tensor(joint), None, None,
                                    mode="sampled", samples_per_agent=samples, sampler=sampler)
    advantages, q = np_advantages(critic, state, joint, draws)
    np.testing.assert_allclose(got.advantages.numpy(), advantages, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.q_values.numpy(), q, rtol=1e-10, atol=1e-10)
    assert requested == [samples] and critic.calls == 1


def test_an_agent_whose_action_does_not_matter_gets_zero_advantage():
    """Q depends only on agent 0's action: every other agent's advantage is 0 (to rounding), in every mode."""
    rng = np.random.default_rng(4)
    weight = torch.as_tensor(rng.normal(0, 1, (2, 3)))

    def critic(state: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
        return (joint[:, :2] @ weight) ** 2 + state.sum(-1, keepdim=True)

    state, joint = torch.as_tensor(rng.normal(0, 1, (8, 4))), torch.as_tensor(rng.uniform(-1, 1, (8, 3, 2)))
    for mode, extra in (("zero", {}), ("mean", {}), ("sampled", {"samples_per_agent": 3})):
        got = counterfactual_advantages(critic, state, joint, torch.rand(8, 3, 2, dtype=torch.float64),
                                        torch.zeros(2, dtype=torch.float64), mode=mode,
                                        sampler=lambda k: torch.rand(k, 8, 3, 2, dtype=torch.float64), **extra)
        assert got.advantages[:, 1:].abs().max() < 1e-12 and got.advantages[:, 0].abs().max() > 1e-3


def test_advantages_carry_no_gradient_and_central_critic_works():
    critic = CentralCritic(state_dim=6, joint_action_dim=3 * 2, num_agents=3, hidden=[16, 16])
    state, joint = torch.randn(5, 6), torch.rand(5, 3, 2)
    got = counterfactual_advantages(critic, state, joint, None, torch.zeros(2), mode="zero")
    assert got.advantages.shape == (5, 3) and not got.advantages.requires_grad
    torch.testing.assert_close(got.q_values, critic(state, joint.flatten(1)))


def test_replace_each_agent_layout():
    joint = torch.arange(2 * 3 * 1).reshape(2, 3, 1)
    replaced = replace_each_agent(joint, torch.full((2, 3, 1), -1))
    assert replaced.shape == (2, 3, 3, 1)
    expected = joint[:, None].repeat(1, 3, 1, 1)
    expected[:, torch.arange(3), torch.arange(3)] = -1
    assert torch.equal(replaced, expected)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"mode": "noop"}, "allowed: zero, mean, sampled"),
    ({"mode": "zero"}, "default_action of shape"),
    ({"mode": "mean"}, "policy_means of shape"),
    ({"mode": "sampled", "samples_per_agent": 2}, "needs a sampler"),
    ({"mode": "sampled", "samples_per_agent": 2, "sampler": lambda k: torch.zeros(k, 4, 3, 1)}, r"\[K, B, N, A\]"),
])
def test_counterfactual_errors_name_what_is_wrong(kwargs, words):
    with pytest.raises(ValueError, match=words):
        counterfactual_advantages(lambda s, u: torch.zeros(len(s), 3), torch.zeros(4, 2), torch.zeros(4, 3, 2), None,
                                  None, **kwargs)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 16), agents=st.integers(1, 4),
       shared_reward=st.booleans(), gamma=st.floats(0.0, 1.0))
def test_td_target_matches_numpy(seed, batch, agents, shared_reward, gamma):
    rng = np.random.default_rng(seed)
    reward = rng.normal(0, 1, (batch,) if shared_reward else (batch, agents))
    next_q = rng.normal(0, 5, (batch, agents))
    terminated, truncated = rng.random(batch) < 0.3, rng.random(batch) < 0.3
    got = td_target(torch.as_tensor(reward), torch.as_tensor(next_q), torch.as_tensor(terminated),
                    torch.as_tensor(truncated), gamma).numpy()
    per_agent_reward = reward[:, None] if shared_reward else reward
    expected = per_agent_reward + gamma * np.where(terminated[:, None], 0.0, next_q)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("terminated", "truncated", "bootstraps"), [
    (False, False, True), (False, True, True), (True, False, False), (True, True, False)])
def test_td_target_stops_at_termination_and_bootstraps_through_truncation(terminated, truncated, bootstraps):
    reward, next_q = torch.tensor([1.5]), torch.tensor([[2.0, -4.0]])
    got = td_target(reward, next_q, torch.tensor([terminated]), torch.tensor([truncated]), 0.9)
    expected = [[1.5 + 0.9 * 2.0, 1.5 - 0.9 * 4.0]] if bootstraps else [[1.5, 1.5]]
    torch.testing.assert_close(got, torch.tensor(expected))


def test_td_target_is_detached_and_checks_shapes():
    next_q = torch.ones(3, 2, requires_grad=True)
    assert not td_target(torch.zeros(3), next_q, torch.zeros(3), torch.zeros(3), 0.99).requires_grad
    with pytest.raises(ValueError, match="terminated must be"):
        td_target(torch.zeros(3), next_q, torch.zeros(4), torch.zeros(3), 0.99)
    with pytest.raises(ValueError, match="next_q must be"):
        td_target(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), 0.99)


@pytest.mark.parametrize("tau", [0.0, 0.005, 0.3, 1.0])
def test_soft_update_matches_numpy(tau):
    torch.manual_seed(0)
    online = CentralCritic(state_dim=4, joint_action_dim=6, num_agents=3, hidden=[8, 8])
    target = CentralCritic(state_dim=4, joint_action_dim=6, num_agents=3, hidden=[8, 8])
    before = {name: p.detach().numpy().copy() for name, p in target.named_parameters()}
    online_values = {name: p.detach().numpy().copy() for name, p in online.named_parameters()}
    soft_update(target, online, tau)
    for name, param in target.named_parameters():
        expected = tau * online_values[name] + (1 - tau) * before[name]
        if tau in (0.0, 1.0):  # exact copy / exact keep
            assert np.array_equal(param.detach().numpy(), online_values[name] if tau == 1.0 else before[name])
        np.testing.assert_allclose(param.detach().numpy(), expected, rtol=1e-6, atol=1e-7)
        assert param.grad_fn is None and param.requires_grad
    for name, param in online.named_parameters():
        assert np.array_equal(param.detach().numpy(), online_values[name])


def test_soft_update_errors():
    online = CentralCritic(state_dim=4, joint_action_dim=6, num_agents=3, hidden=[8])
    with pytest.raises(ValueError, match=r"tau must be in \[0, 1\]"):
        soft_update(online, online, 1.5)
    with pytest.raises(ValueError, match="differ"):
        soft_update(CentralCritic(state_dim=4, joint_action_dim=6, num_agents=3, hidden=[8, 8]), online, 0.5)
