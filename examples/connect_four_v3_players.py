"""The built-in Connect Four's one-ply baseline for PettingZoo's ``pettingzoo.classic.connect_four_v3``
(``env.name: pettingzoo_aec``), by entry point: ``examples.connect_four_v3_players:OnePlyV3Player``.

``connect_four_v3`` observes ``[n, 6, 7, 2]`` int8 (channels last; plane 0 the mover's stones, plane 1 the
opponent's, 1 where a stone is; row 0 at the top, as pettingzoo's ``observe`` reshapes its board of 42 squares);
``envs/builtin/connect_four/baselines.one_ply_moves`` reads the built-in env's ``[n, 2, 6, 7]`` planes (channels first,
any nonzero value a stone; the built-in env writes ``STONE``). So the player moves the channel axis first and writes
``STONE`` where a stone is, then plays exactly the built-in ``one_ply`` (win now, else block, else random legal).
Masks ``[n, 7]`` and actions (a column) are the same in both.
"""

from __future__ import annotations

import numpy as np

from envs.builtin.connect_four.baselines import one_ply_moves
from envs.builtin.connect_four.game import COLS, ROWS, STONE
from envs.builtin.connect_four.players import SeededPlayer


def builtin_planes(obs: np.ndarray) -> np.ndarray:
    """``connect_four_v3`` observations [n, 6, 7, 2] as the built-in env's planes [n, 2, 6, 7] uint8 (``STONE``/0)."""
    obs = np.asarray(obs)
    if obs.ndim != 4 or obs.shape[1:] != (ROWS, COLS, 2):
        raise ValueError(f"connect_four_v3 observations must have shape [n, {ROWS}, {COLS}, 2], got {obs.shape}")
    return np.where(np.moveaxis(obs, -1, 1) != 0, STONE, 0).astype(np.uint8)


class OnePlyV3Player(SeededPlayer):
    """One-ply (win, else block, else random legal) on ``connect_four_v3`` observations."""

    default_name = "one_ply_v3"

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """One column per row: ``obs`` [n, 6, 7, 2], ``masks`` [n, 7] -> int32 [n]."""
        return one_ply_moves(builtin_planes(obs), masks, self.rng)
