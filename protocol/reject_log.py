"""Logging refused messages without letting a peer flood the log: one line per reason per interval.

A server that refuses a message calls ``RejectLog.reject(reason, detail)``. The first refusal of a reason is
logged at once; later ones within ``interval_s`` of the last logged line are only counted, and the next line
logged for that reason says how many were left out. ``peer_text`` turns anything a peer sent (a sender name, a
string field) into a short printable ``repr`` for such lines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PEER_TEXT_CHARS = 80
"""Characters of a peer-supplied value a log line shows at most (its repr, cut with '...')."""
DETAIL_CHARS = 300
"""Characters of a refusal's description a log line shows at most."""
REJECT_LOG_INTERVAL_S = 10.0
"""Seconds between two log lines for the same reason."""


def peer_text(value: object, limit: int = PEER_TEXT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (ending in '...'), safe to log whatever a peer sent."""
    return clip(repr(value), limit)


def clip(text: str, limit: int) -> str:
    """``text`` with non-printable characters escaped, cut to at most ``limit`` characters (the cut marked '...')."""
    shown = "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
                    for char in text[:limit + 1])
    return shown if len(shown) <= limit else shown[:max(0, limit - 3)] + "..."


@dataclass(kw_only=True)
class _ReasonLog:
    """When a reason was last logged and how many refusals for it were counted since without a line."""

    logged_at: float
    """Clock time of the last line logged for the reason."""
    suppressed: int = 0
    """Refusals for the reason since that line, not logged."""


class RejectLog:
    """Rate-limited warnings about refused messages: at most one line per reason per ``interval_s``."""

    def __init__(self, logger: logging.Logger, *, what: str, interval_s: float = REJECT_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s >= 0:
            raise ValueError(f"RejectLog interval_s must be a number >= 0, got {interval_s!r}")
        self.logger = logger
        self.what = what
        """What the lines say was refused (e.g. "ROWS message")."""
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._reasons: dict[str, _ReasonLog] = {}

    def reject(self, reason: str, detail: str, *, sender: object = None) -> bool:
        """Note one refusal; log it unless a line for ``reason`` went out less than ``interval_s`` ago. ``sender``
        (peer-supplied, shown with ``peer_text``) is left out when None. Returns whether a line was logged."""
        now = self.clock()
        with self._lock:
            state = self._reasons.get(reason)
            if state is not None and now - state.logged_at < self.interval_s:
                state.suppressed += 1
                return False
            suppressed = 0 if state is None else state.suppressed
            self._reasons[reason] = _ReasonLog(logged_at=now)
        origin = "" if sender is None else f" from {peer_text(sender)}"
        more = f" ({suppressed} more refused for this reason since its last line, not logged)" if suppressed else ""
        self.logger.warning("refused a %s%s (%s): %s%s", self.what, origin, clip(reason, PEER_TEXT_CHARS),
                            clip(detail, DETAIL_CHARS), more)
        return True
