"""The row assembler's compiled kernels (``actors/assembler.py`` validates and dispatches; these write).

Every field moves as bytes (or 4-byte words) through a table of offsets into one byte block (the pool), so one compiled
kernel serves every env's layout. The ring bookkeeping and row states they share with the assembler are the constants
below.
"""

from __future__ import annotations

import numba
import numpy as np

from actors.prefetch import prefetch_for_write

# Ring bookkeeping lives in one int64[4] array so kernels can update it in place.
FREE_HEAD, FREE_COUNT, FULL_HEAD, FULL_COUNT = 0, 1, 2, 3
# Row ownership states (debugging aid: catches double releases and releases of unshipped rows).
FREE, WRITING, FULL, SHIPPED = 0, 1, 2, 3
# Kernel error codes.
ERR_NO_FREE, ERR_BAD_AGENT, ERR_DUP_AGENT, ERR_BAD_ROW = -1, -2, -3, -4


_CACHE_LINE_BYTES = 64
"""Bytes per cache line (x86-64 and most ARM cores): the step between prefetched addresses."""
_PREFETCH_AHEAD = 4
"""Steps between the one being copied and the one whose destination is prefetched (ops/bench/assembler_copy.py)."""
_PREFETCH_MIN_LINES = 2
"""Values narrower than this many cache lines are copied without prefetching (a scalar's line is one request
either way)."""


@numba.njit(cache=True)
def _prefetch_value(buffer, row, t, width, line):
    """Prefetch the cache lines of ``buffer[row, t, :width]`` (``line`` elements per line) for writing."""
    for k in range(0, width, line):
        prefetch_for_write(buffer, row, t, k)
    prefetch_for_write(buffer, row, t, width - 1)  # the last line, when the value does not start on a line


@numba.njit(cache=True)
def _copy_steps(values, buffer, dest, n):
    """One per-step field of ``n`` steps, as bytes or 4-byte words: ``values`` [n, width] into ``buffer``
    [rows, horizon, width] at ``dest``'s positions."""
    width = buffer.shape[2]
    if width == 1:  # a scalar: no inner loop
        for i in range(n):
            buffer[dest[i, 0], dest[i, 1], 0] = values[i, 0]
            if dest[i, 2] >= 0:
                buffer[dest[i, 2], 0, 0] = values[i, 0]
        return
    line = _CACHE_LINE_BYTES // buffer.itemsize  # elements per cache line
    prefetch = width >= _PREFETCH_MIN_LINES * line  # a value of a line or two gains nothing from it
    if prefetch:
        for i in range(min(_PREFETCH_AHEAD, n)):
            _prefetch_value(buffer, dest[i, 0], dest[i, 1], width, line)
    for i in range(n):
        if prefetch and i + _PREFETCH_AHEAD < n:  # the rows are scattered: ask for a later step's lines meanwhile
            _prefetch_value(buffer, dest[i + _PREFETCH_AHEAD, 0], dest[i + _PREFETCH_AHEAD, 1], width, line)
        row, t, new = dest[i, 0], dest[i, 1], dest[i, 2]
        for k in range(width):
            buffer[row, t, k] = values[i, k]
        if new >= 0:
            for k in range(width):
                buffer[new, 0, k] = values[i, k]


@numba.njit(cache=True)
def _copy_rows(values, buffer, dest, n):
    """One per-row field, as bytes: ``values`` [n, width] into ``buffer`` [rows, width] for the steps that open a row
    (position 0 or a new row)."""
    width = buffer.shape[1]
    for i in range(n):
        if dest[i, 1] == 0:
            for k in range(width):
                buffer[dest[i, 0], k] = values[i, k]
        if dest[i, 2] >= 0:
            for k in range(width):
                buffer[dest[i, 2], k] = values[i, k]


@numba.njit(cache=True)
def add_steps_kernel(agent_ids, stamp, inputs, table, pool, horizon, ep_indices, ep_lengths, free_ring, full_ring,
                      rings, row_state, seen, dest):
    """Write steps; return rows completed, or a negative error code with NOTHING modified.

    Every field travels as bytes (4-byte words where its width allows), so one compiled kernel serves every
    layout: ``inputs`` (uint8) holds each field's values of this call's steps, [n, width] from the field's input
    offset; ``pool`` (uint8) holds each field's buffer, [rows, horizon, width] per step or [rows, width] per row
    from its pool offset; ``table`` has a row (input offset, width in bytes, pool offset, 1 per step / 0 per row)
    per field of width > 0. The rest is the bookkeeping,
    ``dest`` [num_agents, 3] the scratch for each step's (row, position, new row or -1).
    """
    n = agent_ids.shape[0]
    num_agents = ep_indices.shape[0]
    num_rows = free_ring.shape[0]
    needed = 0
    for i in range(n):  # validation pass: nothing is written unless the whole call can succeed
        a = agent_ids[i]
        if a < 0 or a >= num_agents:
            return ERR_BAD_AGENT
        if seen[a] == stamp:
            return ERR_DUP_AGENT
        seen[a] = stamp
        if ep_lengths[a] == horizon - 1:
            needed += 1
    if needed > rings[FREE_COUNT]:
        return ERR_NO_FREE
    completed = 0
    for i in range(n):  # bookkeeping pass: where each step goes, and rows that fill move to FULL
        a = agent_ids[i]
        row = ep_indices[a]
        t = ep_lengths[a]
        dest[i, 0] = row
        dest[i, 1] = t
        dest[i, 2] = -1
        t += 1
        if t == horizon:
            full_ring[(rings[FULL_HEAD] + rings[FULL_COUNT]) % num_rows] = row
            rings[FULL_COUNT] += 1
            row_state[row] = FULL
            new = free_ring[rings[FREE_HEAD]]
            rings[FREE_HEAD] = (rings[FREE_HEAD] + 1) % num_rows
            rings[FREE_COUNT] -= 1
            row_state[new] = WRITING
            dest[i, 2] = new  # the step is also step 0 of the agent's next row
            ep_indices[a] = new
            t = 1
            completed += 1
        ep_lengths[a] = t
    for f in range(table.shape[0]):
        at, nbytes, pool_at, per_step = table[f, 0], table[f, 1], table[f, 2], table[f, 3]
        if per_step and nbytes % 4 == 0:  # 4-byte words (every scalar field but the done flag): one move each
            words = nbytes // 4
            _copy_steps(inputs[at:at + n * nbytes].view(np.uint32).reshape((n, words)),
                        pool[pool_at:pool_at + num_rows * horizon * nbytes].view(np.uint32).reshape(
                            (num_rows, horizon, words)), dest, n)
        elif per_step:
            _copy_steps(inputs[at:at + n * nbytes].reshape((n, nbytes)),
                        pool[pool_at:pool_at + num_rows * horizon * nbytes].reshape((num_rows, horizon, nbytes)),
                        dest, n)
        else:
            _copy_rows(inputs[at:at + n * nbytes].reshape((n, nbytes)),
                       pool[pool_at:pool_at + num_rows * nbytes].reshape((num_rows, nbytes)), dest, n)
    return completed


@numba.njit(cache=True)
def gather_kernel(rows, num_rows, pool, table, payload):
    """Every field's bytes of ``rows`` into ``payload`` (a packed ROWS message's), field after field: ``table``
    [fields, 3] holds each field's offset in ``pool``, its bytes per row and its offset in ``payload``. Returns -1
    (and copies nothing) if a row is not in [0, num_rows)."""
    for j in range(rows.shape[0]):
        if rows[j] < 0 or rows[j] >= num_rows:
            return -1
    for f in range(table.shape[0]):  # unsigned indices: no negative-index wraparound, so LLVM vectorizes the copy
        source, width, dest = np.uint64(table[f, 0]), np.uint64(table[f, 1]), np.uint64(table[f, 2])
        for j in range(rows.shape[0]):
            src = source + np.uint64(rows[j]) * width
            dst = dest + np.uint64(j) * width
            for k in range(width):
                payload[dst + k] = pool[src + k]
    return 0


@numba.njit(cache=True)
def pop_full_kernel(full_ring, rings, row_state, out):
    """Move up to ``len(out)`` oldest full rows into ``out``; return how many."""
    num_rows = full_ring.shape[0]
    k = min(out.shape[0], rings[FULL_COUNT])
    head = rings[FULL_HEAD]
    for j in range(k):
        row = full_ring[(head + j) % num_rows]
        out[j] = row
        row_state[row] = SHIPPED
    rings[FULL_HEAD] = (head + k) % num_rows
    rings[FULL_COUNT] -= k
    return k


@numba.njit(cache=True)
def release_kernel(rows, free_ring, rings, row_state):
    """Push shipped rows back onto FREE; return 0, or an error code with nothing modified."""
    num_rows = free_ring.shape[0]
    for j in range(rows.shape[0]):
        r = rows[j]
        if r < 0 or r >= num_rows or row_state[r] != SHIPPED:
            for q in range(j):  # undo the marks of this call before failing
                row_state[rows[q]] = SHIPPED
            return ERR_BAD_ROW
        row_state[r] = FREE  # marking now also rejects a row repeated within this call
    for j in range(rows.shape[0]):
        free_ring[(rings[FREE_HEAD] + rings[FREE_COUNT]) % num_rows] = rows[j]
        rings[FREE_COUNT] += 1
    return 0
