"""The one place that chooses a policy architecture, and the policy's weights as plain arrays.

``make_policy`` builds the network for an env spec and ``model.core``; ``state_arrays`` /
``load_state_arrays`` move its weights to and from NumPy (for the wire and for safetensors, never pickle).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from configs.schema import ModelSection
from envs.base import EnvSpec
from policies.lstm import LSTMPolicy
from policies.mlp import MLPPolicy


def make_policy(spec: EnvSpec, model: ModelSection) -> MLPPolicy | LSTMPolicy:
    """The policy for an env spec and ``model.core`` (the one place that chooses the architecture)."""
    if model.core == "mlp":
        return MLPPolicy(spec, model)
    if model.core == "lstm":
        return LSTMPolicy(spec, model)
    raise ValueError(f"unknown model.core {model.core!r}; allowed: 'mlp', 'lstm'")


def state_arrays(policy: nn.Module) -> dict[str, np.ndarray]:
    """Parameters and buffers as contiguous CPU NumPy arrays (for the wire and for safetensors)."""
    return {name: t.detach().to("cpu").contiguous().numpy() for name, t in policy.state_dict().items()}


def load_state_arrays(policy: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load arrays produced by ``state_arrays`` (strict: names and shapes must match)."""
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in arrays.items()}
    policy.load_state_dict(state, strict=True)
