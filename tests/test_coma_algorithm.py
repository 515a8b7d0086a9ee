"""COMA's update (learner/coma/algorithm.py): agent i's actor loss moves only agent i's actor, gradients are clipped
on the critic and on every actor, the critic loss is the TD error of the seed against NumPy, the actor loss equals
the seed's -A * log pi in gradient on fresh data and stays bounded on stale replay, and the targets follow by tau."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs.loader import load_config
from learner.coma.algorithm import Coma, ComaShapes, importance_weights, transition_fields
from policies import tanh_gaussian

SHAPES = ComaShapes(num_agents=3, obs_dim=4, state_dim=5, action_low=(0.0, -2.0), action_high=(1.0, 2.0),
                    noop_action=(0.0, 0.0))


def coma(*overrides: str, seed: int = 0) -> Coma:
    section = load_config(None, ["coma.hidden_sizes=[32, 32]", *overrides]).coma
    return Coma(SHAPES, section, seed=seed, device=torch.device("cpu"))


def batch(model: Coma, size: int = 16, *, seed: int = 0, reward_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random transitions whose actions and log-probabilities are the model's own (fresh data)."""
    rng = np.random.default_rng(seed)
    fields = transition_fields(SHAPES)
    data = {name: rng.normal(size=(size, *shape)).astype(np.float32) for name, (shape, _) in fields.items()}
    data["rewards"] *= reward_scale
    data["terminated"] = (rng.random(size) < 0.2).astype(np.float32)
    u, actions, logprobs = model.act(data["obs"])
    data.update(pre_tanh=u, actions=actions, logprobs=logprobs)
    return {name: torch.from_numpy(values) for name, values in data.items()}


@pytest.mark.parametrize("agent", [0, 1, 2])
def test_agent_i_actor_loss_reaches_only_agent_i_actor(agent):
    model = coma()
    losses, _ = model.actor_losses(batch(model))
    losses[agent].backward()
    for i, actor in enumerate(model.actors):
        grads = [p.grad for p in actor.parameters()]
        if i == agent:
            assert any(g is not None and g.abs().sum() > 0 for g in grads)
        else:
            assert all(g is None or g.abs().sum() == 0 for g in grads)
    assert all(p.grad is None for p in model.critic.parameters())  # advantages are constants to the actors


def test_gradients_are_clipped_on_the_critic_and_on_every_actor():
    model = coma("coma.max_grad_norm=0.01")
    model.train_step(batch(model, reward_scale=1000.0))
    def norm(module):
        return torch.sqrt(sum(p.grad.pow(2).sum() for p in module.parameters() if p.grad is not None))
    assert norm(model.critic) <= 0.01 + 1e-6
    for actor in model.actors:
        assert norm(actor) <= 0.01 + 1e-6


def test_the_critic_loss_is_the_td_error_against_numpy():
    model = coma("coma.gamma=0.9")
    data = batch(model, seed=3)
    generator_state = model.generator.get_state()
    loss, q_taken = model.critic_loss(data)
    model.generator.set_state(generator_state)  # the same draw of a' from the target actors
    with torch.no_grad():
        mean, log_std = model.heads(data["next_obs"], target=True)
        _, next_actions, _ = tanh_gaussian.sample(mean, log_std, model.low, model.high, model.generator)
        next_q = model.target_critic(data["next_state"], next_actions.reshape(16, -1)).numpy()
        q = model.critic(data["state"], data["actions"].reshape(16, -1)).numpy()
    rewards, terminated = data["rewards"].numpy(), data["terminated"].numpy()
    y = rewards + 0.9 * (1.0 - terminated[:, None]) * next_q
    np.testing.assert_allclose(float(loss.detach()), np.mean((y - q) ** 2), rtol=1e-5)
    np.testing.assert_allclose(q_taken.numpy(), q, rtol=1e-6)


def test_on_fresh_data_the_actor_gradient_is_the_seeds_minus_a_log_pi():
    model = coma("coma.entropy_coef=0.0")
    data = batch(model, seed=5)
    losses, parts = model.actor_losses(data)
    assert torch.allclose(parts["ratio"], torch.ones_like(parts["ratio"]), atol=1e-4)
    grads = torch.autograd.grad(losses.sum(), list(model.actors.parameters()))
    mean, log_std = model.heads(data["obs"])
    log_pi = tanh_gaussian.log_prob(mean, log_std, data["pre_tanh"], model.low, model.high)
    seed_loss = -(parts["advantages"] * log_pi).mean(dim=0).sum()
    seed_grads = torch.autograd.grad(seed_loss, list(model.actors.parameters()))
    for got, want in zip(grads, seed_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-6)


def test_on_stale_replay_the_importance_weight_is_capped_and_fades_for_unlikely_actions():
    model = coma("coma.max_importance_weight=1.5", "coma.max_importance_weight_negative=1.5")
    data = batch(model, seed=7)
    stale = dict(data, logprobs=data["logprobs"] - torch.linspace(-30.0, 30.0, 16)[:, None])
    _, parts = model.actor_losses(stale)
    ratio = parts["ratio"]
    assert ratio.max() <= 1.5 + 1e-6 and ratio[0].max() < 1e-10  # behaviour far likelier: weight near zero


def test_targets_follow_the_online_networks_by_tau():
    model = coma("coma.tau=0.25")
    before = [p.detach().clone() for p in model.target_critic.parameters()]
    model.train_step(batch(model))
    for old, target, online in zip(before, model.target_critic.parameters(), model.critic.parameters()):
        torch.testing.assert_close(target, 0.75 * old + 0.25 * online.detach())


def test_parameter_sharing_uses_one_actor_with_the_agent_id():
    model = coma("coma.parameter_sharing=true")
    assert len(model.actors) == 1
    mean, _ = model.heads(torch.zeros(2, 3, 4))
    assert not torch.allclose(mean[:, 0], mean[:, 1])  # the one-hot id tells the agents apart
    model.train_step(batch(model))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("cap", "cap_negative"), [(1.0, 1.0), (1.0, 3.0), (1.5, 10.0)])
def test_importance_weights_cap_each_sign_of_advantage_against_numpy(seed, cap, cap_negative):
    rng = np.random.default_rng(seed)
    log_ratio = rng.normal(0.0, 2.0, size=(64, 3))
    advantages = rng.normal(size=(64, 3))
    advantages[0, 0] = 0.0  # a zero advantage takes the positive cap
    want = np.where(advantages >= 0, np.minimum(np.exp(log_ratio), cap), np.minimum(np.exp(log_ratio), cap_negative))
    log_ratio_t = torch.tensor(log_ratio, requires_grad=True)
    got = importance_weights(log_ratio_t, torch.tensor(advantages), cap, cap_negative)
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12)
    got.sum().backward()  # the gradient flows below the cap (d rho / d log rho = rho) and stops above it
    below = np.where(advantages >= 0, np.exp(log_ratio) < cap, np.exp(log_ratio) < cap_negative)
    np.testing.assert_allclose(log_ratio_t.grad.numpy(), np.where(below, np.exp(log_ratio), 0.0), rtol=1e-12)


def test_a_bad_action_the_policy_has_come_to_prefer_still_gets_a_gradient_under_the_negative_cap():
    model = coma("coma.max_importance_weight_negative=4")
    data = batch(model, seed=9)
    stale = dict(data, logprobs=data["logprobs"] - 1.0)  # the policy now likes every replayed action e times more
    losses, parts = model.actor_losses(stale)
    negative = parts["advantages"] < 0
    assert negative.any() and (~negative).any()
    np.testing.assert_allclose(parts["ratio"][~negative].numpy(), 1.0)  # capped at c = 1
    np.testing.assert_allclose(parts["ratio"][negative].numpy(), np.e, rtol=1e-4)  # below c_neg = 4: kept
    assert all(p.grad is None for p in model.actors.parameters())
    losses.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.actors.parameters())
    one_cap = coma("coma.max_importance_weight_negative=1")  # one cap for both signs: the same batch moves nothing
    one_cap.load_state_dict(model.state_dict())
    one_losses, _ = one_cap.actor_losses(stale)
    one_losses.sum().backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in one_cap.actors.parameters())
