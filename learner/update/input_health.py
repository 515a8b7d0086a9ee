"""Whether the policy still depends on its input: how much of its first layer is frozen (issue 16).

uint8 observations that are mostly one constant byte, or inputs far outside the network's range, saturate the first
layer (tanh units stuck at +-1, ReLUs that never fire): its activations stop changing from one observation to the
next and the policy stops depending on what it sees. ``frozen_fraction`` measures that on the batch: the first
activation module of the policy (in module order: the encoder's, else the torso's) is hooked during a no-grad
forward pass over a few rows, and a feature counts as frozen when its standard deviation over those observations is
below ``FROZEN_STD`` (tanh's range is [-1, 1]; a dead ReLU's is exactly 0). ``SaturationMonitor`` turns a
fraction that stays high into one warning line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

ACTIVATIONS = (nn.Tanh, nn.ReLU, nn.GELU, nn.ELU, nn.SiLU, nn.LeakyReLU)
"""Module types that count as an activation (the first one found is the first layer's)."""
FROZEN_STD = 1e-3
"""A first-layer feature whose std over the sampled observations is below this does not follow the input."""
SAMPLE_ROWS = 32
"""Rows of the batch the measurement's forward pass reads (all their steps but the bootstrap one)."""


def first_activation(policy: nn.Module) -> nn.Module | None:
    """The policy's first activation module in registration order (None: it has none)."""
    return next((module for module in policy.modules() if isinstance(module, ACTIVATIONS)), None)


@torch.no_grad()
def frozen_fraction(policy: nn.Module, obs: torch.Tensor, dones: torch.Tensor, states: torch.Tensor) -> float | None:
    """Fraction of first-layer features frozen over ``obs`` [S, T, *obs_shape] (read by ``policy.forward_rows``
    with ``dones`` [S, T] and ``states`` [S, state_size]); None when the policy has no activation or the layer's
    output does not split into one feature vector per observation."""
    activation = first_activation(policy)
    if activation is None:
        return None
    captured: list[torch.Tensor] = []
    handle = activation.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    try:
        policy.forward_rows(obs, dones, states)
    finally:
        handle.remove()
    observations = obs.shape[0] * obs.shape[1]
    if not captured or observations < 2 or captured[0].numel() % observations:
        return None
    features = captured[0].float().reshape(observations, -1)
    return float((features.std(dim=0) < FROZEN_STD).float().mean())


def batch_frozen_fraction(policy: nn.Module, obs: torch.Tensor, dones: torch.Tensor,
                          states: torch.Tensor) -> float | None:
    """``frozen_fraction`` on the first SAMPLE_ROWS rows of a batch's [S, T+1] fields (the bootstrap step left out)."""
    rows = slice(0, SAMPLE_ROWS)
    return frozen_fraction(policy, obs[rows, :-1], dones[rows, :-1], states[rows])


@dataclass(frozen=True, kw_only=True)
class Saturation:
    """The saturation check after one update."""

    high_streak: int
    """Consecutive updates so far with the frozen fraction at or above the threshold."""
    warning: str | None
    """The warning line to log after this update (None: nothing new to say)."""


class SaturationMonitor:
    """Warns once when the first layer has been mostly frozen for ``patience`` updates in a row, and again only
    after it has recovered (an update below ``threshold``) and relapsed."""

    def __init__(self, *, threshold: float = 0.5, patience: int = 20) -> None:
        """``threshold``: a frozen fraction at or above it is high; ``patience``: high updates in a row before the
        warning."""
        self.threshold = threshold
        self.patience = patience
        self.high_streak = 0
        self.warned = False

    def observe(self, fraction: float | None) -> Saturation:
        """One update's frozen fraction (None: not measured; it breaks the streak)."""
        warning = None
        if fraction is None or fraction < self.threshold:
            self.high_streak = 0
            self.warned = False
        else:
            self.high_streak += 1
            if self.high_streak >= self.patience and not self.warned:
                self.warned = True
                warning = (f"learner: warning: {fraction:.0%} of the first layer's activations have not varied over "
                           f"the batch's observations for {self.high_streak} updates (saturated tanh units or dead "
                           f"ReLUs): the policy barely depends on its input; likely causes: uint8 observations "
                           f"that are mostly one constant byte (try model.obs_norm: true or model.encoder: cnn), "
                           f"inputs far outside the network's range, or a learning rate too high")
        return Saturation(high_streak=self.high_streak, warning=warning)
