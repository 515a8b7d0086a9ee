"""Several pool snapshots' forward passes as one: ``torch.func.vmap`` over their stacked weights.

In self-play each env of an actor host plays its own snapshot, so one step has G snapshots acting on a few rows
each (a 2-core profile of Connect Four with 128 envs per forward pass: about 8 snapshots on about 8 rows each,
their forward passes 69% of the host's time). ``SnapshotBatch`` stacks the G policies' parameters and buffers
(``torch.func.stack_module_state``, rebuilt only when the set of snapshots changes), pads each snapshot's rows to
the largest group, and runs the policy once under ``vmap``; the actions of all real rows are then sampled in one
call. Same policies, same distributions: a test checks the logits against G separate passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from policies.distributions import ActionDistribution


class SnapshotBatch:
    """Batched actions of feed-forward snapshot policies of one architecture (the learner's, as in the pool)."""

    def __init__(self, distribution: ActionDistribution, *, seed: int) -> None:
        self.distribution = distribution
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self.key: tuple[str, ...] = ()
        """The digests whose weights are stacked now."""
        self.template: nn.Module | None = None
        self.weights: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})

    def logits(self, digests: Sequence[str], policies: Sequence[nn.Module],
               obs_groups: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Each snapshot's action params for its own rows (``obs_groups[g]``: [n_g, *obs_shape])."""
        self._stack(tuple(digests), policies)
        longest = max(len(group) for group in obs_groups)
        padded = np.zeros((len(obs_groups), longest, *obs_groups[0].shape[1:]), dtype=obs_groups[0].dtype)
        for g, group in enumerate(obs_groups):
            padded[g, :len(group)] = group
        template = self.template

        def forward(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    obs: torch.Tensor) -> torch.Tensor:
            return functional_call(template, (params, buffers), (obs,))[0]

        with torch.no_grad():
            params = vmap(forward)(*self.weights, torch.from_numpy(padded))
        return [params[g, :len(group)] for g, group in enumerate(obs_groups)]

    def act(self, digests: Sequence[str], policies: Sequence[nn.Module], obs_groups: Sequence[np.ndarray],
            mask_groups: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """Sampled actions per snapshot, for its rows (masks per group, or None)."""
        params = torch.cat(self.logits(digests, policies, obs_groups))
        mask = None
        if mask_groups is not None and mask_groups[0].shape[-1]:
            mask = torch.from_numpy(np.concatenate(mask_groups))
        with torch.no_grad():
            actions, _ = self.distribution.sample(params, mask, self.generator)
        return np.split(actions.numpy(), np.cumsum([len(group) for group in obs_groups])[:-1])

    def _stack(self, key: tuple[str, ...], policies: Sequence[nn.Module]) -> None:
        if key == self.key and self.template is not None:
            return
        with torch.no_grad():
            params, buffers = stack_module_state(list(policies))
        self.weights = ({name: value.detach() for name, value in params.items()},
                        {name: value.detach() for name, value in buffers.items()})
        self.template = policies[0]
        self.key = key
