"""COMA for cooperative continuous control (seeds/004): per-agent tanh-Gaussian actors, one centralised critic
Q(s, u) in R^N, target networks, a replay buffer of joint transitions.

One gradient step (``Coma.train_step``) on a uniform minibatch of transitions, as the seed's training loop:

1. critic: ``L = mean_i (y_i - Q_i(s, u))**2`` with ``y = r + gamma * (1 - terminated) * Q'(s', a')``, ``a'`` drawn
   from the target actors at the next observations (truncated steps bootstrap from their true final state);
2. actors: ``A_i = Q_i(s, u) - b_i`` (the counterfactual baseline of ``coma.default_action``), then for each agent
   ``L_i = -mean(A_i * rho_i) - entropy_coef * H(pi_i)`` with ``rho_i = min(pi_i(u_i | o_i) / mu_i(u_i | o_i), c)``,
   ``u_i`` the pre-tanh action the agent took under the behaviour policy ``mu_i`` and ``c =
   coma.max_importance_weight``. Where the replayed action is fresh (``rho = 1``) the gradient ``-A_i * rho_i * grad
   log pi_i`` is exactly the seed's ``-A_i * grad log pi_i``. On older transitions the seed's loss diverges: for a
   negative advantage it is minimised by driving ``log pi_i`` of that action to minus infinity (measured on the
   credit probe: the std collapses to 1e-9 and the loss reaches -1e18 within a few rollouts). The importance weight
   bounds it: the gradient fades as ``pi_i`` of a bad action falls, and stops above ``c``. For a negative advantage
   the cap is ``c_neg = coma.max_importance_weight_negative >= c`` (dual-clip PPO's second clip, Ye et al. 2020):
   with one cap, a bad action the policy has come to prefer over the behaviour policy (``rho > c``) gets no gradient
   at all, so nothing moves the policy off it;
3. gradient clipping at ``max_grad_norm`` on the critic and on each actor, Adam, and a soft update by ``tau`` of the
   target critic and target actors.

Joint transitions (``TRANSITION_FIELDS``): global state, every agent's observation, pre-tanh and env action, per-
agent reward, the next global state and observations (the final ones for a step that ended its episode) and the
terminated flag (truncation bootstraps, so it needs no flag here).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from configs.schema import ComaSection
from learner.coma.critic import CentralCritic
from learner.coma.targets import counterfactual_advantages, soft_update, td_target
from learner.update.optimizer_step import fused_supported
from learner.update.reducer import SINGLE_PROCESS, Reducer
from policies import tanh_gaussian
from policies.team_actors import ComaShapes, make_team_actors


def transition_fields(shapes: ComaShapes) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of one joint transition, as the replay buffer stores it."""
    n, o, s, a = shapes.num_agents, shapes.obs_dim, shapes.state_dim, shapes.action_dim
    return {"state": ((s,), "float32"), "obs": ((n, o), "float32"), "pre_tanh": ((n, a), "float32"),
            "actions": ((n, a), "float32"), "logprobs": ((n,), "float32"), "rewards": ((n,), "float32"),
            "next_state": ((s,), "float32"),
            "next_obs": ((n, o), "float32"), "terminated": ((), "float32")}


def importance_weights(log_ratio: torch.Tensor, advantages: torch.Tensor, cap: float,
                       cap_negative: float) -> torch.Tensor:
    """rho = min(pi / mu, c) where the advantage is >= 0 and min(pi / mu, c_neg) where it is negative ([B, N]; the
    gradient flows through rho below its cap and stops above it)."""
    ratio = log_ratio.exp()
    return torch.where(advantages >= 0, ratio.clamp(max=cap), ratio.clamp(max=cap_negative))


class Coma(nn.Module):
    """The actors (one per agent, or one shared with a one-hot agent id), the critic, their targets and
    optimizers."""

    def __init__(self, shapes: ComaShapes, section: ComaSection, *, seed: int, device: torch.device) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.shapes, self.section, self.device = shapes, section, device
        n, a = shapes.num_agents, shapes.action_dim
        hidden = tuple(section.hidden_sizes)
        self.actors = make_team_actors(shapes, section)
        self.critic = CentralCritic(shapes.state_dim, n * a, n, hidden)
        self.target_actors = copy.deepcopy(self.actors).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.to(device)
        self.low = torch.tensor(shapes.action_low, dtype=torch.float32, device=device)
        self.high = torch.tensor(shapes.action_high, dtype=torch.float32, device=device)
        self.noop = torch.tensor(shapes.noop_action, dtype=torch.float32, device=device)
        # Fused Adam kernels where the device has them (one kernel per parameter tensor; ops/bench/coma_step.py: a
        # gradient step 7.4 ms against 9.1 with foreach on a 2-core Intel VM). One Adam over every actor is N per-agent
        # Adams (Adam's state and step are per parameter), in fewer calls.
        fused = fused_supported(self.parameters())
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=section.critic_lr, fused=fused)
        self.actor_optimizer = torch.optim.Adam(self.actors.parameters(), lr=section.actor_lr, fused=fused)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def heads(self, obs: torch.Tensor, *, target: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [..., N, obs_dim] -> (mean, log_std) [..., N, A], agent i from its own actor (or the shared one)."""
        return (self.target_actors if target else self.actors).heads(obs)

    @torch.no_grad()
    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [E, N, obs_dim] -> (pre-tanh u, env actions) [E, N, A] and their log-probabilities [E, N], float32
        (deterministic: the mean action, log-probability 0)."""
        mean, log_std = self.heads(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
        if deterministic:
            action = tanh_gaussian.mode(mean, self.low, self.high)
            return mean.cpu().numpy(), action.cpu().numpy(), np.zeros(mean.shape[:-1], np.float32)
        u, action, log_prob = tanh_gaussian.sample(mean, log_std, self.low, self.high, self.generator)
        return u.cpu().numpy(), action.cpu().numpy(), log_prob.cpu().numpy()

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The TD loss mean_i (y_i - Q_i(s, u))**2 with a' from the target actors (and Q(s, u), detached)."""
        state, batch_size = batch["state"], batch["state"].shape[0]
        with torch.no_grad():
            next_mean, next_log_std = self.heads(batch["next_obs"], target=True)
            _, next_actions, _ = tanh_gaussian.sample(next_mean, next_log_std, self.low, self.high, self.generator)
            next_q = self.target_critic(batch["next_state"], next_actions.reshape(batch_size, -1))
            y = td_target(batch["rewards"], next_q, batch["terminated"], torch.zeros_like(batch["terminated"]),
                          self.section.gamma)
        q_taken = self.critic(state, batch["actions"].reshape(batch_size, -1))
        return (y - q_taken).pow(2).mean(), q_taken.detach()

    def actor_losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each agent's loss [N] (agent i's depends on agent i's actor only) and what went into it, detached:
        advantages [B, N], importance weights [B, N], entropy [B, N], std [B, N, A]."""
        section = self.section
        mean, log_std = self.heads(batch["obs"])
        counterfactual = counterfactual_advantages(
            self.critic, batch["state"], batch["actions"], tanh_gaussian.mode(mean, self.low, self.high).detach(),
            self.noop, mode=section.default_action, samples_per_agent=section.counterfactual_samples,
            sampler=lambda k: self._policy_samples(mean.detach(), log_std.detach(), k))
        advantages = counterfactual.advantages
        log_probs = tanh_gaussian.log_prob(mean, log_std, batch["pre_tanh"], self.low, self.high)  # [B, N]
        ratio = importance_weights(log_probs - batch["logprobs"], advantages, section.max_importance_weight,
                                   section.max_importance_weight_negative)
        entropy = tanh_gaussian.gaussian_entropy(log_std)  # [B, N]
        per_agent = -(advantages * ratio).mean(dim=0) - section.entropy_coef * entropy.mean(dim=0)  # [N]
        return per_agent, {"advantages": advantages, "ratio": ratio.detach(), "entropy": entropy.detach(),
                           "std": log_std.detach().exp()}

    def train_step(self, batch: dict[str, torch.Tensor], reducer: Reducer = SINGLE_PROCESS) -> dict[str, float]:
        """One critic step, one step of every actor and the soft updates, on a minibatch of joint transitions
        (``transition_fields``, batched); returns this step's metrics. With K data-parallel ranks (``reducer``) the
        minibatch is this rank's equal share of the step's transitions: every loss is a mean over it, so the ranks'
        averaged gradients (before clipping) are the gradients of the whole step's, and every rank takes the same step."""
        section = self.section
        critic_loss, q_taken = self.critic_loss(batch)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        reducer.average_gradients(self.critic.parameters())
        critic_grad = nn.utils.clip_grad_norm_(self.critic.parameters(), section.max_grad_norm, foreach=True)
        self.critic_optimizer.step()

        per_agent, parts = self.actor_losses(batch)  # with the critic just updated, as the seed's loop has it
        self.actor_optimizer.zero_grad(set_to_none=True)
        per_agent.sum().backward()
        reducer.average_gradients(self.actors.parameters())
        for actor in self.actors:
            nn.utils.clip_grad_norm_(actor.parameters(), section.max_grad_norm, foreach=True)
        self.actor_optimizer.step()
        soft_update(self.target_critic, self.critic, section.tau)
        soft_update(self.target_actors, self.actors, section.tau)
        advantages = parts["advantages"]
        metrics = {"critic_loss": float(critic_loss.detach()), "q_mean": float(q_taken.mean()),
                   "critic_grad_norm": float(critic_grad), "entropy": float(parts["entropy"].mean()),
                   "action_std": float(parts["std"].mean()), "importance_weight_mean": float(parts["ratio"].mean())}
        for i in range(self.shapes.num_agents):
            metrics[f"actor_loss_{i}"] = float(per_agent[i].detach())
            metrics[f"advantage_mean_{i}"] = float(advantages[:, i].mean())
            metrics[f"advantage_std_{i}"] = float(advantages[:, i].std())
        return metrics

    def _policy_samples(self, mean: torch.Tensor, log_std: torch.Tensor, k: int) -> torch.Tensor:
        """k env actions [k, B, N, A] from each agent's current policy (coma.default_action sampled)."""
        draws = [tanh_gaussian.sample(mean, log_std, self.low, self.high, self.generator)[1] for _ in range(k)]
        return torch.stack(draws)
