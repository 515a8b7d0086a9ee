"""GAE with V-trace clipping (seeds/000), over rows of T + 1 steps.

Convention (seeds/000): ``rewards[:, t+1]`` and ``dones[:, t+1]`` belong to the transition out of step t::

    rho[t]   = min(rho_clip, ratio[t]);  c[t] = min(c_clip, ratio[t])
    delta[t] = rho[t] * (rewards[t+1] + gamma * values[t+1] * (1 - dones[t+1]) - values[t])
    A[t]     = delta[t] + gamma * gae_lambda * c[t] * A[t+1] * (1 - dones[t+1]),   A[T] = 0

Because each row holds T + 1 steps, step T's value bootstraps step T - 1: every transition gets a real
advantage. A truncated (time-limit) transition reaches here with done = 1 and ``gamma * V(final obs)``
already folded into its reward by the learner, so it is bootstrapped while a termination is not.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor


@numba.njit(cache=True, fastmath=False)
def _gae_kernel(values: np.ndarray, rewards: np.ndarray, dones: np.ndarray, ratios: np.ndarray,
                gamma: float, gae_lambda: float, rho_clip: float, c_clip: float, out: np.ndarray) -> None:
    rows, horizon = ratios.shape
    for s in range(rows):
        last = 0.0
        for t in range(horizon - 1, -1, -1):
            nextnonterminal = 1.0 - dones[s, t + 1]
            rho = min(rho_clip, ratios[s, t])
            c = min(c_clip, ratios[s, t])
            delta = rho * (rewards[s, t + 1] + gamma * values[s, t + 1] * nextnonterminal - values[s, t])
            last = delta + gamma * gae_lambda * c * last * nextnonterminal
            out[s, t] = last


def _gae_torch(values: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor, ratios: torch.Tensor,
               gamma: float, gae_lambda: float, rho_clip: float, c_clip: float) -> torch.Tensor:
    """Vectorised over rows, sequential over time: the device path (one small kernel chain per step)."""
    horizon = ratios.shape[1]
    nextnonterminal = 1.0 - dones[:, 1:].to(values.dtype)
    rho = torch.clamp(ratios, max=rho_clip)
    c = torch.clamp(ratios, max=c_clip)
    deltas = rho * (rewards[:, 1:] + gamma * values[:, 1:] * nextnonterminal - values[:, :-1])
    decay = gamma * gae_lambda * c * nextnonterminal
    out = torch.empty_like(deltas)
    last = torch.zeros_like(deltas[:, 0])
    for t in range(horizon - 1, -1, -1):
        last = deltas[:, t] + decay[:, t] * last
        out[:, t] = last
    return out


def compute_advantages(values: ArrayLike, rewards: ArrayLike, dones: ArrayLike, ratios: ArrayLike, *,
                       gamma: float, gae_lambda: float, rho_clip: float = 1.0,
                       c_clip: float = 1.0) -> ArrayLike:
    """Advantages [S, T] from values/rewards/dones [S, T+1] and ratios [S, T]; NumPy in, NumPy out.

    Torch tensors on the CPU run the numba kernel on shared memory; tensors on another device run the
    torch recursion there. Results are float32.
    """
    _check_shapes(values, rewards, dones, ratios)
    if isinstance(values, torch.Tensor):
        if values.device.type == "cpu":
            arrays = [torch.as_tensor(x).detach().to(torch.float32).contiguous().numpy()
                      for x in (values, rewards, dones, ratios)]
            return torch.from_numpy(_run_kernel(*arrays, gamma, gae_lambda, rho_clip, c_clip))
        return _gae_torch(values.float(), rewards.float(), dones.float(), ratios.float(),
                          gamma, gae_lambda, rho_clip, c_clip)
    arrays = [np.ascontiguousarray(x, dtype=np.float32) for x in (values, rewards, dones, ratios)]
    return _run_kernel(*arrays, gamma, gae_lambda, rho_clip, c_clip)


def _run_kernel(values: np.ndarray, rewards: np.ndarray, dones: np.ndarray, ratios: np.ndarray,
                gamma: float, gae_lambda: float, rho_clip: float, c_clip: float) -> np.ndarray:
    out = np.empty(ratios.shape, dtype=np.float32)
    _gae_kernel(values, rewards, dones, ratios, float(gamma), float(gae_lambda), float(rho_clip),
                float(c_clip), out)
    return out


def _check_shapes(values: ArrayLike, rewards: ArrayLike, dones: ArrayLike, ratios: ArrayLike) -> None:
    shape = tuple(values.shape)
    if len(shape) != 2 or shape[1] < 2:
        raise ValueError(f"values must be [S, T+1] with T >= 1, got shape {shape}")
    for name, array in (("rewards", rewards), ("dones", dones)):
        if tuple(array.shape) != shape:
            raise ValueError(f"{name} must have the shape of values {shape}, got {tuple(array.shape)}")
    if tuple(ratios.shape) != (shape[0], shape[1] - 1):
        raise ValueError(f"ratios must be [S, T] = {(shape[0], shape[1] - 1)}, got {tuple(ratios.shape)}")
