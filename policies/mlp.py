"""The MLP actor-critic used for vector observations (CartPole, Gymnasium Box envs), and its building blocks.

Importable without any learner part: actor hosts run exactly this module for inference. ``policies.lstm``
builds its recurrent policy from the helpers here (``ObsInput``, ``layer``, ``torso``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from actors.envs.base import EnvSpec
from configs.schema import ModelSection
from policies.distributions import ActionDistribution, ActionHead

if TYPE_CHECKING:
    from policies.lstm import LSTMPolicy


def layer(inputs: int, outputs: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights of the given gain and zero bias."""
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def torso(inputs: int, model: ModelSection) -> nn.Sequential:
    """``model.num_layers`` tanh layers of ``model.hidden_size`` (empty, the identity, for 0 layers)."""
    layers: list[nn.Module] = []
    width = inputs
    for _ in range(model.num_layers):
        layers += [layer(width, model.hidden_size, math.sqrt(2)), nn.Tanh()]
        width = model.hidden_size
    return nn.Sequential(*layers)


def torso_width(inputs: int, model: ModelSection) -> int:
    """Features out of ``torso(inputs, model)``."""
    return model.hidden_size if model.num_layers else inputs


class ObsInput(nn.Module):
    """Observations in their env dtype [..., *obs_shape] -> float32 features [..., obs_size] (uint8 / 255)."""

    def __init__(self, spec: EnvSpec) -> None:
        super().__init__()
        self.obs_size = int(np.prod(spec.obs_shape))
        self.obs_ndim = len(spec.obs_shape)
        self.obs_scale = 1.0 / 255.0 if np.dtype(spec.obs_dtype) == np.uint8 else 1.0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Flatten the observation dims and convert to float32."""
        lead = obs.shape[: obs.dim() - self.obs_ndim]
        return obs.reshape(*lead, self.obs_size).to(torch.float32) * self.obs_scale


class MLPPolicy(nn.Module):
    """Actor-critic: observation -> (action params, value); one torso or one per head (model.shared_torso).

    "params" are what ``self.distribution`` reads: logits for the discrete kinds, mean and log-std for box.
    """

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        self.inputs = ObsInput(spec)
        size = self.inputs.obs_size
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
        flat = self.inputs(obs)
        hidden = self.torso(flat)
        critic_hidden = hidden if self.critic_torso is None else self.critic_torso(flat)
        return self.actor(hidden), self.critic(critic_hidden).squeeze(-1)


def make_policy(spec: EnvSpec, model: ModelSection) -> MLPPolicy | LSTMPolicy:
    """The policy for an env spec and ``model.core`` (the one place that chooses the architecture)."""
    if model.core == "mlp":
        return MLPPolicy(spec, model)
    if model.core == "lstm":
        from policies.lstm import LSTMPolicy  # imported here: policies.lstm builds on this module

        return LSTMPolicy(spec, model)
    raise ValueError(f"unknown model.core {model.core!r}; allowed: 'mlp', 'lstm'")


def state_arrays(policy: nn.Module) -> dict[str, np.ndarray]:
    """Parameters and buffers as contiguous CPU NumPy arrays (for the wire and for safetensors)."""
    return {name: t.detach().to("cpu").contiguous().numpy() for name, t in policy.state_dict().items()}


def load_state_arrays(policy: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load arrays produced by ``state_arrays`` (strict: names and shapes must match)."""
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in arrays.items()}
    policy.load_state_dict(state, strict=True)
