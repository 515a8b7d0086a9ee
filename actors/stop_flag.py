"""The actor host's stop request: set by a signal handler, the learner's SHUTDOWN or the host itself."""

from __future__ import annotations


class StopFlag:
    """Set once to end the host; the first reason given is the one reported."""

    def __init__(self) -> None:
        self.reason = ""
        self._requested = False

    def request(self, reason: str) -> None:
        """Ask the host to stop; it finishes its loop iteration and cleans up."""
        self._requested = True
        self.reason = self.reason or reason

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self._requested
