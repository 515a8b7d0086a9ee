"""Action distributions for every action space, and the policy head that parameterises them.

The policy's actor head outputs ``space.param_size`` numbers per agent and step (``params``):

* discrete / multi_discrete: ``sum(nvec)`` logits, one block of ``nvec[i]`` per component; the components
  are independent categoricals, so log-probabilities, entropies and KLs add up over components. An action
  mask (uint8/bool, same width, 1 = legal) sets the logits of illegal actions to ``MASKED_LOGIT`` before the
  softmax, so they get probability exactly 0 and no gradient. A component whose mask allows nothing is left
  unmasked (finished PettingZoo agents report all-zero masks).
* box: ``d`` means then ``d`` log standard deviations of a diagonal Gaussian (the log-std is a learned
  parameter, independent of the observation). Samples are unclipped; the env adapter clips to bounds.

Everything is a function of tensors, so the learner's loss (possibly ``torch.compile``d) and the actors'
sampler share one definition.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from envs.spaces import ActionSpace

MASKED_LOGIT = -1e9
"""Logit of an illegal action: exp underflows to exactly 0, and 0 * MASKED_LOGIT stays finite."""
_LOG_2PI = math.log(2 * math.pi)


class ActionHead(nn.Module):
    """hidden features -> distribution params: a linear layer (orthogonal, gain 0.01), plus a log-std for box."""

    def __init__(self, space: ActionSpace, inputs: int) -> None:
        super().__init__()
        self.continuous = space.kind == "box"
        outputs = len(space.low) if self.continuous else space.num_logits
        self.linear = nn.Linear(inputs, outputs)
        nn.init.orthogonal_(self.linear.weight, 0.01)
        nn.init.zeros_(self.linear.bias)
        self.log_std = nn.Parameter(torch.zeros(outputs)) if self.continuous else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., inputs] -> params [..., space.param_size]."""
        out = self.linear(hidden)
        if self.log_std is None:
            return out
        return torch.cat([out, self.log_std.expand_as(out)], dim=-1)


class ActionDistribution:
    """Sampling, log-probabilities, entropy and KL for one action space (stateless; tensors in, tensors out)."""

    def __init__(self, space: ActionSpace) -> None:
        self.space = space
        self.continuous = space.kind == "box"
        self.nvec = list(space.nvec)
        self.dims = len(space.low)

    # -- discrete kinds ------------------------------------------------------------------------------------
    def component_log_probs(self, params: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
        """Per-component log-softmax [..., nvec[i]] after masking."""
        out = []
        offset = 0
        for n in self.nvec:
            logits = params[..., offset:offset + n]
            if mask is not None and mask.shape[-1]:
                legal = mask[..., offset:offset + n] != 0
                legal = legal | ~legal.any(dim=-1, keepdim=True)  # nothing legal: leave the component alone
                logits = torch.where(legal, logits, torch.full_like(logits, MASKED_LOGIT))
            out.append(torch.log_softmax(logits, dim=-1))
            offset += n
        return out

    def _components(self, actions: torch.Tensor) -> list[torch.Tensor]:
        """Actions [..., *shape] -> one int64 index tensor [...] per component."""
        if self.space.kind == "discrete":
            return [actions.long()]
        return [actions[..., i].long() for i in range(len(self.nvec))]

    # -- public API ----------------------------------------------------------------------------------------
    def sample(self, params: torch.Tensor, mask: torch.Tensor | None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions [n, *space.shape] (int32 or float32) and their log-probs [n], for params [n, param_size]."""
        if self.continuous:
            mean, log_std = params[..., :self.dims], params[..., self.dims:]
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            actions = mean + log_std.exp() * noise
            return actions.to(torch.float32), self.log_prob(params, mask, actions)
        picks, logprob = [], torch.zeros(params.shape[:-1], device=params.device)
        for logp in self.component_log_probs(params, mask):
            choice = torch.multinomial(logp.exp(), 1, generator=generator)
            logprob = logprob + logp.gather(-1, choice).squeeze(-1)
            picks.append(choice.squeeze(-1))
        actions = picks[0] if self.space.kind == "discrete" else torch.stack(picks, dim=-1)
        return actions.to(torch.int32), logprob

    def mode(self, params: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The most probable actions [n, *space.shape]: per-component argmax of the masked logits, or the mean."""
        if self.continuous:
            return params[..., :self.dims].to(torch.float32)
        picks = [logp.argmax(dim=-1) for logp in self.component_log_probs(params, mask)]
        actions = picks[0] if self.space.kind == "discrete" else torch.stack(picks, dim=-1)
        return actions.to(torch.int32)

    def log_prob(self, params: torch.Tensor, mask: torch.Tensor | None, actions: torch.Tensor) -> torch.Tensor:
        """log pi(actions) [...] for params [..., param_size] and actions [..., *space.shape]."""
        if self.continuous:
            mean, log_std = params[..., :self.dims], params[..., self.dims:]
            z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
            return (-0.5 * z * z - log_std - 0.5 * _LOG_2PI).sum(-1)
        total = torch.zeros(params.shape[:-1], device=params.device)
        for logp, action in zip(self.component_log_probs(params, mask), self._components(actions)):
            total = total + logp.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return total

    def entropy(self, params: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Entropy [...] (summed over components / dimensions)."""
        if self.continuous:
            return (params[..., self.dims:] + 0.5 + 0.5 * _LOG_2PI).sum(-1)
        return sum(-(logp.exp() * logp).sum(-1) for logp in self.component_log_probs(params, mask))

    def kl(self, params: torch.Tensor, ref_params: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """KL(pi || pi_ref) [...], exact, both under the same mask."""
        if self.continuous:
            mean, log_std = params[..., :self.dims], params[..., self.dims:]
            ref_mean, ref_log_std = ref_params[..., :self.dims], ref_params[..., self.dims:]
            var_ratio = torch.exp(2 * (log_std - ref_log_std))
            mean_term = (mean - ref_mean) ** 2 * torch.exp(-2 * ref_log_std)
            return (ref_log_std - log_std + 0.5 * (var_ratio + mean_term - 1)).sum(-1)
        pairs = zip(self.component_log_probs(params, mask), self.component_log_probs(ref_params, mask))
        return sum((logp.exp() * (logp - ref_logp)).sum(-1) for logp, ref_logp in pairs)
