"""Histogram bucket bounds shared by the processes' metrics (the same quantity gets the same buckets, so
dashboards can put the learner's and the hosts' side by side)."""

from __future__ import annotations

MESSAGE_BYTES = tuple(float(1 << shift) for shift in range(10, 29, 2))
"""Message sizes: 1 KiB to 256 MiB in steps of 4x (network.max_message_bytes is 256 MiB by default)."""
SHORT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Sub-second work (an inference step, a forward pass, a pool request): 100 microseconds to 1 second."""
