"""The fixed baseline players of Connect Four, by name (``configs.baselines``): random, one_ply, negamax-<depth>.

Thin players over ``envs/builtin/connect_four/baselines.py``'s move functions: ``act(obs, masks)`` for a batch of agents,
``reseed(seed)`` to restart their tie-break generator (``random`` plays any env with action masks). Every baseline
name, entry points too, is resolved by ``envs/baseline_players.py``, which builds the fixed ones here; the arena
(``evaluation/arena.py``) plays them in matches, actor hosts as opponents in training (``selfplay.baseline_opponents``).
"""

from __future__ import annotations

import numpy as np

from configs.baselines import BASELINE_FORMS, NEGAMAX_PREFIX, baseline_strength
from envs.builtin.connect_four.baselines import negamax_moves, one_ply_moves, random_legal_moves
from envs.builtin.connect_four.negamax import check_depth


class SeededPlayer:
    """A named baseline player with its own tie-break generator; subclasses define ``act(obs, masks)`` and the
    ``default_name`` a player gets when none is given."""

    default_name = "baseline"

    def __init__(self, name: str | None = None, *, seed: int = 0) -> None:
        self.name = self.default_name if name is None else name
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        """Restart the move generator from ``seed``."""
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """One move per row of ``masks`` (obs [n, 2, 6, 7], masks [n, 7])."""
        raise NotImplementedError


class RandomPlayer(SeededPlayer):
    """Uniformly random legal moves (any discrete action space with masks; the ``random`` baseline)."""

    default_name = "random"

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """One uniformly random legal action per row of ``masks``."""
        return random_legal_moves(masks, self.rng)


class OnePlyPlayer(SeededPlayer):
    """Connect Four's one-ply baseline: win now, else block, else random legal (the ``one_ply`` baseline)."""

    default_name = "one_ply"

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """One-ply moves for Connect Four observations [n, 2, 6, 7]."""
        return one_ply_moves(obs, masks, self.rng)


class NegamaxPlayer(SeededPlayer):
    """Connect Four's depth-limited negamax baseline: random among the moves a ``depth``-ply search for forced
    wins and losses scores best (the ``negamax-<depth>`` baselines)."""

    def __init__(self, name: str = "negamax", *, depth: int, seed: int = 0) -> None:
        super().__init__(name, seed=seed)
        self.depth = check_depth(depth)

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Negamax moves for Connect Four observations [n, 2, 6, 7]."""
        return negamax_moves(obs, masks, self.rng, depth=self.depth)


def baseline_player(name: str, *, seed: int) -> SeededPlayer:
    """The player behind a baseline name; ValueError for any other name."""
    if baseline_strength(name) is None:
        raise ValueError(f"unknown baseline {name!r}; allowed: {BASELINE_FORMS}")
    if name == "random":
        return RandomPlayer(name, seed=seed)
    if name == "one_ply":
        return OnePlyPlayer(name, seed=seed)
    return NegamaxPlayer(name, depth=int(name[len(NEGAMAX_PREFIX):]), seed=seed)
