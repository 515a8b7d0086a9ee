"""The negamax baseline (envs/builtin/connect_four/negamax.py via envs.builtin.connect_four.baselines.negamax_moves) against an
independent pure-Python negamax, on random reachable positions and hand-built ones."""

from __future__ import annotations

import numpy as np
import pytest

from envs.builtin.connect_four.baselines import negamax_best_moves, negamax_moves, one_ply_moves
from envs.errors import EnvConfigError

ROWS, COLS = 6, 7
WINDOWS = [[(r + k * dr, c + k * dc) for k in range(4)]
           for r in range(ROWS) for c in range(COLS) for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1))
           if 0 <= r + 3 * dr < ROWS and 0 <= c + 3 * dc < COLS]
WINDOWS_THROUGH = {(r, c): [w for w in WINDOWS if (r, c) in w] for r in range(ROWS) for c in range(COLS)}


# --- the reference: plain negamax on lists, no numba, no pruning -------------------------------------------


def landing_row(board: list[list[int]], col: int) -> int:
    """The row a stone dropped in ``col`` lands on, -1 if the column is full (row 0 is the top)."""
    for row in range(ROWS - 1, -1, -1):
        if board[row][col] == 0:
            return row
    return -1


def completes_four(board: list[list[int]], row: int, col: int, piece: int) -> bool:
    """Whether ``piece`` at (row, col) fills one of the 69 windows of four (the other three cells are its)."""
    return any(all((r, c) == (row, col) or board[r][c] == piece for r, c in window)
               for window in WINDOWS_THROUGH[(row, col)])


def reference_value(board: list[list[int]], piece: int, depth: int) -> int:
    """Plain negamax value for ``piece`` to move: a win at ply k scores depth + 1 - k, a loss the negative."""
    scores = [reference_move_score(board, piece, col, depth) for col in range(COLS)
              if landing_row(board, col) >= 0]
    return max(scores) if scores else 0


def reference_move_score(board: list[list[int]], piece: int, col: int, depth: int) -> int:
    """Score of ``piece`` playing ``col`` with ``depth`` plies to search (this move included)."""
    row = landing_row(board, col)
    if row < 0:
        return -(depth + 1)
    if completes_four(board, row, col, piece):
        return depth
    if depth == 1:
        return 0
    board[row][col] = piece
    value = -reference_value(board, 3 - piece, depth - 1)
    board[row][col] = 0
    return value


def reference_best(board: list[list[int]], legal: list[bool], depth: int) -> set[int]:
    """The legal columns with the highest reference score for the mover (piece 1)."""
    scores = {col: reference_move_score(board, 1, col, depth) for col in range(COLS) if legal[col]}
    top = max(scores.values())
    return {col for col, score in scores.items() if score == top}


# --- positions -----------------------------------------------------------------------------------------------


def to_obs(board: list[list[int]]) -> np.ndarray:
    """[2, 6, 7] uint8 planes from piece 1's (the mover's) point of view."""
    grid = np.array(board)
    return np.stack([(grid == 1) * 255, (grid == 2) * 255]).astype(np.uint8)


def from_rows(rows: list[str]) -> list[list[int]]:
    """A board from 6 strings, top row first: 'x' the mover, 'o' the opponent, '.' empty."""
    assert len(rows) == ROWS and all(len(r) == COLS for r in rows)
    return [[{"x": 1, "o": 2, ".": 0}[ch] for ch in row] for row in rows]


def random_position(rng: np.random.Generator) -> list[list[int]]:
    """A reachable, unfinished position with at least one legal move, as seen by the player to move (piece 1)."""
    while True:
        board = [[0] * COLS for _ in range(ROWS)]
        moves = int(rng.integers(0, 36))
        piece, over = 1, False
        for _ in range(moves):
            col = int(rng.choice([c for c in range(COLS) if landing_row(board, c) >= 0]))
            row = landing_row(board, col)
            over = completes_four(board, row, col, piece)
            board[row][col] = piece
            piece = 3 - piece
            if over:
                break
        if not over:
            # piece is the player to move: relabel so that the mover is 1
            return [[0 if v == 0 else (1 if v == piece else 2) for v in row] for row in board]


def random_legal_subset(board: list[list[int]], rng: np.random.Generator) -> list[bool]:
    """The open columns, sometimes with a random part of them masked out (never all)."""
    open_cols = [landing_row(board, c) >= 0 for c in range(COLS)]
    if rng.random() < 0.5:
        return open_cols
    keep = [ok and rng.random() < 0.6 for ok in open_cols]
    return keep if any(keep) else open_cols


SAMPLES = {1: 60, 2: 60, 3: 60, 4: 40}
"""Random positions checked at each depth."""


@pytest.mark.parametrize("depth", sorted(SAMPLES))
def test_matches_plain_negamax_on_random_positions(depth):
    rng = np.random.default_rng(100 + depth)
    count = SAMPLES[depth]
    boards = [random_position(rng) for _ in range(count)]
    legal = [random_legal_subset(b, rng) for b in boards]
    obs = np.stack([to_obs(b) for b in boards])
    masks = np.array(legal, dtype=np.uint8)
    best = negamax_best_moves(obs, masks, depth=depth)
    moves = negamax_moves(obs, masks, np.random.default_rng(depth), depth=depth)
    assert moves.dtype == np.int32 and moves.shape == (count,)
    for i, board in enumerate(boards):
        expected = reference_best(board, legal[i], depth)
        assert set(np.flatnonzero(best[i]).tolist()) == expected, (depth, i, board)
        assert int(moves[i]) in expected


@pytest.mark.parametrize("depth, values", [(3, {3, 1, 0, -2}), (4, {4, 2, 0, -1, -3})])
def test_the_random_positions_are_not_all_quiet(depth, values):
    """Among the positions above: wins now and at ply 3, losses at ply 2 and 4, and nothing forced."""
    rng = np.random.default_rng(100 + depth)
    boards = [random_position(rng) for _ in range(SAMPLES[depth])]
    assert {reference_value(board, 1, depth) for board in boards} == values


# --- hand-built positions -------------------------------------------------------------------------------------

OPEN_TWO = from_rows([".......",
                      ".......",
                      ".......",
                      ".......",
                      "..oo...",
                      "..xx..."])
"""x to move: 1 or 4 makes an open three on the bottom row, a win at ply 3 that o cannot stop."""

MUST_BLOCK = from_rows([".......",
                        ".......",
                        ".......",
                        ".......",
                        "xx.....",
                        "ooo...x"])
"""x to move: o wins at column 3 next unless x blocks there."""


def best_set(board: list[list[int]], depth: int, mask: list[int] | None = None) -> set[int]:
    masks = np.array([mask if mask is not None else [1] * COLS], dtype=np.uint8)
    return set(np.flatnonzero(negamax_best_moves(to_obs(board)[None], masks, depth=depth)[0]).tolist())


def test_forced_win_in_three_that_one_ply_misses():
    assert best_set(OPEN_TWO, 1) == set(range(COLS))  # nothing to win now or to block: all equal
    one_ply = one_ply_moves(np.repeat(to_obs(OPEN_TWO)[None], 300, axis=0), np.ones((300, COLS), np.uint8),
                            np.random.default_rng(0))
    assert set(one_ply.tolist()) == set(range(COLS))
    for depth in (3, 4):
        assert best_set(OPEN_TWO, depth) == {1, 4} == reference_best(OPEN_TWO, [True] * COLS, depth)
        moves = negamax_moves(np.repeat(to_obs(OPEN_TWO)[None], 50, axis=0), np.ones((50, COLS), np.uint8),
                              np.random.default_rng(depth), depth=depth)
        assert set(moves.tolist()) == {1, 4}


def test_must_block_is_blocked_from_depth_two():
    assert best_set(MUST_BLOCK, 1) == set(range(COLS))
    for depth in (2, 3, 4):
        assert best_set(MUST_BLOCK, depth) == {3} == reference_best(MUST_BLOCK, [True] * COLS, depth)


def test_win_now_beats_a_later_win_and_a_later_loss_beats_an_earlier_one():
    # x wins now in column 6; 0, 3 and 4 add a second threat to it, a win at ply 3 (later, so not as good)
    win_now = from_rows([".......",
                         ".......",
                         ".......",
                         ".o....x",
                         ".oo..ox",
                         ".xx..ox"])
    assert [col for col in range(COLS) if reference_move_score(win_now, 1, col, 3) > 0] == [0, 3, 4, 6]
    for depth in (1, 2, 3, 4):
        assert best_set(win_now, depth) == {6}
    # o threatens column 6 now, and has an open two on the bottom row: blocking 6 only delays the loss to
    # ply 4 (o makes an open three, x can block one end); any other move loses at ply 2.
    delayed = from_rows([".......",
                         ".......",
                         "......o",
                         "..xx..o",
                         "..xx..o",
                         "..oo..x"])
    assert reference_value(delayed, 1, 4) == -1  # lost within 4 plies whatever x does
    for depth in (2, 3, 4):
        assert best_set(delayed, depth) == {6} == reference_best(delayed, [True] * COLS, depth)


def test_masks_full_columns_and_all_zero_rows():
    # column 3 is full and masked out; x wins now in column 4 (vertically)
    board = from_rows(["...o...",
                       "...x...",
                       "...o...",
                       "...ox..",
                       "...xx..",
                       "..oox.."])
    mask = [1, 1, 1, 0, 1, 1, 1]
    assert best_set(board, 2, mask) == {4} == reference_best(board, [bool(m) for m in mask], 2)
    no_win = [1, 1, 1, 0, 0, 1, 1]  # the mask forbids the win too: neither masked column is ever best
    for depth in (1, 2, 3):
        expected = reference_best(board, [bool(m) for m in no_win], depth)
        assert best_set(board, depth, no_win) == expected and not expected & {3, 4}
    # an all-zero mask row means all columns legal: the winning column 4 is found, the full column 3 never picked
    zero = np.zeros((200, COLS), np.uint8)
    moves = negamax_moves(np.repeat(to_obs(board)[None], 200, axis=0), zero, np.random.default_rng(1), depth=2)
    assert set(moves.tolist()) == {4}
    quiet = from_rows(["...o...",
                       "...x...",
                       "...o...",
                       "...x...",
                       "...o...",
                       "...x..."])
    moves = negamax_moves(np.repeat(to_obs(quiet)[None], 300, axis=0), zero[:1].repeat(300, 0),
                          np.random.default_rng(2), depth=2)
    assert set(moves.tolist()) == {0, 1, 2, 4, 5, 6}


def test_ties_are_broken_among_all_equals():
    obs = np.zeros((200, 2, ROWS, COLS), np.uint8)
    moves = negamax_moves(obs, np.ones((200, COLS), np.uint8), np.random.default_rng(3), depth=2)
    assert set(moves.tolist()) == set(range(COLS))
    counts = np.bincount(moves, minlength=COLS)
    assert counts.min() > 10, counts  # 200 / 7 = 28.6 expected each
    again = negamax_moves(obs, np.ones((200, COLS), np.uint8), np.random.default_rng(3), depth=2)
    assert (again == moves).all()  # the rng alone decides


@pytest.mark.parametrize("depth", [0, -1, 1.5, True, "2", None])
def test_bad_depth_is_refused(depth):
    obs = np.zeros((1, 2, ROWS, COLS), np.uint8)
    with pytest.raises(EnvConfigError, match=r"negamax depth must be an integer >= 1 \(plies searched\), got"):
        negamax_moves(obs, np.ones((1, COLS), np.uint8), np.random.default_rng(0), depth=depth)
    with pytest.raises(EnvConfigError, match="negamax depth must be an integer >= 1"):
        negamax_best_moves(obs, np.ones((1, COLS), np.uint8), depth=depth)


def test_shape_errors():
    with pytest.raises(EnvConfigError, match=r"observations must have shape \[n, 2, 6, 7\]"):
        negamax_moves(np.zeros((1, 6, 7)), np.ones((1, COLS)), np.random.default_rng(0), depth=2)
    with pytest.raises(EnvConfigError, match="negamax_moves: 2 observations but 1 masks"):
        negamax_moves(np.zeros((2, 2, 6, 7)), np.ones((1, COLS)), np.random.default_rng(0), depth=2)
