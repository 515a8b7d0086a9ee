"""The per-agent tanh-squashed Gaussian policy of COMA for continuous actions (seeds/004).

A policy network gives ``mean`` and ``log_std`` per action dimension (last dim = action dim). An action is made in
three steps:

* ``u ~ N(mean, std**2)`` with ``std = exp(log_std)`` and ``log_std`` clamped to ``[LOG_STD_MIN, LOG_STD_MAX]``;
* ``y = tanh(u)`` in ``(-1, 1)``;
* ``a = low + (y + 1) * (high - low) / 2``: the affine map of ``(-1, 1)`` onto the env's Box ``[low, high]``.

The log-probability is the change of variables through both maps, so it is the true density of the env's action::

    log pi(a) = sum_d [ log N(u_d; mean_d, std_d) - log(1 - tanh(u_d)**2) - log((high_d - low_d) / 2) ]

``log(1 - tanh(u)**2)`` is computed as ``2 * (log 2 - u - softplus(-2u))``, which stays finite for any ``u`` (the
naive form is ``log(0) = -inf`` once ``tanh(u)`` rounds to 1, around ``|u| > 9`` in float32). Both sides are even in
``u``, so it is evaluated at ``|u|``: softplus then only sees arguments <= 0, below torch's linear cut-over. The affine term
``-sum log((high - low) / 2)`` is a constant of the env: it is included so that ``log_prob`` is the density of the
action the env receives; it has no gradient and cancels in every ratio or difference of log-probabilities.

Entropy: the squashed distribution's entropy has no closed form; ``gaussian_entropy`` gives the entropy of the
pre-squash Gaussian ``N(mean, std**2)``, the usual proxy (an entropy bonus on it keeps ``std`` from collapsing).

Everything is a function of tensors (broadcasting over leading dims), shared by actor hosts and the learner.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_STD_MIN = -20.0
"""Smallest log standard deviation (std about 2e-9): keeps log N finite for a collapsed policy."""
LOG_STD_MAX = 2.0
"""Largest log standard deviation (std about 7.4): wider is indistinguishable from uniform after tanh."""
_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def clamp_log_std(log_std: torch.Tensor) -> torch.Tensor:
    """``log_std`` clamped to ``[LOG_STD_MIN, LOG_STD_MAX]``."""
    return log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


def check_box_bounds(low: torch.Tensor, high: torch.Tensor) -> None:
    """ValueError unless the Box bounds are finite and ``high > low`` in every dimension (tanh needs both ends)."""
    if low.shape != high.shape:
        raise ValueError(f"Box bounds: low has shape {tuple(low.shape)} but high has {tuple(high.shape)}; "
                         f"they must match the action dim")
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
        raise ValueError(f"Box bounds must be finite for a tanh-squashed policy; got low={low.tolist()}, "
                         f"high={high.tolist()}")
    if not (high > low).all():
        raise ValueError(f"Box bounds need high > low in every dimension; got low={low.tolist()}, "
                         f"high={high.tolist()}")


def squash(u: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Pre-tanh ``u`` -> the env action ``low + (tanh(u) + 1) * (high - low) / 2``, clamped into ``[low, high]``
    (rounding could otherwise land a hair outside)."""
    action = low + (torch.tanh(u) + 1.0) * (high - low) / 2.0
    return torch.minimum(torch.maximum(action, low), high)


def log_one_minus_tanh_squared(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)**2)`` elementwise, as ``2 * (log 2 - |u| - softplus(-2|u|))`` (finite for every finite u)."""
    magnitude = u.abs()
    return 2.0 * (_LOG_2 - magnitude - F.softplus(-2.0 * magnitude))


def log_prob(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor, low: torch.Tensor,
             high: torch.Tensor) -> torch.Tensor:
    """log pi(a) [...] of the env action ``a = squash(u, low, high)``, from the pre-tanh ``u`` [..., d].

    Summed over the last (action) dim; includes the tanh and the affine Jacobians (see the module docstring).
    """
    log_std = clamp_log_std(log_std)
    z = (u - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z * z - log_std - 0.5 * _LOG_2PI
    affine = torch.log((high - low) / 2.0)
    return (gaussian - log_one_minus_tanh_squared(u) - affine).sum(dim=-1)


def sample(mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor, high: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one action per row: ``(u [..., d], action [..., d] in [low, high], log_prob [...])``.

    ``u = mean + std * eps`` is reparameterised (gradients flow to mean and log_std); keep ``u`` to recompute
    the log-probability later without inverting tanh.
    """
    log_std = clamp_log_std(log_std)
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    u = mean + torch.exp(log_std) * eps
    return u, squash(u, low, high), log_prob(mean, log_std, u, low, high)


def mode(mean: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The deterministic action ``squash(mean)`` [..., d] (evaluation; the `mean` counterfactual default)."""
    return squash(mean, low, high)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of the pre-squash ``N(mean, std**2)``: ``sum_d (log_std_d + (1 + log 2 pi) / 2)``.

    A proxy: the squashed distribution's entropy has no closed form.
    """
    return (clamp_log_std(log_std) + 0.5 * (1.0 + _LOG_2PI)).sum(dim=-1)
