"""A team's actors for COMA (seeds/004): one ``GaussianActor`` per agent, or one shared actor fed a one-hot agent id.

The same module acts on actor hosts (the weights the learner publishes) and learns in the learner
(``learner.coma.algorithm.Coma``, which also keeps a target copy). ``heads`` maps every agent's observation to its
own actor's (mean, log-std); sampling and squashing onto the env's Box are ``policies.tanh_gaussian``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from configs.schema import ComaSection
from envs.base import EnvSpec
from envs.errors import EnvConfigError
from policies.gaussian_actor import GaussianActor


@dataclass(frozen=True, kw_only=True)
class ComaShapes:
    """The sizes of a cooperative continuous env, as COMA's networks need them."""

    num_agents: int
    """N: agents per env."""
    obs_dim: int
    """Length of one agent's (flat, float) observation."""
    state_dim: int
    """Length of the global state."""
    action_low: tuple[float, ...]
    """One agent's Box action lower bounds (A values)."""
    action_high: tuple[float, ...]
    """Its upper bounds."""
    noop_action: tuple[float, ...]
    """The env's no-op action (coma.default_action zero)."""

    @property
    def action_dim(self) -> int:
        """A: dimensions of one agent's action."""
        return len(self.action_low)


def team_shapes(spec: EnvSpec) -> ComaShapes:
    """COMA's sizes for an env; EnvConfigError unless it has Box actions and a global state (``EnvSpec.state_size``).
    The no-op action (coma.default_action zero) is the zero vector clipped into the Box."""
    if spec.action.kind != "box":
        raise EnvConfigError(f"trainer.algorithm coma needs continuous (box) actions; this env's are "
                             f"{spec.action.describe()}")
    if spec.state_size < 1:
        raise EnvConfigError("trainer.algorithm coma needs an env with a global state for its centralised critic "
                             "(EnvSpec.state_size > 0; PettingZoo envs: state_space and state()); this env has none")
    low, high = np.asarray(spec.action.low), np.asarray(spec.action.high)
    return ComaShapes(num_agents=spec.num_agents, obs_dim=int(np.prod(spec.obs_shape)), state_dim=spec.state_size,
                      action_low=spec.action.low, action_high=spec.action.high,
                      noop_action=tuple(float(x) for x in np.clip(0.0, low, high)))


class TeamActors(nn.ModuleList):
    """The actors of ``num_agents`` agents: element i is agent i's (a single element under parameter sharing)."""

    state_size = 0
    """Recurrent state width (the actors are feed-forward)."""

    def __init__(self, *, num_agents: int, obs_dim: int, action_dim: int, hidden: tuple[int, ...] | list[int],
                 parameter_sharing: bool) -> None:
        if num_agents < 1:
            raise ValueError(f"TeamActors: num_agents must be >= 1, got {num_agents}")
        actor_in = obs_dim + (num_agents if parameter_sharing else 0)
        super().__init__([GaussianActor(actor_in, action_dim, tuple(hidden))
                          for _ in range(1 if parameter_sharing else num_agents)])
        self.num_agents = num_agents
        self.parameter_sharing = parameter_sharing
        self.register_buffer("agent_ids", torch.eye(num_agents), persistent=False)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [..., N, obs_dim] float -> (mean, log_std) [..., N, A], agent i from its own actor (or the shared one
        with agent i's one-hot id appended)."""
        if self.parameter_sharing:
            ids = self.agent_ids.expand(*obs.shape[:-1], -1)
            return self[0](torch.cat([obs, ids], dim=-1))
        outputs = [actor(obs[..., i, :]) for i, actor in enumerate(self)]
        return torch.stack([m for m, _ in outputs], dim=-2), torch.stack([s for _, s in outputs], dim=-2)


def make_team_actors(shapes: ComaShapes, section: ComaSection) -> TeamActors:
    """The team's actors as the coma section shapes them (the learner's, and the actor hosts' copy)."""
    return TeamActors(num_agents=shapes.num_agents, obs_dim=shapes.obs_dim, action_dim=shapes.action_dim,
                      hidden=section.hidden_sizes, parameter_sharing=section.parameter_sharing)
