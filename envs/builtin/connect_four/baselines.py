"""Fixed Connect Four opponents for ``envs/builtin/connect_four/game.py``, for a batch of agents at once.

Each takes what a policy sees (observation planes ``[n, 2, 6, 7]`` from the mover's point of view: plane 0 its
own stones, plane 1 the opponent's, any nonzero value is a stone; action masks ``[n, 7]``, 1 = legal) and
return one column per agent as ``int32[n]``, so any of them can stand in for a policy wherever one acts:

* ``random_legal_moves(masks, rng)``: uniformly random among the legal columns (masks of any width: it plays any
  env with a discrete action space and action masks, the ``random`` baseline);
* ``one_ply_moves(obs, masks, rng)``: a winning column if there is one, else a column that blocks the
  opponent's immediate win, else uniformly random legal (ties broken uniformly at random at every level).
* ``negamax_moves(obs, masks, rng, depth=N)``: uniformly random among the columns a depth-N negamax search
  for forced wins and losses scores best (``envs/builtin/connect_four/negamax.py``; a faster win and a later loss
  score higher, so depth 1 wins now and depth 2 also blocks); ``negamax_best_moves`` gives that set.

A row whose mask allows nothing is treated as unmasked (all 7 columns), as the learner treats masks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from envs.builtin.connect_four.game import COLS, ROWS, wins_through
from envs.builtin.connect_four.negamax import best_columns_kernel, check_depth
from envs.errors import EnvConfigError


def _keys(masks: np.ndarray, rng: np.random.Generator, *, width: int | None = COLS) -> tuple[np.ndarray, np.ndarray]:
    """Validated masks as bool [n, width] (an all-zero row: all legal; ``width`` None: any >= 1) and uniform random
    tie-break keys."""
    masks = np.asarray(masks)
    if masks.ndim != 2 or masks.shape[1] < 1:
        raise EnvConfigError(f"random legal moves need action masks of shape [n, actions >= 1], got {masks.shape} "
                             f"(the env has no action masks?)")
    if width is not None and masks.shape[1] != width:
        raise EnvConfigError(f"Connect Four masks must have shape [n, {COLS}], got {masks.shape}")
    legal = masks != 0
    legal[~legal.any(axis=1)] = True
    return legal, rng.random(masks.shape)


def _checked(obs: np.ndarray, masks: np.ndarray, rng: np.random.Generator,
             caller: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated observations [n, 2, 6, 7] with ``_keys``'s legal columns and tie-break keys for them."""
    obs = np.asarray(obs)
    if obs.ndim != 4 or obs.shape[1:] != (2, ROWS, COLS):
        raise EnvConfigError(f"Connect Four observations must have shape [n, 2, {ROWS}, {COLS}], got {obs.shape}")
    legal, keys = _keys(masks, rng)
    if len(obs) != len(legal):
        raise EnvConfigError(f"{caller}: {len(obs)} observations but {len(legal)} masks")
    return obs, legal, keys


def random_legal_moves(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row of ``masks`` ([n, actions], 1 = legal), as int32[n]."""
    legal, keys = _keys(masks, rng, width=None)
    return np.where(legal, keys, -1.0).argmax(axis=1).astype(np.int32)


@njit(cache=True)
def _one_ply_kernel(obs, legal, keys, out):
    grid = np.zeros((ROWS, COLS), dtype=np.int8)
    for i in range(obs.shape[0]):
        for r in range(ROWS):
            for c in range(COLS):
                grid[r, c] = 1 if obs[i, 0, r, c] != 0 else (2 if obs[i, 1, r, c] != 0 else 0)
        best = -1
        best_rank = -1
        best_key = -1.0
        for c in range(COLS):
            if not legal[i, c]:
                continue
            row = ROWS - 1
            while row >= 0 and grid[row, c] != 0:
                row -= 1
            rank = 0
            if row >= 0:  # (a full column can only be "legal" through an all-zero mask row)
                if wins_through(grid, row, c, 1):
                    rank = 2
                elif wins_through(grid, row, c, 2):
                    rank = 1
            if rank > best_rank or (rank == best_rank and keys[i, c] > best_key):
                best = c
                best_rank = rank
                best_key = keys[i, c]
        out[i] = best


def one_ply_moves(obs: np.ndarray, masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Win now if possible, else block the opponent's immediate win, else a uniformly random legal column.

    ``obs``: [n, 2, 6, 7] planes from the mover's point of view (row 0 at the top); ``masks``: [n, 7].
    """
    obs, legal, keys = _checked(obs, masks, rng, "one_ply_moves")
    out = np.empty(len(obs), dtype=np.int32)
    _one_ply_kernel(np.ascontiguousarray(obs), legal, keys, out)
    return out


def _best_columns(obs: np.ndarray, legal: np.ndarray, depth: int) -> np.ndarray:
    """The kernel's best-column mask for validated observations, legal columns and depth."""
    grids = np.where(obs[:, 0] != 0, 1, np.where(obs[:, 1] != 0, 2, 0)).astype(np.int8)
    best = np.zeros(legal.shape, dtype=bool)
    best_columns_kernel(grids, legal, depth, best)
    return best


def negamax_best_moves(obs: np.ndarray, masks: np.ndarray, *, depth: int) -> np.ndarray:
    """bool [n, 7]: the legal columns a ``depth``-ply negamax search for forced wins and losses scores best.

    Scores as in ``envs/builtin/connect_four/negamax.py`` (+ forced win, - forced loss, 0 otherwise; a faster win and
    a later loss score higher); ``obs``: [n, 2, 6, 7] planes from the mover's point of view; ``masks``: [n, 7].
    """
    depth = check_depth(depth)
    obs, legal, _ = _checked(obs, masks, np.random.default_rng(0), "negamax_best_moves")
    return _best_columns(obs, legal, depth)


def negamax_moves(obs: np.ndarray, masks: np.ndarray, rng: np.random.Generator, *, depth: int) -> np.ndarray:
    """One column per row, uniformly random among ``negamax_best_moves(obs, masks, depth=depth)``, as int32[n]."""
    depth = check_depth(depth)
    obs, legal, keys = _checked(obs, masks, rng, "negamax_moves")
    best = _best_columns(obs, legal, depth)
    return np.where(best, keys, -1.0).argmax(axis=1).astype(np.int32)
