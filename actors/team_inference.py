"""COMA's actors on an actor host: every agent of an env decided together by its own tanh-Gaussian actor.

The weights are the learner's ``policies.team_actors.TeamActors`` (``learner.coma.algorithm.Coma.actors``). Each
decision keeps the pre-tanh draw ``u`` (what the rows carry, so the learner recomputes log-probabilities without
inverting tanh), the env action ``squash(u)`` on the env's Box, and each agent's behaviour log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from actors.inference import HostPolicy
from configs.schema import ComaSection
from envs.base import EnvSpec
from policies import tanh_gaussian
from policies.team_actors import make_team_actors, team_shapes


@dataclass(frozen=True, kw_only=True)
class TeamDecisions:
    """What the team's actors decided for a batch of envs."""

    pre_tanh: np.ndarray
    """[E, N, A] float32 Gaussian draws before the squash (what team rows carry as actions)."""
    actions: np.ndarray
    """[E, N, A] float32 env actions, squash(pre_tanh) on the env's Box."""
    logprobs: np.ndarray
    """[E, N] float32 each agent's behaviour log-probability of its action."""


class TeamInference(HostPolicy):
    """The current team actors, their version, and a seeded sampler."""

    state_size = 0
    """Recurrent state width (the actors are feed-forward)."""

    def __init__(self, spec: EnvSpec, section: ComaSection, *, seed: int) -> None:
        self.shapes = team_shapes(spec)
        super().__init__(make_team_actors(self.shapes, section), seed=seed)
        self.low = torch.tensor(self.shapes.action_low, dtype=torch.float32)
        self.high = torch.tensor(self.shapes.action_high, dtype=torch.float32)

    @torch.no_grad()
    def decide(self, obs: np.ndarray) -> TeamDecisions:
        """obs [E, N, *obs_shape] (any numeric dtype) -> one draw per agent from its own actor."""
        flat = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), self.shapes.num_agents,
                                                                                     -1))
        mean, log_std = self.policy.heads(flat)
        u, action, log_prob = tanh_gaussian.sample(mean, log_std, self.low, self.high, self.generator)
        return TeamDecisions(pre_tanh=u.numpy(), actions=action.numpy(), logprobs=log_prob.numpy())
