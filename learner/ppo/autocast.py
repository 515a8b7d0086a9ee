"""trainer.autocast: the mixed-precision context PPO's forward passes and losses run under."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from configs.schema import AUTOCAST_MODES

AUTOCAST_DTYPES = {"bf16": torch.bfloat16}
"""trainer.autocast values that turn autocast on, and the dtype each runs matmuls in ("none" keeps float32)."""


def autocast_context(device: torch.device, autocast: str) -> ContextManager[object]:
    """``torch.autocast`` on ``device``'s type in the dtype of ``autocast`` (a trainer.autocast value), or a
    context that changes nothing for "none". ValueError for any other value."""
    if autocast == "none":
        return contextlib.nullcontext()
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast {autocast!r} is not allowed; allowed: {', '.join(AUTOCAST_MODES)}")
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[autocast])
