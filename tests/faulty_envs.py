"""Native envs that fail on purpose, for the env-fault tests (built through env.name: native)."""

from __future__ import annotations

import importlib
import os
import signal
import time

import numpy as np

from envs.base import StepBuffers
from envs.builtin.cartpole import CartPoleVec


class FlakyCartPole(CartPoleVec):
    """CartPole whose every instance raises in its ``fail_every``-th step (a bug that strikes now and then)."""

    def __init__(self, num_envs: int, *, max_steps: int, fail_every: int = 40) -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.fail_every = fail_every
        self.calls = 0

    def step(self, buffers: StepBuffers) -> None:
        """Step, except every ``fail_every``-th call, which raises."""
        self.calls += 1
        if self.calls % self.fail_every == 0:
            raise RuntimeError(f"flaky env: failing on step call {self.calls}")
        super().step(buffers)


class BrokenReset(CartPoleVec):
    """CartPole that cannot reset at all."""

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        super().__init__(num_envs, max_steps=max_steps)

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Always raises."""
        raise OSError("simulator license server unreachable")


class DiesAtBirth(CartPoleVec):
    """CartPole whose process ends as the env is built (a crash no exception reports); never build it in a test's
    own process."""

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        os._exit(3)


class BrokenConstructor(CartPoleVec):
    """CartPole whose constructor raises (a bug in the user's own env code, before any spec exists)."""

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        track = {"width": 4.8}
        super().__init__(num_envs, max_steps=max_steps)
        self.track_height = track["height"]


class DiesInStep(CartPoleVec):
    """CartPole whose process ends in its ``die_on``-th step call: ``os._exit(3)``, or killed by ``kill_with`` (a
    signal name such as 'SIGKILL'); a crash no exception reports. Never build it in a test's own process."""

    def __init__(self, num_envs: int, *, max_steps: int, die_on: int = 1, kill_with: str = "") -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.die_on = die_on
        self.kill_with = kill_with
        self.calls = 0

    def step(self, buffers: StepBuffers) -> None:
        """Step, except the ``die_on``-th call, which ends the process."""
        self.calls += 1
        if self.calls == self.die_on:
            if self.kill_with:
                os.kill(os.getpid(), signal.Signals[self.kill_with])
            os._exit(3)
        super().step(buffers)


class HangsInStep(CartPoleVec):
    """CartPole whose ``hang_on``-th step call hangs (sleeps 1000 s); with a ``flag`` path, only in the first
    instance that gets there (it creates the file, which spares every later one). Never build it in a test's own
    process."""

    def __init__(self, num_envs: int, *, max_steps: int, hang_on: int = 20, flag: str = "") -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.hang_on = hang_on
        self.flag = flag
        self.calls = 0

    def step(self, buffers: StepBuffers) -> None:
        """Step, except the ``hang_on``-th call, which never returns (unless the flag spares it)."""
        self.calls += 1
        if self.calls == self.hang_on and self._first_to_hang():
            time.sleep(1000)
        super().step(buffers)

    def _first_to_hang(self) -> bool:
        if not self.flag:
            return True
        try:
            os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


class HangsInBuild(CartPoleVec):
    """CartPole that hangs (sleeps 1000 s) where ``where`` says: in its constructor ("init") or in its reset
    ("reset"); with a ``flag`` path, only in the first instance that gets there (see ``HangsInStep``). Never build it
    in a test's own process."""

    def __init__(self, num_envs: int, *, max_steps: int, where: str = "init", flag: str = "") -> None:
        self.where, self.flag = where, flag
        if where == "init" and HangsInStep._first_to_hang(self):
            time.sleep(1000)
        super().__init__(num_envs, max_steps=max_steps)

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset, except where it hangs."""
        if self.where == "reset" and HangsInStep._first_to_hang(self):
            time.sleep(1000)
        super().reset(buffers, seed)


class WritesNaN(CartPoleVec):
    """CartPole that writes NaN into the reward of env ``env``'s agent on every ``nan_every``-th step call."""

    def __init__(self, num_envs: int, *, max_steps: int, nan_every: int = 5, env: int = 1) -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.nan_every = nan_every
        self.env = env
        self.calls = 0

    def step(self, buffers: StepBuffers) -> None:
        """Step; every ``nan_every``-th call, then overwrite one reward with NaN."""
        self.calls += 1
        super().step(buffers)
        if self.calls % self.nan_every == 0:
            buffers.rewards[self.env] = float("nan")


class UnseededCartPole(CartPoleVec):
    """CartPole whose resets ignore the seed they are given (a run that cannot be repeated)."""

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset from fresh operating-system entropy instead of ``seed``."""
        super().reset(buffers, int(np.random.SeedSequence().entropy % 2**31))


class ReportsThreads(CartPoleVec):
    """CartPole whose first step writes to ``path`` (JSON) the threads its process's numeric libraries would use:
    ``{"blas": [each BLAS library's], "torch": torch's pool or null}``; loads torch when built with ``load_torch``."""

    def __init__(self, num_envs: int, *, max_steps: int, path: str, load_torch: bool = False) -> None:
        super().__init__(num_envs, max_steps=max_steps)
        self.path = path
        if load_torch:  # as an env that uses torch loads it in its worker
            importlib.import_module("torch")
        self.reported = False

    def step(self, buffers: StepBuffers) -> None:
        """Step; the first call also writes the report."""
        if not self.reported:
            import json
            import sys

            import threadpoolctl

            torch = sys.modules.get("torch")
            report = {"blas": [lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                               if lib["user_api"] == "blas"],
                      "torch": None if torch is None else torch.get_num_threads()}
            with open(self.path + ".part", "w", encoding="ascii") as out:
                json.dump(report, out)
            os.replace(self.path + ".part", self.path)
            self.reported = True
        super().step(buffers)


class TimesOutInConstructor(CartPoleVec):
    """Wrong: its constructor raises TimeoutError at once (a license server that does not answer, say): an error of
    the env's own, not a hang. Never build it in a test's own process."""

    def __init__(self, num_envs: int, *, max_steps: int) -> None:
        raise TimeoutError("license server did not answer")
