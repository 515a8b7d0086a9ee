"""The MLP actor-critic used for vector observations (CartPole, Gymnasium Box envs).

Importable without any learner part: actor hosts run exactly this module for inference. Its building blocks
(``layer``, ``torso``) are in ``policies.layers``, its observation encoder comes from ``policies.encoders``;
``policies.factory`` chooses the policy.
"""

from __future__ import annotations

import torch
from torch import nn

from configs.schema import ModelSection
from envs.base import EnvSpec
from policies.distributions import ActionDistribution, ActionHead
from policies.encoders import make_encoder
from policies.layers import layer, torso, torso_width


class MLPPolicy(nn.Module):
    """Actor-critic: observation -> encoder -> (action params, value); one torso or one per head (model.shared_torso).

    "params" are what ``self.distribution`` reads: logits for the discrete kinds, mean and log-std for box.
    """

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        self.encoder = make_encoder(spec, model)
        size = self.encoder.out_features
        self.torso = torso(size, model)
        self.critic_torso = None if model.shared_torso else torso(size, model)
        self.actor = ActionHead(spec.action, torso_width(size, model))
        self.critic = layer(torso_width(size, model), 1, 1.0)
        self.distribution = ActionDistribution(spec.action)

    state_size = 0
    """Floats of recurrent state per agent (none: feed-forward)."""

    def forward_rows(self, obs: torch.Tensor, dones: torch.Tensor,
                     state0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [S, T, *obs_shape] -> params [S, T, P], values [S, T]; dones and state0 [S, 0] are unused."""
        return self(obs)

    def step(self, obs: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for [n] agents: params [n, P], values [n] and the (empty, [n, 0]) state unchanged."""
        logits, values = self(obs)
        return logits, values, state

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [..., *obs_shape] in its env dtype -> action params [..., P], value [...]."""
        features = self.encoder(obs)
        hidden = self.torso(features)
        critic_hidden = hidden if self.critic_torso is None else self.critic_torso(features)
        return self.actor(hidden), self.critic(critic_hidden).squeeze(-1)
