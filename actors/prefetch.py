"""A numba intrinsic that asks the CPU to fetch a buffer element's cache line for writing (LLVM's ``prefetch``).

The row assembler writes each step into a different row of a buffer far larger than the CPU's caches, one
observation per agent, hundreds of agents per call: every write starts with a cache miss the hardware prefetcher
cannot foresee (the rows are scattered). The kernel knows every destination before it copies, so it can ask for
the next steps' lines while it copies the current one: the misses overlap instead of following one another.
A prefetch is only a hint: it never faults, changes no value, and compiles to nothing where the CPU has none.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_WRITE = 1
"""LLVM prefetch's rw argument: the line will be written."""
_KEEP = 3
"""LLVM prefetch's locality argument: keep the line in every cache level (it is written right after)."""
_DATA = 1
"""LLVM prefetch's cache-type argument: the data cache."""


@intrinsic
def prefetch_for_write(typingctx, array, row, position, element):
    """``prefetch_for_write(array, row, position, element)``: fetch the cache line of the 3-d ``array``'s
    ``[row, position, element]`` (indices in bounds and not negative: nothing checks them; no value is read)."""
    if not (isinstance(array, types.Array) and array.ndim == 3):
        return None
    signature = types.void(array, row, position, element)

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        indices = [context.cast(builder, value, kind, types.intp)
                   for value, kind in zip(args[1:], sig.args[1:])]
        pointer = cgutils.get_item_pointer(context, builder, array_type, view, indices, wraparound=False)
        byte_pointer = ir.IntType(8).as_pointer()
        function_type = ir.FunctionType(ir.VoidType(), [byte_pointer] + [ir.IntType(32)] * 3)
        prefetch = cgutils.get_or_insert_function(builder.module, function_type, "llvm.prefetch.p0i8")
        flags = [ir.Constant(ir.IntType(32), flag) for flag in (_WRITE, _KEEP, _DATA)]
        builder.call(prefetch, [builder.bitcast(pointer, byte_pointer), *flags])
        return context.get_dummy_value()

    return signature, codegen
