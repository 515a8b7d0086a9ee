"""Logging refused messages without letting a peer flood the log: one line per reason per interval.

A server that refuses a message calls ``RejectLog.reject(reason, detail)``. The first refusal of a reason is
logged at once; later ones within ``interval_s`` of the last logged line are only counted, and the next line
logged for that reason says how many were left out. ``peer_text`` turns anything a peer sent (a sender name, a
string field) into a short printable ``repr`` for such lines; ``peer_identity`` shows a ZeroMQ routing identity
(bytes, ``b'\\x00k\\x8bEg'`` as a repr) as ``peer 006b8b4567``.

``RejectLog.expected`` is for messages dropped in the normal course of things (a host's late ROWS or HEARTBEAT
after it said BYE or was forgotten): the caller counts them under their reason as any refusal, and they are
logged at INFO, not as a refusal, at most once per key per interval with how many were dropped.
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


def peer_identity(identity: bytes, limit: int = 16) -> str:
    """A ZeroMQ routing identity as ``peer <hex>`` (its first ``limit`` bytes, '...' after a longer one)."""
    shown = identity[:limit].hex()
    return f"peer {shown}{'...' if len(identity) > limit else ''}"


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

    def reject(self, reason: str, detail: str, *, sender: object = None, peer: bytes | None = None) -> bool:
        """Note one refusal; log it unless a line for ``reason`` went out less than ``interval_s`` ago. ``sender``
        (peer-supplied, shown with ``peer_text``) is left out when None; ``peer``, a ZeroMQ routing identity, is
        shown with ``peer_identity`` where there is no ``sender``. Returns whether a line was logged."""
        suppressed = self._due(reason)
        if suppressed is None:
            return False
        origin = "" if sender is None else f" from {peer_text(sender)}"
        if sender is None and peer is not None:
            origin = f" from {peer_identity(peer)}"
        more = f" ({suppressed} more refused for this reason since its last line, not logged)" if suppressed else ""
        self.logger.warning("refused a %s%s (%s): %s%s", self.what, origin, clip(reason, PEER_TEXT_CHARS),
                            clip(detail, DETAIL_CHARS), more)
        return True

    def expected(self, key: str, text: str) -> bool:
        """Note one message dropped in the normal course of things (counted by the caller under its reason like
        any refusal); log ``text`` at INFO with how many were dropped since the last line for ``key``, unless that
        line went out less than ``interval_s`` ago. Returns whether a line was logged."""
        suppressed = self._due("expected:" + key)
        if suppressed is None:
            return False
        dropped = suppressed + 1
        self.logger.info("%s (%d message%s dropped)", text, dropped, "" if dropped == 1 else "s")
        return True

    def _due(self, key: str) -> int | None:
        """How many were left out for ``key`` since its last line when a line is due now (the line is noted as
        logged), None when it is not (the one now is counted as left out)."""
        now = self.clock()
        with self._lock:
            state = self._reasons.get(key)
            if state is not None and now - state.logged_at < self.interval_s:
                state.suppressed += 1
                return None
            self._reasons[key] = _ReasonLog(logged_at=now)
            return 0 if state is None else state.suppressed
