"""A SplitMix64 stream of uniforms for compiled draws on an actor host (the null policy's, the small MLP's).

The stream's state is one uint64 in a NumPy array (``np.array([seed], dtype=np.uint64)``) that ``uniform``
advances in place, so a ``numba`` kernel draws without Python or a generator object per call.
"""

from __future__ import annotations

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_UNIT = 1.0 / float(1 << 53)


@numba.njit(cache=True)
def uniform(state):
    """The next float64 in [0, 1) of the SplitMix64 stream whose state is ``state[0]`` (advanced in place)."""
    state[0] += _GOLDEN
    z = state[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * _UNIT
