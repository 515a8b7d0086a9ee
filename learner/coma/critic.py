"""COMA's centralised critic (seeds/004): global state and joint action -> one Q-value per agent.

``[state, u_1, ..., u_N] -> Dense(256) + ReLU -> Dense(256) + ReLU -> Q [num_agents]``. It is used only by the
learner (centralised training); actors act from their local observations alone (decentralised execution).
"""

from __future__ import annotations

import torch
from torch import nn

from policies.layers import relu_mlp


class CentralCritic(nn.Module):
    """Q(s, u) in R^num_agents over the global state s and the joint action u (every agent's env action)."""

    def __init__(self, state_dim: int, joint_action_dim: int, num_agents: int,
                 hidden: tuple[int, ...] | list[int] = (256, 256)) -> None:
        super().__init__()
        if min(state_dim, joint_action_dim, num_agents) < 1 or not hidden or min(hidden) < 1:
            raise ValueError(f"CentralCritic: state_dim ({state_dim}), joint_action_dim ({joint_action_dim}), "
                             f"num_agents ({num_agents}) and every hidden width ({list(hidden)}) must be positive "
                             f"integers, with at least one hidden layer")
        self.state_dim = state_dim
        self.joint_action_dim = joint_action_dim
        self.num_agents = num_agents
        self.net = relu_mlp(state_dim + joint_action_dim, hidden, num_agents, output_gain=1.0)

    def forward(self, state: torch.Tensor, joint_action: torch.Tensor) -> torch.Tensor:
        """state [..., state_dim], joint_action [..., joint_action_dim] (agents' actions concatenated in agent
        order) -> Q [..., num_agents]."""
        return self.net(torch.cat([state, joint_action], dim=-1))
