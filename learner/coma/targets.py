"""COMA's learning targets (seeds/004): the critic's TD target, the counterfactual advantages, the soft update.

Shapes: ``B`` transitions, ``N`` agents, ``A`` action dims per agent, ``S`` state dims, ``K`` Monte Carlo samples.
Joint actions are env actions (already squashed onto the Box), ``[B, N, A]``; the critic takes them flattened in
agent order, ``[B, N * A]``, and returns ``Q [B, N]`` (one Q per agent).

* TD target: ``y_i = r + gamma * (1 - terminated) * Q'_i(s', a')``. ``a'`` is the target actors' action at the next
  observations and ``Q'`` the target critic; the caller evaluates both and passes ``next_q``. A truncated step
  (time limit) is bootstrapped like any other; only termination stops the bootstrap.
* Counterfactual advantage: ``A_i = Q_i(s, u) - b_i`` with the baseline ``b_i`` from agent i's default action:
  ``zero``: ``Q_i(s, (u^-i, u_default))`` with the env's no-op action; ``mean``: ``Q_i(s, (u^-i, mode(pi_i)))``, the
  agent's own mean action; ``sampled``: ``E_{u' ~ pi_i} Q_i(s, (u^-i, u'))`` by Monte Carlo (the original COMA
  baseline carried over to continuous actions). None of the three depends on agent i's taken action, so each keeps
  the policy gradient unbiased; they differ in variance and cost (``sampled`` costs K critic rows per agent).
* Soft update: ``theta' <- tau * theta + (1 - tau) * theta'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

DEFAULT_ACTION_MODES = ("zero", "mean", "sampled")
"""Where agent i's counterfactual action comes from (configs: coma.default_action)."""

Critic = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""state [M, S], joint action [M, N * A] -> Q [M, N] (a CentralCritic or its target)."""
ActionSampler = Callable[[int], torch.Tensor]
"""K -> actions [K, B, N, A]: sample k of agent i drawn from pi_i(. | o_i), as env actions."""


@dataclass(frozen=True, kw_only=True)
class CounterfactualAdvantages:
    """The advantages of every agent and the critic values they came from (all detached, [B, N])."""

    advantages: torch.Tensor
    """A_i = Q_i(s, u) - baseline_i."""
    q_values: torch.Tensor
    """Q_i(s, u) at the taken joint action."""
    baselines: torch.Tensor
    """The counterfactual baseline of each agent."""


def td_target(reward: torch.Tensor, next_q: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
              gamma: float) -> torch.Tensor:
    """y [B, N] = r + gamma * (1 - terminated) * next_q, detached.

    reward: [B] (the shared reward, broadcast to every agent) or [B, N]; next_q: [B, N], the target critic at
    (s', a') with a' from the target actors; terminated, truncated: [B] or [B, N], bool or 0/1. Truncation does
    not stop the bootstrap (``truncated`` is taken so the call site states both flags, and checked for shape);
    ``next_q`` of a truncated step must come from its true final state, not from a reset.
    """
    if next_q.dim() != 2:
        raise ValueError(f"td_target: next_q must be [B, N], got shape {tuple(next_q.shape)}")
    batch = next_q.shape[0]
    named = {"reward": reward, "terminated": terminated, "truncated": truncated}
    for name, tensor in named.items():
        if tuple(tensor.shape) not in ((batch,), tuple(next_q.shape)):
            raise ValueError(f"td_target: {name} must be [B] or [B, N] = {[batch]} or {list(next_q.shape)}, "
                             f"got shape {tuple(tensor.shape)}")
    per_agent = {name: t if t.dim() == 2 else t.unsqueeze(-1) for name, t in named.items()}
    not_terminated = 1.0 - per_agent["terminated"].to(next_q.dtype)
    return (per_agent["reward"].to(next_q.dtype) + gamma * not_terminated * next_q).detach()


def replace_each_agent(joint_actions: torch.Tensor, replacement: torch.Tensor) -> torch.Tensor:
    """joint [B, N, A] and replacement [..., B, N, A] -> [..., B, N, N, A]: entry ``[..., b, i]`` is the joint
    action of transition b with agent i's action replaced by ``replacement[..., b, i]`` (the others kept)."""
    agents = joint_actions.shape[1]
    is_agent_i = torch.eye(agents, dtype=torch.bool, device=joint_actions.device)[:, :, None]
    return torch.where(is_agent_i, replacement.unsqueeze(-2), joint_actions.unsqueeze(-3))


def _own_q(critic: Critic, state: torch.Tensor, counterfactual: torch.Tensor) -> torch.Tensor:
    """counterfactual [..., B, N, N, A] -> Q_i(s, counterfactual[..., b, i]) [..., B, N] in one critic call.
    (Replacing agent i's action by its own taken action gives the taken joint action: that is how Q_i(s, u) rides
    along in the same call.)"""
    *lead, batch, agents, _, action_dim = counterfactual.shape
    states = state.reshape(*([1] * len(lead)), batch, 1, -1).expand(*lead, batch, agents, -1)
    q = critic(states.reshape(-1, state.shape[-1]), counterfactual.reshape(-1, agents * action_dim))
    return q.reshape(*lead, batch, agents, agents).diagonal(dim1=-2, dim2=-1)


@torch.no_grad()
def counterfactual_advantages(critic: Critic, state: torch.Tensor, joint_actions: torch.Tensor,
                              policy_means: torch.Tensor | None, default_action: torch.Tensor | None, *,
                              mode: str, samples_per_agent: int = 1,
                              sampler: ActionSampler | None = None) -> CounterfactualAdvantages:
    """A_i = Q_i(s, u) - baseline_i for every transition and agent (no gradient: the actor loss treats A_i as a
    constant).

    state [B, S]; joint_actions [B, N, A]; policy_means [B, N, A], each agent's mode action (mode ``mean``);
    default_action [A] or [N, A], the env's no-op action (mode ``zero``); sampler and samples_per_agent K (mode
    ``sampled``). The taken joint action and every counterfactual go through the critic in one batched call of
    ``B * N * (1 + K)`` rows (K = 1 for zero and mean). Returns advantages, q_values and baselines, each [B, N].
    """
    if mode not in DEFAULT_ACTION_MODES:
        raise ValueError(f"counterfactual_advantages: mode {mode!r} is not allowed; allowed: "
                         f"{', '.join(DEFAULT_ACTION_MODES)}")
    if joint_actions.dim() != 3 or state.dim() != 2 or state.shape[0] != joint_actions.shape[0]:
        raise ValueError(f"counterfactual_advantages: state must be [B, S] and joint_actions [B, N, A] with the "
                         f"same B; got {tuple(state.shape)} and {tuple(joint_actions.shape)}")
    if mode == "sampled":
        replacements = _sampled(sampler, samples_per_agent, joint_actions)
    else:
        replacements = _replacement(mode, joint_actions, policy_means, default_action).unsqueeze(0)
    taken = joint_actions.unsqueeze(0)
    own_q = _own_q(critic, state, replace_each_agent(joint_actions, torch.cat([taken, replacements], dim=0)))
    q_values, baselines = own_q[0], own_q[1:].mean(dim=0)
    return CounterfactualAdvantages(advantages=q_values - baselines, q_values=q_values, baselines=baselines)


def _replacement(mode: str, joint_actions: torch.Tensor, policy_means: torch.Tensor | None,
                 default_action: torch.Tensor | None) -> torch.Tensor:
    """Agent i's counterfactual action [B, N, A] for modes zero and mean."""
    if mode == "mean":
        if policy_means is None or policy_means.shape != joint_actions.shape:
            got = None if policy_means is None else tuple(policy_means.shape)
            raise ValueError(f"counterfactual_advantages: mode 'mean' needs policy_means of shape "
                             f"{tuple(joint_actions.shape)} (as joint_actions), got {got}")
        return policy_means
    agents, action_dim = joint_actions.shape[1:]
    if default_action is None or tuple(default_action.shape) not in ((action_dim,), (agents, action_dim)):
        got = None if default_action is None else tuple(default_action.shape)
        raise ValueError(f"counterfactual_advantages: mode 'zero' needs default_action of shape [A] = "
                         f"{[action_dim]} or [N, A] = {[agents, action_dim]}, got {got}")
    return default_action.to(joint_actions.dtype).expand_as(joint_actions)


def _sampled(sampler: ActionSampler | None, samples_per_agent: int, joint_actions: torch.Tensor) -> torch.Tensor:
    """The sampler's K draws [K, B, N, A], checked."""
    if sampler is None or samples_per_agent < 1:
        raise ValueError(f"counterfactual_advantages: mode 'sampled' needs a sampler and samples_per_agent >= 1, "
                         f"got sampler={sampler!r}, samples_per_agent={samples_per_agent}")
    draws = sampler(samples_per_agent)
    expected = (samples_per_agent, *joint_actions.shape)
    if tuple(draws.shape) != expected:
        raise ValueError(f"counterfactual_advantages: the sampler must return [K, B, N, A] = {list(expected)}, "
                         f"got {tuple(draws.shape)}")
    return draws


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """theta' <- tau * theta + (1 - tau) * theta' for every parameter, in place (tau = 1 copies, 0 keeps)."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"soft_update: tau must be in [0, 1], got {tau}")
    target_params = dict(target.named_parameters())
    online_params = dict(online.named_parameters())
    if target_params.keys() != online_params.keys():
        raise ValueError(f"soft_update: target and online networks differ; parameters only in target: "
                         f"{sorted(target_params.keys() - online_params.keys())}, only in online: "
                         f"{sorted(online_params.keys() - target_params.keys())}")
    for name, target_param in target_params.items():
        target_param.mul_(1.0 - tau).add_(online_params[name], alpha=tau)
