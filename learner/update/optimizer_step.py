"""An optimizer step that a non-finite gradient skips, decided on the device where the optimizer allows it.

A fused Adam/AdamW (``torch.optim.Adam(fused=True)``) reads a ``found_inf`` tensor in ``step()``, the attribute
``torch.amp.GradScaler`` sets: where it is 1 the kernel leaves the weights and the moments as they were and the
step count it has just advanced is taken back, so skipping costs no host sync. Any other optimizer falls back to
reading the flag on the host before stepping (one sync per step).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda"})
"""Device types whose parameters torch's fused Adam/AdamW kernels update (torch 2.13)."""


def fused_supported(parameters: Iterable[nn.Parameter]) -> bool:
    """Whether a fused Adam/AdamW can hold ``parameters``: floating point, on a device with fused kernels."""
    return all(p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in parameters)


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every param group of ``optimizer`` steps with a fused kernel (a checkpoint written before the
    optimizer was fused loads its groups' ``fused: None``, which makes this False)."""
    return all(group.get("fused") for group in optimizer.param_groups)


def step_unless_nonfinite(optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> torch.Tensor:
    """One ``optimizer.step()`` unless ``grad_norm`` is NaN or infinite; returns the 0-dim float32 flag on
    ``grad_norm``'s device, 1.0 where the step was skipped. Fused optimizers skip on the device, others sync."""
    skipped = (~torch.isfinite(grad_norm)).to(torch.float32)
    if not is_fused(optimizer):
        if not bool(skipped):
            optimizer.step()
        return skipped
    optimizer.found_inf = skipped  # read by the fused kernels in Adam.step(), as GradScaler passes it
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf
    return skipped
