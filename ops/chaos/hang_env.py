"""CartPole that hangs on demand, for the chaos run: the first instance to see the trigger file after it appears
claims it and never returns from its step (as an env stuck on a lock or a dead simulator would)."""

from __future__ import annotations

import os
import time

from envs.base import StepBuffers
from envs.builtin.cartpole import CartPoleVec

TRIGGER_VARIABLE = "SLUICE_CHAOS_HANG_TRIGGER"
"""The environment variable naming the trigger file (unset: the env never hangs)."""


class HangOnTrigger(CartPoleVec):
    """CartPole whose step hangs once the trigger file exists, in the one instance that claims it first."""

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.trigger = os.environ.get(TRIGGER_VARIABLE, "")

    def step(self, buffers: StepBuffers) -> None:
        """Step, unless the trigger appeared and this instance claimed it: then sleep for good."""
        if self.trigger and os.path.exists(self.trigger) and self._claim():
            time.sleep(10 ** 6)
        super().step(buffers)

    def _claim(self) -> bool:
        try:
            os.close(os.open(f"{self.trigger}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True
