"""A perfect tic-tac-toe player for PettingZoo's ``pettingzoo.classic.tictactoe_v3`` (``env.name: pettingzoo_aec``).

Name it as a baseline by its entry point, ``examples.tictactoe_players:MinimaxPlayer`` (``selfplay.baseline_opponents``,
``evaluation.baselines``, ``python -m evaluation.elo --baselines random,examples.tictactoe_players:MinimaxPlayer``,
``python -m evaluation.evaluate --opponent examples.tictactoe_players:MinimaxPlayer``); it is built as
``MinimaxPlayer(seed=<int>)``.

What it reads (checked against pettingzoo's ``tictactoe.py`` and ``board.py``): observations ``[n, 3, 3, 2]`` int8
from the mover's point of view, plane 0 its own marks and plane 1 the opponent's (1 where a mark is), ``obs[r, c]``
being square ``3 r + c`` of the board; masks ``[n, 9]`` (1 = legal); action ``a`` marks square ``a``, so it is cell
``(a // 3, a % 3)`` of the planes. Lines are pettingzoo's ``Board.winning_combinations``.

The player searches the whole game tree (memoised, at most 3**9 positions, once per process) and plays uniformly at
random among the moves with the best score: +(1 + empty squares left) for a forced win (a faster win scores higher),
0 for a draw, minus that for a forced loss. So it never loses, wins whenever it can force a win, and two of them
always draw.
"""

from __future__ import annotations

import functools

import numpy as np

CELLS = 9
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
"""The squares of every line (pettingzoo.classic.tictactoe.board.Board.winning_combinations)."""
OWN, THEIRS = 1, 2
"""A square's value in a board tuple seen from the mover's side (0: empty)."""


def _wins(board: tuple[int, ...], mark: int) -> bool:
    """Whether ``mark`` holds a whole line of ``board``."""
    return any(board[a] == board[b] == board[c] == mark for a, b, c in LINES)


@functools.lru_cache(maxsize=None)
def move_scores(board: tuple[int, ...]) -> tuple[int | None, ...]:
    """Per square, the score of the mover marking it (None where the square is taken), with perfect play after.

    ``board``: 9 values, 0 empty, ``OWN`` the mover's marks, ``THEIRS`` the opponent's.
    """
    scores: list[int | None] = []
    for square in range(CELLS):
        if board[square]:
            scores.append(None)
            continue
        after = board[:square] + (OWN,) + board[square + 1:]
        empty = after.count(0)
        if _wins(after, OWN):
            scores.append(1 + empty)
        elif empty == 0:
            scores.append(0)
        else:  # the opponent moves next: its view swaps the marks, and its best score is ours negated
            swapped = tuple(0 if v == 0 else THEIRS if v == OWN else OWN for v in after)
            scores.append(-max(s for s in move_scores(swapped) if s is not None))
    return tuple(scores)


def board_of(obs: np.ndarray) -> tuple[int, ...]:
    """The board tuple (square ``3 r + c``) of one ``[3, 3, 2]`` observation from the mover's side."""
    own = np.asarray(obs)[:, :, 0].reshape(CELLS) != 0
    theirs = np.asarray(obs)[:, :, 1].reshape(CELLS) != 0
    return tuple(int(v) for v in np.where(own, OWN, np.where(theirs, THEIRS, 0)))


class MinimaxPlayer:
    """Perfect play: uniformly random among the best-scoring legal squares (see the module docstring)."""

    def __init__(self, *, seed: int = 0, name: str = "minimax") -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        """Restart the tie-break generator from ``seed``."""
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """One square per row: ``obs`` [n, 3, 3, 2], ``masks`` [n, 9] -> int32 [n]."""
        obs, masks = np.asarray(obs), np.asarray(masks)
        if obs.ndim != 4 or obs.shape[1:] != (3, 3, 2) or masks.shape != (len(obs), CELLS):
            raise ValueError(f"MinimaxPlayer plays tictactoe_v3: obs [n, 3, 3, 2] and masks [n, 9], got "
                             f"{obs.shape} and {masks.shape}")
        actions = np.zeros(len(obs), dtype=np.int32)
        for i in range(len(obs)):
            scores = move_scores(board_of(obs[i]))
            legal = [s for s in range(CELLS) if scores[s] is not None and (masks[i, s] or not masks[i].any())]
            if not legal:  # a full board: nothing to choose (the env ignores it)
                continue
            best = max(scores[s] for s in legal)
            actions[i] = self.rng.choice([s for s in legal if scores[s] == best])
        return actions
