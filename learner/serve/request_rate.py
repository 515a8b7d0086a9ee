"""How often something may happen: a token bucket, and one bucket per peer identity for a bounded number of
peers (the least recently seen is forgotten first, and starts again with a full bucket)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A token bucket's shape."""

    per_second: float
    """Events allowed per second, sustained."""
    burst: int
    """Events allowed at once after a quiet spell (the bucket's size)."""

    def __post_init__(self) -> None:
        if not self.per_second > 0 or self.burst < 1:
            raise ValueError(f"RateLimit needs per_second > 0 and burst >= 1, got per_second={self.per_second}, "
                             f"burst={self.burst}")


class TokenBucket:
    """One bucket: ``allow()`` takes a token if there is one; tokens come back at ``limit.per_second``."""

    def __init__(self, limit: RateLimit, *, now: float) -> None:
        self.limit = limit
        self.tokens = float(limit.burst)
        self.stamp = now

    def allow(self, now: float) -> bool:
        """Take one token at clock time ``now``; False when the bucket is empty."""
        self.tokens = min(float(self.limit.burst), self.tokens + max(0.0, now - self.stamp) * self.limit.per_second)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class PeerRateLimiter:
    """A token bucket per peer identity, for at most ``max_peers`` peers; used from one thread."""

    def __init__(self, limit: RateLimit, *, max_peers: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_peers < 1:
            raise ValueError(f"PeerRateLimiter max_peers must be >= 1, got {max_peers}")
        self.limit = limit
        self.max_peers = max_peers
        self.clock = clock
        self._buckets: OrderedDict[bytes, TokenBucket] = OrderedDict()

    def allow(self, peer: bytes) -> bool:
        """Take one token from ``peer``'s bucket; False when it is empty (the request should be refused)."""
        now = self.clock()
        bucket = self._buckets.pop(peer, None)
        if bucket is None:
            bucket = TokenBucket(self.limit, now=now)
        self._buckets[peer] = bucket  # most recently seen last
        if len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
        return bucket.allow(now)

    def __len__(self) -> int:
        return len(self._buckets)
