"""One PPO update over a batch of rows, exactly as seeds/000 writes it (CleanRL naming).

Which forward pass gives pi_current for the V-trace ratios: the learner's policy *at the start of the
update*, on the whole batch, before any gradient step. That is the policy the advantages are computed
for; the per-minibatch PPO ratio then compares the moving policy against the behaviour log-probs that
the actors recorded, which is what the clip must bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from configs.plan import BatchPlan
from configs.schema import TrainerSection
from learner.advantage import compute_advantages

INFERENCE_CHUNK_ROWS = 1024


@dataclass(frozen=True, kw_only=True)
class RowBatch:
    """A batch of rows on the training device; every per-step tensor is [S, T+1]."""

    obs: torch.Tensor
    """[S, T+1, *obs_shape] in the env dtype."""
    actions: torch.Tensor
    """[S, T+1] int64 actions taken."""
    logprobs: torch.Tensor
    """[S, T+1] behaviour log-probs."""
    values: torch.Tensor
    """[S, T+1] behaviour values."""
    rewards: torch.Tensor
    """[S, T+1] reward that arrived with each step."""
    dones: torch.Tensor
    """[S, T+1] 1.0 where the episode ended on the transition into this step."""
    bootstrap: torch.Tensor
    """[S, T+1] value of the final obs of a truncated episode (0 elsewhere)."""
    states: torch.Tensor
    """[S, policy.state_size] recurrent state the actor had before its forward pass on step 0."""


@dataclass(frozen=True, kw_only=True)
class UpdateSchedule:
    """The scheduled values in force for one update."""

    learning_rate: float
    """Optimiser learning rate."""
    anneal_beta: float
    """Importance-sampling exponent."""


def anneal_beta(trainer: TrainerSection, epoch: int, total_epochs: int) -> float:
    """beta0 + (1 - beta0) * prio_alpha * epoch / total_epochs, as seeds/000 writes it."""
    return trainer.prio_beta0 + (1 - trainer.prio_beta0) * trainer.prio_alpha * epoch / max(1, total_epochs)


def sampling_probs(advantages: torch.Tensor, prio_alpha: float) -> torch.Tensor:
    """Row sampling probabilities: (|A| summed over time) ** alpha, exactly uniform when alpha is 0."""
    segments = advantages.shape[0]
    if prio_alpha == 0.0:
        return torch.full((segments,), 1.0 / segments, device=advantages.device)
    prio_weights = advantages.abs().sum(dim=1) ** prio_alpha
    return (prio_weights + 1e-6) / (prio_weights.sum() + 1e-6)


@torch.no_grad()
def current_logprobs(policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor, dones: torch.Tensor,
                     states: torch.Tensor) -> torch.Tensor:
    """log pi_current(a|s) for [S, T] steps, in chunks of rows to bound memory."""
    out = torch.empty(actions.shape, device=actions.device)
    for start in range(0, obs.shape[0], INFERENCE_CHUNK_ROWS):
        rows = slice(start, start + INFERENCE_CHUNK_ROWS)
        logits, _ = policy.forward_rows(obs[rows], dones[rows], states[rows])
        logp = torch.log_softmax(logits, dim=-1)
        out[rows] = logp.gather(-1, actions[rows].unsqueeze(-1)).squeeze(-1)
    return out


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch: RowBatch, *,
               trainer: TrainerSection, plan: BatchPlan, schedule: UpdateSchedule,
               generator: torch.Generator) -> dict[str, float]:
    """Advantages, prioritized minibatches, clipped losses, gradient steps; returns the update's metrics."""
    horizon = batch.actions.shape[1] - 1
    obs = batch.obs[:, :horizon]
    actions = batch.actions[:, :horizon]
    old_logprobs = batch.logprobs[:, :horizon]
    old_values = batch.values[:, :horizon]
    step_dones = batch.dones[:, :horizon]

    ratios = torch.exp(current_logprobs(policy, obs, actions, step_dones, batch.states) - old_logprobs)
    rewards = batch.rewards + trainer.gamma * batch.bootstrap
    advantages = compute_advantages(batch.values, rewards, batch.dones, ratios, gamma=trainer.gamma,
                                    gae_lambda=trainer.gae_lambda, rho_clip=trainer.vtrace_rho_clip,
                                    c_clip=trainer.vtrace_c_clip).to(obs.device)
    returns = advantages + old_values
    probs = sampling_probs(advantages, trainer.prio_alpha)

    for group in optimizer.param_groups:
        group["lr"] = schedule.learning_rate
    sums = {k: 0.0 for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "grad_norm",
                             "is_weight_mean")}
    steps = skipped = 0
    for _epoch in range(trainer.update_epochs):
        for _ in range(plan.num_minibatches):
            idx = torch.multinomial(probs, plan.minibatch_segments, replacement=False, generator=generator)
            is_weights = (plan.segments * probs[idx]) ** (-schedule.anneal_beta)

            logits, newvalue = policy.forward_rows(obs[idx], step_dones[idx], batch.states[idx])
            logp_all = torch.log_softmax(logits, dim=-1)
            newlogprob = logp_all.gather(-1, actions[idx].unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            logratio = newlogprob - old_logprobs[idx]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfrac = ((ratio - 1.0).abs() > trainer.clip_coef).float().mean()

            mb_advantages = advantages[idx]
            if trainer.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            mb_advantages = is_weights.unsqueeze(1) * mb_advantages

            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - trainer.clip_coef, 1 + trainer.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

            mb_returns, mb_old_values = returns[idx], old_values[idx]
            if trainer.clip_vloss:
                v_loss_unclipped = (newvalue - mb_returns) ** 2
                v_clipped = mb_old_values + torch.clamp(newvalue - mb_old_values, -trainer.vf_clip_coef,
                                                        trainer.vf_clip_coef)
                v_loss = torch.max(v_loss_unclipped, (v_clipped - mb_returns) ** 2).mean()
            else:
                v_loss = ((newvalue - mb_returns) ** 2).mean()
            entropy_loss = -entropy.mean()
            loss = pg_loss + trainer.vf_coef * v_loss + trainer.ent_coef * entropy_loss

            if not torch.isfinite(loss):
                skipped += 1
                optimizer.zero_grad(set_to_none=True)
                continue
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), trainer.max_grad_norm)
            if not torch.isfinite(grad_norm):
                skipped += 1
                optimizer.zero_grad(set_to_none=True)
                continue
            optimizer.step()
            steps += 1
            for key, value in (("policy_loss", pg_loss), ("value_loss", v_loss), ("entropy", -entropy_loss),
                               ("approx_kl", approx_kl), ("clipfrac", clipfrac), ("grad_norm", grad_norm),
                               ("is_weight_mean", is_weights.mean())):
                sums[key] += float(value.detach())

    metrics = {k: v / max(1, steps) for k, v in sums.items()}
    metrics["explained_variance"] = explained_variance(old_values, returns)
    metrics["gradient_steps"] = float(steps)
    metrics["skipped_steps"] = float(skipped)
    metrics["learning_rate"] = schedule.learning_rate
    metrics["anneal_beta"] = schedule.anneal_beta
    metrics["advantage_mean"] = float(advantages.mean())
    metrics["ratio_mean"] = float(ratios.mean())
    return metrics


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target); NaN when the target has no variance."""
    var_target = torch.var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1 - torch.var(target - predicted) / var_target)
