"""Batched policy inference on an actor host: sample actions, log-probs, values (and truncation values)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from actors.envs.base import EnvSpec
from configs.schema import ModelSection
from policies.mlp import load_state_arrays, make_policy


@dataclass(frozen=True, kw_only=True)
class Decisions:
    """What the policy decided for a batch of agents."""

    actions: np.ndarray
    """[n] int32 sampled actions."""
    logprobs: np.ndarray
    """[n] float32 behaviour log-probs of those actions."""
    values: np.ndarray
    """[n] float32 value estimates of the observations."""


class Inference:
    """The current policy, its version, and a seeded sampler."""

    def __init__(self, spec: EnvSpec, model: ModelSection, *, seed: int) -> None:
        self.policy = make_policy(spec, model)
        self.policy.eval()
        self.version = 0
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def load(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Switch to the given weights."""
        load_state_arrays(self.policy, arrays)
        self.version = version

    @torch.no_grad()
    def decide(self, obs: np.ndarray) -> Decisions:
        """Sample one action per observation."""
        logits, values = self.policy(torch.from_numpy(obs))
        logp = torch.log_softmax(logits, dim=-1)
        actions = torch.multinomial(logp.exp(), 1, generator=self.generator)
        return Decisions(actions=actions.squeeze(-1).to(torch.int32).numpy(),
                         logprobs=logp.gather(-1, actions).squeeze(-1).numpy(),
                         values=values.numpy())

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """Value estimates only (for the final observations of truncated episodes)."""
        return self.policy(torch.from_numpy(obs))[1].numpy()
