"""Env failures as an actor host sees them: a short report of each, and the error that stops the host.

A worker turns the exception its env raised into an ``EnvErrorReport`` (the message, the type of the env's
own exception and the innermost frame of its traceback, i.e. the user's file and line) and sends it to the
host with the ENV_RESTARTED or FATAL status. The host logs it, forwards the latest one to the learner with
its next heartbeat, and on FATAL raises ``EnvFailure`` with it. An env that writes NaN or inf into what the
host would record (``check_finite``, right after each step and reset in the worker) fails the same way, as
``NonFiniteOutput``; so does a step that outlives ``env.step_timeout_s`` (``STEP_TIMEOUT``) and a worker that has
not built and reset its envs by ``env.build_timeout_s`` (``BUILD_TIMEOUT``), both reported by the host's watchdogs in
``actors/worker_pool.py``.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, replace

import numpy as np

from envs.base import StepBuffers
from envs.errors import EnvRaised

MAX_MESSAGE_CHARS = 2000
"""Longest message a report keeps (the rest is cut): it travels in pipes and heartbeats."""
NON_FINITE = "NonFiniteOutput"
"""Error type of a report on an env that wrote NaN or inf."""
STEP_TIMEOUT = "StepTimeout"
"""Error type of a report on a worker the host's step watchdog killed (stuck in a step, or stopped)."""
BUILD_TIMEOUT = "BuildTimeout"
"""Error type of a report on a worker the host's build watchdog killed (its envs not built and reset in time)."""


class NonFiniteOutput(RuntimeError):
    """An env wrote NaN or inf into a reward, a float observation, a final observation or a global state."""


@dataclass(frozen=True, kw_only=True)
class EnvErrorReport:
    """One env failure, summarised."""

    message: str
    """What failed: the worker's context, then the exception's message (at most MAX_MESSAGE_CHARS)."""
    error_type: str
    """Type of the env's own exception (the cause of an ``EnvRaised``), e.g. 'RuntimeError'."""
    location: str
    """'file:line' of the innermost frame of that exception's traceback (the user's code); '' if unknown."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> "EnvErrorReport":
        """The report of ``exc``, looking through ``EnvRaised`` wrappers to the env's own exception."""
        if isinstance(exc, NonFiniteOutput):  # found by the worker's check, not raised by the env's code
            return cls(message=str(exc)[:MAX_MESSAGE_CHARS], error_type=NON_FINITE, location="")
        original = exc
        while isinstance(original, EnvRaised) and original.__cause__ is not None:
            original = original.__cause__
        frames = traceback.extract_tb(original.__traceback__)
        location = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        kind = type(original)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        return cls(message=str(exc)[:MAX_MESSAGE_CHARS], error_type=name, location=location)

    def within(self, context: str) -> "EnvErrorReport":
        """The same report, its message prefixed with ``context`` (what the worker was doing)."""
        return replace(self, message=f"{context}: {self.message}"[:MAX_MESSAGE_CHARS])

    def text(self) -> str:
        """One line for logs and error messages."""
        where = f" at {self.location}" if self.location else ""
        return f"{self.message} ({self.error_type}{where})"

    def goodbye(self) -> str:
        """The reason a host's BYE gives when this failure stops it, as the learner's log shows env errors:
        ``env error TYPE at FILE:LINE: MESSAGE``."""
        where = f" at {self.location}" if self.location else ""
        return f"env error {self.error_type}{where}: {self.message}"

    def fields(self) -> dict[str, str]:
        """The report as the HEARTBEAT message's ``env_error`` field."""
        return {"type": self.error_type, "message": self.message, "where": self.location}

    def to_bytes(self) -> bytes:
        """Encoded for the worker's pipe."""
        return json.dumps(self.fields()).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> "EnvErrorReport":
        """Decoded from the worker's pipe."""
        fields = json.loads(data.decode("utf-8", "replace"))
        return cls(message=fields["message"], error_type=fields["type"], location=fields["where"])


class EnvFailure(RuntimeError):
    """A worker's env cannot run at all (fails to build or reset, keeps raising, or its worker keeps dying)."""

    def __init__(self, report: EnvErrorReport) -> None:
        super().__init__(report.text())
        self.report = report


def check_finite(buffers: StepBuffers, *, agents_per_env: int, call: str, label: str) -> None:
    """``NonFiniteOutput`` naming the field, env (index in the group's vec env) and agent of the first NaN or inf
    the host would read from ``buffers`` after ``call``: rewards, float observations of active slots, final
    observations of truncated episodes, global states. One ``isfinite`` pass per field when all is finite."""
    checks = [("reward", buffers.rewards, None), ("global state", buffers.global_state, None)]
    if buffers.obs.dtype.kind == "f":
        checks.append(("obs", buffers.obs, buffers.active))
        if buffers.truncated.any():
            checks.append(("final obs", buffers.final_obs, buffers.truncated))
    for name, array, rows in checks:
        if array.size == 0 or np.isfinite(array).all():
            continue
        bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
        if rows is not None:
            bad &= rows
        slots = np.flatnonzero(bad)
        if len(slots) == 0:  # only in slots nothing reads (inactive, not truncated)
            continue
        slot = int(slots[0])
        values = array[slot].reshape(-1)
        value = values[~np.isfinite(values)][0]
        raise NonFiniteOutput(f"env '{label}' wrote a non-finite {name} ({value}) in {call}() for env "
                              f"{slot // agents_per_env}, agent {slot % agents_per_env}")
