"""The two ways an env can fail, told apart by type (never by the text of a message).

``EnvConfigError``: the run config asks for an env that cannot be built as asked (unknown name, bad kwargs,
agent count, an entry point that does not import, an env that breaks the VecEnv contract). It is the user's
to fix from the message alone: CLIs print it as one line and exit 2.

``EnvRaised``: the user's env code raised in make/reset/step/close. Its ``__cause__`` is the original
exception, whose traceback (the user's file and line) is what a person needs to see.
"""

from __future__ import annotations


class EnvError(Exception):
    """Base of every env failure."""


class EnvConfigError(EnvError, ValueError):
    """The config names an env that cannot be built as asked; the message says which key and why."""


class EnvRaised(EnvError, RuntimeError):
    """The env's own code raised; ``__cause__`` carries the original exception and its traceback."""
