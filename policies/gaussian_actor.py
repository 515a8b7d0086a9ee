"""COMA's actor network (seeds/004): local observation -> mean and log-std of a tanh-squashed Gaussian.

``obs [..., obs_dim] -> Dense(256) + ReLU -> Dense(256) + ReLU -> (mean [..., action_dim], log_std [..., action_dim])``.
One actor per agent by default; with parameter sharing one actor serves every agent and the caller appends a
one-hot agent id to the observation (``obs_dim`` then counts it). The distribution itself (sampling, log-prob,
squashing onto the env's Box) is ``policies.tanh_gaussian``.
"""

from __future__ import annotations

import torch
from torch import nn

from policies.layers import relu_mlp
from policies.tanh_gaussian import clamp_log_std


class GaussianActor(nn.Module):
    """Local observation -> (mean, log_std), log_std clamped to [LOG_STD_MIN, LOG_STD_MAX]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...] | list[int] = (256, 256)) -> None:
        super().__init__()
        if obs_dim < 1 or action_dim < 1 or not hidden or min(hidden) < 1:
            raise ValueError(f"GaussianActor: obs_dim ({obs_dim}), action_dim ({action_dim}) and every hidden width "
                             f"({list(hidden)}) must be positive integers, with at least one hidden layer")
        self.action_dim = action_dim
        self.net = relu_mlp(obs_dim, hidden, 2 * action_dim, output_gain=0.01)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [..., obs_dim] float -> (mean [..., action_dim], log_std [..., action_dim])."""
        mean, log_std = self.net(obs).split(self.action_dim, dim=-1)
        return mean, clamp_log_std(log_std)
