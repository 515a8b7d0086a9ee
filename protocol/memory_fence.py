"""A full memory fence for processes that share memory: no load or store crosses it. LLVM ``fence seq_cst`` (x86: a
locked instruction; ARM: ``dmb ish``), for numba code (``fence``) and for Python (``full_fence``, one compiled call).
x86 keeps a store after earlier loads anyway; ARM may let it pass them, so a side that hands memory back by a store
(protocol/shared_rows.py) or counts work out by one (actors/handoff.py) fences first."""

from __future__ import annotations

import numba
from numba import types
from numba.extending import intrinsic


@intrinsic
def fence(typingctx):
    """The fence, inside numba code."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.none(), codegen


@numba.njit(cache=True, nogil=True)
def full_fence() -> None:
    """The fence, from Python."""
    fence()
