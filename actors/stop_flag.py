"""The actor host's stop request: set by a signal handler, the learner's SHUTDOWN or the host itself.

The first SIGINT/SIGTERM asks for a clean stop: the loop ends its turn, the workers quit, the shared memory is
released, the learner hears BYE. A second one while that has not happened raises ``StopNow`` wherever the main
thread is, also inside a blocking call that Python retries after a signal (a ZeroMQ send, a sleep, a join): a host
stuck in C code still ends, with its cleanup (``run_host``'s exit stack) run on the way out.
"""

from __future__ import annotations

import signal


class StopFlag:
    """Set once to end the host; the first reason given is the one reported, and decides the exit code."""

    def __init__(self) -> None:
        self.reason = ""
        self.signum: int | None = None
        """The signal whose request came first (None: the learner or the host itself asked first)."""
        self._requested = False
        self.signals = 0
        """Stop signals received (``install_stop_signals``): the second ends the host at once."""

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


class StopNow(BaseException):
    """A second stop signal: end now. A BaseException, as KeyboardInterrupt is, so no ``except Exception`` on the
    way out can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received again while stopping: stopping at once")
        self.signum = signum


def install_stop_signals(stop: StopFlag) -> None:
    """SIGINT and SIGTERM request a clean stop of ``stop``'s host; a second one raises ``StopNow``."""
    def handler(signum: int, _frame: object) -> None:
        stop.signals += 1
        if stop.signals > 1:
            raise StopNow(signum)
        stop.request(f"{signal.Signals(signum).name} received", signum=signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
