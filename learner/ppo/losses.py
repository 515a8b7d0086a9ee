"""The PPO losses of one minibatch, as seeds/000 and seeds/003 write them (CleanRL naming).

``minibatch_losses`` is a pure function of tensors (the scheduled coefficients arrive as one tensor so a
``torch.compile``d version does not recompile when a schedule moves), so it can be compiled as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Order of the values packed into the ``coefs`` tensor.
CLIP_COEF, VF_CLIP_COEF, ENT_COEF, VF_COEF, KL_COEF = range(5)


@dataclass(frozen=True, kw_only=True)
class Minibatch:
    """The rows of one minibatch; per-step tensors are [M, T] (T = bptt_horizon). The fields are what
    ``learner.update.batch.minibatch_rows`` takes from the rows, and ``learner.update.batch.MINIBATCH_DERIVED``."""

    obs: torch.Tensor
    """[M, T, *obs_shape] observations."""
    actions: torch.Tensor
    """[M, T, *action_shape] actions taken (int64 for the discrete kinds, float32 for box)."""
    action_masks: torch.Tensor
    """[M, T, mask_size] legal-action flags the actor sampled under (mask_size 0: no masks)."""
    dones: torch.Tensor
    """[M, T] 1.0 where an episode ended on the transition into the step (recurrent-state resets)."""
    states: torch.Tensor
    """[M, state_size] recurrent state before step 0."""
    old_logprobs: torch.Tensor
    """[M, T] behaviour log-probs."""
    old_values: torch.Tensor
    """[M, T] behaviour values."""
    advantages: torch.Tensor
    """[M, T] V-trace-clipped GAE advantages."""
    returns: torch.Tensor
    """[M, T] advantages + behaviour values."""
    is_weights: torch.Tensor
    """[M] importance-sampling weights of the sampled rows."""


def minibatch_losses(policy: nn.Module, reference: nn.Module | None, mb: Minibatch, coefs: torch.Tensor, *,
                     norm_adv: bool, clip_vloss: bool, vf_warmup: bool) -> dict[str, torch.Tensor]:
    """Every loss term and health statistic of one minibatch (0-dim tensors; ``loss`` is what to minimise)."""
    clip_coef, vf_clip_coef = coefs[CLIP_COEF], coefs[VF_CLIP_COEF]
    dist = policy.distribution
    mask = mb.action_masks if mb.action_masks.shape[-1] else None
    params, newvalue = policy.forward_rows(mb.obs, mb.dones, mb.states)
    newlogprob = dist.log_prob(params, mask, mb.actions)
    entropy = dist.entropy(params, mask)
    logratio = newlogprob - mb.old_logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()

    mb_advantages = mb.advantages
    if norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    mb_advantages = mb.is_weights.unsqueeze(1) * mb_advantages

    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    if clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_clipped = mb.old_values + torch.clamp(newvalue - mb.old_values, -vf_clip_coef, vf_clip_coef)
        v_loss = torch.max(v_loss_unclipped, (v_clipped - mb.returns) ** 2).mean()
    else:
        v_loss = ((newvalue - mb.returns) ** 2).mean()
    entropy_loss = -entropy.mean()

    if reference is not None:
        with torch.no_grad():
            ref_params, _ = reference.forward_rows(mb.obs, mb.dones, mb.states)
        # KL(pi || pi_ref), exact: sum_a pi(a) (log pi(a) - log pi_ref(a)) per categorical, closed form for box
        kl_loss = dist.kl(params, ref_params, mask).mean()
    else:
        kl_loss = torch.zeros((), device=v_loss.device)

    if vf_warmup:
        loss = coefs[VF_COEF] * v_loss + coefs[KL_COEF] * kl_loss
    else:
        loss = pg_loss + coefs[VF_COEF] * v_loss + coefs[ENT_COEF] * entropy_loss + coefs[KL_COEF] * kl_loss
    return {"loss": loss, "policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(),
            "entropy": -entropy_loss.detach(), "kl_loss": kl_loss.detach(), "approx_kl": approx_kl,
            "clipfrac": clipfrac}
