"""One PPO update over a batch of rows, exactly as seeds/000 writes it (the losses: learner/losses.py).

Which forward pass gives pi_current for the V-trace ratios: the learner's policy *at the start of the
update*, on the whole batch, before any gradient step. That is the policy the advantages are computed
for; the per-minibatch PPO ratio then compares the moving policy against the behaviour log-probs that
the actors recorded, which is what the clip must bound.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from configs.plan import BatchPlan
from configs.schema import TrainerSection
from learner.advantage import compute_advantages
from learner.batch import RowBatch, minibatch_rows
from learner.losses import Minibatch, minibatch_losses
from learner.schedules import UpdateSchedule

LossFn = Callable[..., dict[str, torch.Tensor]]

INFERENCE_CHUNK_ROWS = 1024


def sampling_probs(advantages: torch.Tensor, prio_alpha: float) -> torch.Tensor:
    """Row sampling probabilities of seeds/000: (|A| summed over time) ** alpha, normalised with its 1e-6.

    prio_alpha 0 is exactly uniform. When every advantage is 0 the seed's formula would give every row
    probability 1 (and IS weights of segments ** -beta); that degenerate case is uniform instead.
    """
    segments = advantages.shape[0]
    uniform = torch.full((segments,), 1.0 / segments, device=advantages.device)
    if prio_alpha == 0.0:
        return uniform
    prio_weights = advantages.abs().sum(dim=1) ** prio_alpha
    total = prio_weights.sum()
    probs = (prio_weights + 1e-6) / (total + 1e-6)
    return torch.where(total > 0, probs, uniform)


@torch.no_grad()
def current_logprobs(policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor, action_masks: torch.Tensor,
                     dones: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """log pi_current(a|s) for [S, T] steps, in chunks of rows to bound memory."""
    out = torch.empty(dones.shape, device=dones.device)
    for start in range(0, obs.shape[0], INFERENCE_CHUNK_ROWS):
        rows = slice(start, start + INFERENCE_CHUNK_ROWS)
        params, _ = policy.forward_rows(obs[rows], dones[rows], states[rows])
        mask = action_masks[rows] if action_masks.shape[-1] else None
        out[rows] = policy.distribution.log_prob(params, mask, actions[rows])
    return out


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch: RowBatch, *,
               trainer: TrainerSection, plan: BatchPlan, schedule: UpdateSchedule, generator: torch.Generator,
               reference: nn.Module | None = None, loss_fn: LossFn = minibatch_losses) -> dict[str, float]:
    """Advantages, prioritized minibatches, clipped losses, gradient steps; returns the update's metrics.

    ``reference`` is the KL-penalty policy (used when schedule.kl_coef > 0); ``loss_fn`` may be a compiled
    ``minibatch_losses``. Loss statistics stay on the device until the end: one host sync per optimizer
    step (to skip a non-finite gradient) and one batch of syncs per update.
    """
    horizon = batch.dones.shape[1] - 1
    rows = minibatch_rows(batch, horizon)
    old_values = rows["old_values"]
    device = old_values.device

    logprobs = current_logprobs(policy, rows["obs"], rows["actions"], rows["action_masks"], rows["dones"],
                                rows["states"])
    ratios = torch.exp(logprobs - rows["old_logprobs"])
    rewards = batch.rewards + trainer.gamma * batch.bootstrap
    advantages = compute_advantages(batch.values, rewards, batch.dones, ratios, gamma=trainer.gamma,
                                    gae_lambda=trainer.gae_lambda, rho_clip=trainer.vtrace_rho_clip,
                                    c_clip=trainer.vtrace_c_clip).to(device)
    returns = advantages + old_values
    probs = sampling_probs(advantages, trainer.prio_alpha)
    coefs = torch.tensor([schedule.clip_coef, trainer.vf_clip_coef, schedule.ent_coef, trainer.vf_coef,
                          schedule.kl_coef], dtype=torch.float32, device=device)
    use_reference = reference if schedule.kl_coef > 0 else None

    for group in optimizer.param_groups:
        group["lr"] = schedule.learning_rate
    accumulation = trainer.gradient_accumulation
    terms: list[dict[str, torch.Tensor]] = []
    sampled_weights: list[torch.Tensor] = []
    grad_norms: list[torch.Tensor] = []
    steps = skipped = 0
    optimizer.zero_grad(set_to_none=True)
    for _epoch in range(trainer.update_epochs):
        for minibatch in range(plan.num_minibatches):
            idx = torch.multinomial(probs, plan.minibatch_segments, replacement=False, generator=generator)
            is_weights = (plan.segments * probs[idx]) ** (-schedule.anneal_beta)
            mb = Minibatch(**{name: tensor[idx] for name, tensor in rows.items()}, advantages=advantages[idx],
                           returns=returns[idx], is_weights=is_weights)
            out = loss_fn(policy, use_reference, mb, coefs, norm_adv=trainer.norm_adv,
                          clip_vloss=trainer.clip_vloss, vf_warmup=schedule.vf_warmup)
            (out["loss"] / accumulation).backward()  # gradients of `accumulation` minibatches are averaged
            terms.append({k: v.detach() for k, v in out.items()})
            sampled_weights.append(is_weights)
            if (minibatch + 1) % accumulation:
                continue
            grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), trainer.max_grad_norm)
            if torch.isfinite(grad_norm):  # a NaN/inf loss or gradient skips the step, never the weights
                optimizer.step()
                steps += 1
                grad_norms.append(grad_norm)
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)

    metrics = {k: float(torch.stack([t[k] for t in terms]).mean()) for k in terms[0] if k != "loss"}
    metrics["total_loss"] = float(torch.stack([t["loss"] for t in terms]).mean())
    weights = torch.cat(sampled_weights)
    metrics.update(is_weight_mean=float(weights.mean()), is_weight_min=float(weights.min()),
                   is_weight_max=float(weights.max()))
    metrics["grad_norm"] = float(torch.stack(grad_norms).mean()) if grad_norms else float("nan")
    metrics["explained_variance"] = explained_variance(old_values, returns)
    metrics["gradient_steps"] = float(steps)
    metrics["skipped_steps"] = float(skipped)
    metrics.update(schedule.as_metrics())
    metrics["advantage_mean"] = float(advantages.mean())
    metrics["ratio_mean"] = float(ratios.mean())
    return metrics


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target); NaN when the target has no variance."""
    var_target = torch.var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1 - torch.var(target - predicted) / var_target)
