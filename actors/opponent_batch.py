"""Several pool snapshots' forward passes as one: ``torch.func.vmap`` over their stacked weights.

In self-play each env of an actor host plays its own snapshot, so one step has G snapshots acting on a few rows
each (a 2-core profile of Connect Four with 128 envs per forward pass: about 8 snapshots on about 8 rows each,
their forward passes 69% of the host's time). ``SnapshotBatch`` stacks the parameters and buffers of every
snapshot the host's envs play (``torch.func.stack_module_state``; again only when that set changes: restacking
every step cost 1.5x the batched pass, ``ops/bench/opponent_inference.py``), takes a step's snapshots from the stack by index, pads each snapshot's rows to
the largest group, and runs the policy once under ``vmap``; the actions of all real rows are then sampled in one
call. Same policies, same distributions: a test checks the logits against G separate passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

    def logits(self, stacked: Mapping[str, nn.Module], chosen: Sequence[str],
               obs_groups: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Action params of snapshot ``chosen[g]`` for its rows ``obs_groups[g]`` [n_g, *obs_shape]. ``stacked``
        (digest -> policy) holds every snapshot in use; their weights are stacked again only when it changes, and
        a step takes the ones it needs by index."""
        self._stack(stacked)
        if tuple(chosen) == self.key:
            weights = self.weights
        else:
            where = torch.tensor([self.key.index(digest) for digest in chosen])
            weights = tuple({name: value[where] for name, value in part.items()} for part in self.weights)
        longest = max(len(group) for group in obs_groups)
        padded = np.zeros((len(obs_groups), longest, *obs_groups[0].shape[1:]), dtype=obs_groups[0].dtype)
        for g, group in enumerate(obs_groups):
            padded[g, :len(group)] = group
        template = self.template

        def forward(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    obs: torch.Tensor) -> torch.Tensor:
            return functional_call(template, (params, buffers), (obs,))[0]

        with torch.no_grad():
            params = vmap(forward)(*weights, torch.from_numpy(padded))
        return [params[g, :len(group)] for g, group in enumerate(obs_groups)]

    def act(self, stacked: Mapping[str, nn.Module], chosen: Sequence[str], obs_groups: Sequence[np.ndarray],
            mask_groups: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """Sampled actions of snapshot ``chosen[g]`` for its rows (masks per group, or None); see ``logits``."""
        params = torch.cat(self.logits(stacked, chosen, obs_groups))
        mask = None
        if mask_groups is not None and mask_groups[0].shape[-1]:
            mask = torch.from_numpy(np.concatenate(mask_groups))
        with torch.no_grad():
            actions, _ = self.distribution.sample(params, mask, self.generator)
        return np.split(actions.numpy(), np.cumsum([len(group) for group in obs_groups])[:-1])

    def _stack(self, stacked: Mapping[str, nn.Module]) -> None:
        key = tuple(stacked)
        if key == self.key and self.template is not None:
            return
        with torch.no_grad():
            params, buffers = stack_module_state(list(stacked.values()))
        self.weights = ({name: value.detach() for name, value in params.items()},
                        {name: value.detach() for name, value in buffers.items()})
        self.template = next(iter(stacked.values()))
        self.key = key
