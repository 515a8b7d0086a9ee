"""Depth-limited negamax for Connect Four: which root columns are best for the player to move (numba).

Used by ``negamax_moves`` in ``envs/builtin/connect_four/baselines.py`` (the ``negamax-<depth>`` baselines); it only
looks for forced wins and losses within ``depth`` plies (no heuristic evaluation), so most quiet positions
score 0 for every move.

Score of a move, from the mover's point of view, searching ``depth`` plies (the move itself is ply 1):

* a forced win whose winning stone is ply ``k`` scores ``depth + 1 - k`` (> 0; a faster win scores higher);
* a forced loss whose losing stone (the opponent's) is ply ``k`` scores ``-(depth + 1 - k)`` (< 0; a later
  loss scores higher);
* anything else (a draw by a full board, or nothing forced within ``depth`` plies) scores 0.

That is plain negamax on {+1 win, -1 loss, 0 otherwise} with the win/loss distance folded in: its sign is
the plain score's. The search uses alpha-beta (iterative, so numba can cache it), and each root move is
searched with the window (best so far - 1, +inf), so the set of best columns is exactly plain negamax's. A
column that is legal by the mask but full (only through an all-zero mask row) scores ``-(depth + 1)``, below
every playable column.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from envs.builtin.connect_four.game import COLS, ROWS, wins_through
from envs.errors import EnvConfigError

SEARCH_ORDER = (3, 2, 4, 1, 5, 0, 6)
"""Columns tried centre first (more alpha-beta cut-offs; the result does not depend on the order)."""


def check_depth(depth: int) -> int:
    """``depth`` if it is an integer >= 1, else an ``EnvConfigError`` naming the parameter."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise EnvConfigError(f"negamax depth must be an integer >= 1 (plies searched), got {depth!r}")
    return int(depth)


UNDECIDED = 1 << 30
"""``_decided_value``'s answer for a position that needs its moves searched."""


@njit(cache=True)
def _decided_value(grid, heights, piece, depth):
    """The value of a position that needs no search (a win now, the last ply, a full board), else UNDECIDED."""
    for c in range(COLS):
        if heights[c] >= 0 and wins_through(grid, heights[c], c, piece):
            return depth  # the best any move can score
    if depth == 1:
        return 0
    for c in range(COLS):
        if heights[c] >= 0:
            return UNDECIDED
    return 0  # a full board: a draw


@njit(cache=True)
def _undo(grid, heights, col):
    """Take the top stone out of column ``col``."""
    heights[col] += 1
    grid[heights[col], col] = 0


@njit(cache=True)
def _negamax(grid, heights, piece, depth, alpha, beta):
    """Fail-soft alpha-beta value (see the module docstring) of ``grid`` for ``piece`` to move, ``depth`` plies.

    ``heights[c]`` is the row a stone dropped in column ``c`` lands on (-1: full); ``grid`` and ``heights`` are
    restored before returning. Iterative with an explicit stack (numba cannot cache a recursive function):
    node ``ply`` has ``piece`` to move when ``ply`` is even, ``depth - ply`` plies left, its window in
    ``alphas``/``betas``, its best score so far in ``bests``, the next column to try in ``tried``.
    """
    value = _decided_value(grid, heights, piece, depth)
    if value != UNDECIDED:
        return value
    alphas = np.empty(depth, dtype=np.int64)
    betas = np.empty(depth, dtype=np.int64)
    bests = np.empty(depth, dtype=np.int64)
    tried = np.zeros(depth, dtype=np.int64)
    played = np.empty(depth, dtype=np.int64)
    alphas[0], betas[0], bests[0] = alpha, beta, -(depth + 1)
    ply = 0
    while True:
        col = -1
        while alphas[ply] < betas[ply] and tried[ply] < COLS and col < 0:
            candidate = SEARCH_ORDER[tried[ply]]
            tried[ply] += 1
            if heights[candidate] >= 0:
                col = candidate
        if col < 0:  # node done: hand its value to the parent
            if ply == 0:
                return bests[0]
            score = -bests[ply]
            ply -= 1
            _undo(grid, heights, played[ply])
        else:
            mover = piece if ply % 2 == 0 else 3 - piece
            grid[heights[col], col] = mover
            heights[col] -= 1
            played[ply] = col
            value = _decided_value(grid, heights, 3 - mover, depth - ply - 1)
            if value == UNDECIDED:
                ply += 1
                alphas[ply], betas[ply], bests[ply] = -betas[ply - 1], -alphas[ply - 1], -(depth - ply + 1)
                tried[ply] = 0
                continue
            score = -value
            _undo(grid, heights, col)
        if score > bests[ply]:
            bests[ply] = score
            if score > alphas[ply]:
                alphas[ply] = score


@njit(cache=True)
def _root_scores(grid, heights, legal_row, depth, scores):
    """Each legal root column's score into ``scores`` (exact for the best ones; the others are < the best)."""
    best = -(depth + 2)
    for k in range(COLS):
        c = SEARCH_ORDER[k]
        if not legal_row[c]:
            continue
        row = heights[c]
        if row < 0:
            score = -(depth + 1)
        elif wins_through(grid, row, c, 1):
            score = depth
        elif depth == 1:
            score = 0
        else:
            grid[row, c] = 1
            heights[c] = row - 1
            # Window (best - 1, +inf): a score >= best comes back exact, one below it only as an upper bound.
            score = -_negamax(grid, heights, 2, depth - 1, -(depth + 2), -(best - 1))
            grid[row, c] = 0
            heights[c] = row
        scores[c] = score
        if score > best:
            best = score
    return best


@njit(cache=True)
def best_columns_kernel(grids, legal, depth, best_out):
    """``best_out[i, c]``: whether column ``c`` is among the best-scoring legal columns of ``grids[i]``.

    ``grids``: int8 [n, 6, 7], 1 = the mover's stone, 2 = the opponent's, 0 = empty; ``legal``: bool [n, 7]
    with at least one True per row.
    """
    heights = np.empty(COLS, dtype=np.int64)
    scores = np.empty(COLS, dtype=np.int64)
    for i in range(grids.shape[0]):
        grid = grids[i].copy()
        for c in range(COLS):
            row = ROWS - 1
            while row >= 0 and grid[row, c] != 0:
                row -= 1
            heights[c] = row
        best = _root_scores(grid, heights, legal[i], depth, scores)
        for c in range(COLS):
            best_out[i, c] = legal[i, c] and scores[c] == best
