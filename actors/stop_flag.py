"""The actor host's stop request: set by a signal handler, the learner's SHUTDOWN or the host itself."""

from __future__ import annotations


class StopFlag:
    """Set once to end the host; the first reason given is the one reported, and decides the exit code."""

    def __init__(self) -> None:
        self.reason = ""
        self.signum: int | None = None
        """The signal whose request came first (None: the learner or the host itself asked first)."""
        self._requested = False

    def request(self, reason: str, *, signum: int | None = None) -> None:
        """Ask the host to stop; it finishes its loop iteration and cleans up. ``signum``: the signal that asks."""
        if not self._requested:
            self.reason, self.signum = reason, signum
        self._requested = True

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self._requested

    def exit_code(self) -> int:
        """The host's exit code after a normal stop: 128 + the signal's number when a signal stopped it first
        (130 for SIGINT, 143 for SIGTERM, as the learner), else 0 (the learner ended the run)."""
        return 0 if self.signum is None else 128 + self.signum
