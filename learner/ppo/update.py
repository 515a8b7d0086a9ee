"""One PPO update over a batch of rows, exactly as seeds/000 writes it (the losses: learner/ppo/losses.py).

Which forward pass gives pi_current for the V-trace ratios: the learner's policy *at the start of the
update*, on the whole batch, before any gradient step. That is the policy the advantages are computed
for; the per-minibatch PPO ratio then compares the moving policy against the behaviour log-probs that
the actors recorded, which is what the clip must bound.

Rows that would make a gradient step non-finite are dropped from the update, not the update itself
(``usable_rows``): a row is dropped when a step of it has a non-finite advantage or return, or a start-of-update
log-ratio that is non-finite or above LOG_RATIO_LIMIT. Dropped rows get sampling probability 0, so every
minibatch holds only usable rows and trains; they are counted as ``rows_dropped_nonfinite`` and left out of the
update's batch metrics and of the value normaliser's statistics. Only where fewer usable rows remain than one
minibatch holds are minibatches drawn from every row as before, and a step whose minibatch holds a dropped row is
skipped by the optimizer guard (``skipped_steps``, learner/update/optimizer_step.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from configs.plan import BatchPlan
from configs.schema import TrainerSection
from learner.ppo.advantage import compute_advantages
from learner.ppo.autocast import autocast_context
from learner.update.batch import RowBatch, minibatch_rows
from learner.ppo.losses import Minibatch, minibatch_losses
from learner.update.optimizer_step import step_unless_nonfinite
from learner.update.reducer import SINGLE_PROCESS, Reducer
from learner.ppo.schedules import UpdateSchedule
from learner.ppo.value_normalization import RunningMeanStd

LossFn = Callable[..., dict[str, torch.Tensor]]

INFERENCE_CHUNK_ROWS = 1024
LOG_RATIO_LIMIT = 20.0
"""Largest start-of-update log-ratio log(pi_current / pi_behaviour) a usable row may hold (ratio e^20 = 4.9e8).
The unclipped PPO term ``-A * ratio`` carries the ratio into the gradient, and clip_grad_norm_ squares gradient
elements in float32, which overflows above sqrt(3.4e38) = 1.8e19; e^20 leaves a factor 3.7e10 for the advantage,
its IS weight and d log pi / d theta. A genuine row at this ratio was drawn with probability below 2e-9 of what
the current policy gives its action, and would dominate its step after clipping anyway."""


def sampling_probs(advantages: torch.Tensor, prio_alpha: float, reducer: Reducer = SINGLE_PROCESS) -> torch.Tensor:
    """Row sampling probabilities of seeds/000: (|A| summed over time) ** alpha, normalised with its 1e-6.

    prio_alpha 0 is exactly uniform. When every advantage is 0 the seed's formula would give every row
    probability 1 (and IS weights of segments ** -beta); that degenerate case is uniform instead. With K ranks
    (``reducer``) each holds its rows' probabilities over the whole batch: the total and the row count are global.
    """
    segments = advantages.shape[0]
    uniform = torch.full((segments,), 1.0 / (segments * reducer.world_size), device=advantages.device)
    if prio_alpha == 0.0:
        return uniform
    prio_weights = advantages.abs().sum(dim=1) ** prio_alpha
    total = reducer.sum(prio_weights.sum())
    probs = (prio_weights + 1e-6) / (total + 1e-6)
    return torch.where(total > 0, probs, uniform)


def usable_rows(logratios: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """[S] bool: rows whose steps all have finite advantages and returns and a log-ratio that is finite and at most
    LOG_RATIO_LIMIT (the module docstring); computed on the device."""
    finite = torch.isfinite(advantages) & torch.isfinite(returns) & torch.isfinite(logratios)
    return (finite & (logratios <= LOG_RATIO_LIMIT)).all(dim=1)


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
               reference: nn.Module | None = None, loss_fn: LossFn = minibatch_losses,
               value_normalizer: RunningMeanStd | None = None,
               reducer: Reducer = SINGLE_PROCESS, autocast: str = "none") -> dict[str, float]:
    """Advantages, prioritized minibatches, clipped losses, gradient steps; returns the update's metrics.

    ``reference`` is the KL-penalty policy (used when schedule.kl_coef > 0); ``loss_fn`` may be a compiled
    ``minibatch_losses``; ``value_normalizer`` (norm_value_targets) holds the running return statistics the value
    head predicts in (learner/ppo/value_normalization.py; updated here); ``reducer`` makes it one rank's share of a
    data-parallel update (learner/ranks/distributed.py; ``plan`` is then the rank's plan, configs/rank_plan.py);
    ``autocast`` (trainer.autocast) runs the forward passes and losses under torch.autocast (learner/ppo/autocast.py).
    Loss statistics stay on the device until the end: a fused optimizer skips a non-finite gradient's step on the
    device (learner/update/optimizer_step.py; any other optimizer costs a host sync per step), target_kl costs one sync
    per optimizer step to test the KL, and the metrics one batch of syncs per update.
    """
    horizon = batch.dones.shape[1] - 1
    rows = minibatch_rows(batch, horizon)
    old_values = rows["old_values"]
    device = old_values.device
    values, bootstrap = batch.values, batch.bootstrap
    if value_normalizer is not None:  # the actors' values are normalised; GAE needs them in the returns' units
        values = value_normalizer.denormalize(values)
        bootstrap = torch.where(bootstrap != 0, value_normalizer.denormalize(bootstrap), bootstrap)
        old_values = value_normalizer.denormalize(old_values)

    with autocast_context(device, autocast):
        logprobs = current_logprobs(policy, rows["obs"], rows["actions"], rows["action_masks"], rows["dones"],
                                    rows["states"])
    logratios = logprobs - rows["old_logprobs"]
    ratios = torch.exp(logratios)
    rewards = batch.rewards + trainer.gamma * bootstrap
    advantages = compute_advantages(values, rewards, batch.dones, ratios, gamma=trainer.gamma,
                                    gae_lambda=trainer.gae_lambda, rho_clip=trainer.vtrace_rho_clip,
                                    c_clip=trainer.vtrace_c_clip).to(device)
    returns = advantages + old_values
    usable = usable_rows(logratios, advantages, returns)
    dropped = int((~usable).sum())  # one host sync per update
    all_usable = reducer.gather(usable)
    value_targets = returns
    if value_normalizer is not None:  # the value loss compares normalised predictions with normalised targets
        value_normalizer.update(reducer.gather(returns)[all_usable])
        value_targets = value_normalizer.normalize(returns)
        rows = {**rows, "old_values": value_normalizer.normalize(old_values)}
    sampled_advantages = torch.where(usable.unsqueeze(1), advantages, 0.0) if dropped else advantages
    probs = sampling_probs(sampled_advantages, trainer.prio_alpha, reducer)
    if dropped and len(usable) - dropped >= plan.minibatch_segments:  # minibatches of usable rows only
        probs = torch.where(usable, probs, 0.0)
    coefs = torch.tensor([schedule.clip_coef, trainer.vf_clip_coef, schedule.ent_coef, trainer.vf_coef,
                          schedule.kl_coef], dtype=torch.float32, device=device)
    use_reference = reference if schedule.kl_coef > 0 else None

    for group in optimizer.param_groups:
        group["lr"] = schedule.learning_rate
    accumulation = trainer.gradient_accumulation
    terms: list[dict[str, torch.Tensor]] = []
    sampled_weights: list[torch.Tensor] = []
    grad_norms: list[torch.Tensor] = []
    skip_flags: list[torch.Tensor] = []
    minibatch_steps = 0
    early_stopped = False
    optimizer.zero_grad(set_to_none=True)
    for _epoch in range(trainer.update_epochs):
        epoch_start = len(terms)
        for minibatch in range(plan.num_minibatches):
            idx = torch.multinomial(probs, plan.minibatch_segments, replacement=False, generator=generator)
            is_weights = (plan.segments * reducer.world_size * probs[idx]) ** (-schedule.anneal_beta)
            mb_advantages, norm_adv = advantages[idx], trainer.norm_adv
            if norm_adv and reducer.world_size > 1:  # normalised over the whole minibatch, all ranks' rows
                gathered = reducer.gather(mb_advantages)
                mb_advantages, norm_adv = (mb_advantages - gathered.mean()) / (gathered.std() + 1e-8), False
            mb = Minibatch(**{name: tensor[idx] for name, tensor in rows.items()}, advantages=mb_advantages,
                           returns=value_targets[idx], is_weights=is_weights)
            with autocast_context(device, autocast):
                out = loss_fn(policy, use_reference, mb, coefs, norm_adv=norm_adv,
                              clip_vloss=trainer.clip_vloss, vf_warmup=schedule.vf_warmup)
            loss = out["loss"].float()  # backward outside autocast, from a float32 loss
            (loss / accumulation).backward()  # gradients of `accumulation` minibatches are averaged
            terms.append({k: v.detach().float() for k, v in out.items()})
            sampled_weights.append(is_weights)
            minibatch_steps += 1
            if (minibatch + 1) % accumulation:
                continue
            reducer.average_gradients(policy.parameters())
            grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), trainer.max_grad_norm)
            # a NaN/inf loss or gradient skips the step, never the weights
            skip_flags.append(step_unless_nonfinite(optimizer, grad_norm))
            grad_norms.append(grad_norm)
            optimizer.zero_grad(set_to_none=True)
            if trainer.target_kl is not None and epoch_kl(terms[epoch_start:], reducer) > trainer.target_kl:
                early_stopped = True  # CleanRL's KL early stopping: the rest of this update is skipped
                break
        if early_stopped:
            break

    metrics = {k: float(reducer.average(torch.stack([t[k] for t in terms]).mean())) for k in terms[0] if k != "loss"}
    metrics["total_loss"] = float(reducer.average(torch.stack([t["loss"] for t in terms]).mean()))
    weights = reducer.gather(torch.cat(sampled_weights))
    metrics.update(is_weight_mean=float(weights.mean()), is_weight_min=float(weights.min()),
                   is_weight_max=float(weights.max()))
    metrics.update(step_metrics(grad_norms, skip_flags))
    metrics["explained_variance"] = explained_variance(reducer.gather(old_values)[all_usable],
                                                       reducer.gather(returns)[all_usable])
    metrics["minibatch_steps"] = float(minibatch_steps)
    metrics["early_stopped"] = float(early_stopped)
    metrics.update(schedule.as_metrics())
    metrics["advantage_mean"] = float(reducer.gather(advantages)[all_usable].mean())
    metrics["ratio_mean"] = float(reducer.gather(ratios)[all_usable].mean())
    metrics["rows_dropped_nonfinite"] = float((~all_usable).sum())
    return metrics


def step_metrics(grad_norms: list[torch.Tensor], skip_flags: list[torch.Tensor]) -> dict[str, float]:
    """gradient_steps and skipped_steps from the optimizer steps' skip flags, and grad_norm, the mean pre-clip norm
    of the steps taken (NaN when none was): one host sync."""
    if not skip_flags:
        return {"grad_norm": float("nan"), "gradient_steps": 0.0, "skipped_steps": 0.0}
    skipped = torch.stack(skip_flags)
    taken = skipped == 0
    norm_sum = torch.where(taken, torch.stack(grad_norms).float(), 0.0).sum()
    skipped_steps, norm_sum, taken_steps = torch.stack([skipped.sum(), norm_sum, taken.sum().float()]).tolist()
    return {"grad_norm": norm_sum / taken_steps if taken_steps else float("nan"), "gradient_steps": taken_steps,
            "skipped_steps": skipped_steps}


def epoch_kl(epoch_terms: list[dict[str, torch.Tensor]], reducer: Reducer = SINGLE_PROCESS) -> float:
    """The running approx_kl of an epoch: the mean over the minibatches it has taken so far (and over the ranks)."""
    return float(reducer.average(torch.stack([t["approx_kl"] for t in epoch_terms]).mean()))


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target); NaN when the target has no variance (or fewer than 2 values)."""
    if target.numel() < 2:
        return float("nan")
    var_target = torch.var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1 - torch.var(target - predicted) / var_target)
