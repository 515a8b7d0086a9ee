"""The MLP actor-critic used for vector observations (CartPole, Gymnasium Box envs).

Importable without any learner part: actor hosts run exactly this module for inference.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from actors.envs.base import EnvSpec
from configs.schema import ModelSection


def _layer(inputs: int, outputs: int, gain: float) -> nn.Linear:
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def _torso(inputs: int, model: ModelSection) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for _ in range(model.num_layers):
        layers += [_layer(width, model.hidden_size, math.sqrt(2)), nn.Tanh()]
        width = model.hidden_size
    return nn.Sequential(*layers)


class MLPPolicy(nn.Module):
    """Actor-critic: observation -> (action logits, value); one torso or one per head (model.shared_torso)."""

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        self.obs_size = int(np.prod(spec.obs_shape))
        self.obs_ndim = len(spec.obs_shape)
        self.obs_scale = 1.0 / 255.0 if np.dtype(spec.obs_dtype) == np.uint8 else 1.0
        width = model.hidden_size if model.num_layers else self.obs_size
        self.torso = _torso(self.obs_size, model)
        self.critic_torso = None if model.shared_torso else _torso(self.obs_size, model)
        self.actor = _layer(width, spec.num_actions, 0.01)
        self.critic = _layer(width, 1, 1.0)

    state_size = 0
    """Floats of recurrent state per agent (none: feed-forward)."""

    def forward_rows(self, obs: torch.Tensor, dones: torch.Tensor,
                     state0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [S, T, *obs_shape] -> logits [S, T, A], values [S, T]; dones and state0 [S, 0] are unused."""
        return self(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [..., *obs_shape] in its env dtype -> logits [..., num_actions], value [...]."""
        lead = obs.shape[: obs.dim() - self.obs_ndim]
        flat = obs.reshape(*lead, self.obs_size).to(torch.float32) * self.obs_scale
        hidden = self.torso(flat)
        critic_hidden = hidden if self.critic_torso is None else self.critic_torso(flat)
        return self.actor(hidden), self.critic(critic_hidden).squeeze(-1)


def make_policy(spec: EnvSpec, model: ModelSection) -> MLPPolicy:
    """The policy for an env spec (one place to choose the architecture)."""
    return MLPPolicy(spec, model)


def state_arrays(policy: nn.Module) -> dict[str, np.ndarray]:
    """Parameters and buffers as contiguous CPU NumPy arrays (for the wire and for safetensors)."""
    return {name: t.detach().to("cpu").contiguous().numpy() for name, t in policy.state_dict().items()}


def load_state_arrays(policy: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load arrays produced by ``state_arrays`` (strict: names and shapes must match)."""
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in arrays.items()}
    policy.load_state_dict(state, strict=True)
