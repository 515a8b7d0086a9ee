"""The gate a challenger passes to replace the kept best (``evaluation.gate_games``; evaluation/during_training.py).

A challenger is a snapshot whose mean score against the baselines is at least the kept best's. With
``gate_games: N > 0`` it replaces the kept best only if both hold:

1. **head-to-head**: it scores significantly above 0.5 in N games against the kept best: at least 0.5 plus ``Z``
   standard errors of an even match's score (0.571 for N = 200; measured: a challenger kept at 0.515, a coin
   flip, was rated 4.5 +- 11.5 Elo above its predecessor in the round-robin of kept bests, a fall in 37% of
   resampled tournaments);
2. **against the lineage**: it plays N games against each EARLIER kept best (every snapshot that was the kept best
   before the current one; none for the first two bests), and the current kept best plays the very same games
   (same seeds, same sampler streams); the challenger's mean score over them must not be significantly below the
   kept best's: at least the kept best's mean minus ``Z`` standard errors of the difference (binomial
   errors of N games each, taken as independent: the same games only make the real error smaller).

Why the second rule: the ELO tool rates the kept bests with one Bradley-Terry fit over all of them and the
baselines, so a challenger that beats the kept best head-to-head but loses more often than it did to the earlier
ones can be rated below it, and the kept best's ELO curve falls (measured on a Connect Four run: update 330 beat
270 head-to-head, 0.85, but scored 0.90 against the earlier kept bests where 270 scored 0.95, and was rated 9 Elo
lower). Why the tolerance: early kept bests are weak, every later snapshot wins ~90% against them, and a strict
"at least" became a coin flip on noise (measured: it kept a snapshot with mean 0.53 against the baselines for 400
updates while challengers at 0.70-0.80 lost it by 0.001-0.02). Both sides SAMPLE their moves in every gate game,
whatever ``evaluation.greedy`` says: two greedy policies would replay the same two games (one per seat) for all N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file as load_safetensors

from configs.schema import RunConfig
from envs.base import EnvSpec
from evaluation.arena import MatchOutcome, PolicyPlayer, play_match
from evaluation.best_snapshot import BEST_DIR, KeptBest
from evaluation.elo import pairing_seed
from learner.pool.store import SnapshotStore, SnapshotStoreError

CHALLENGER_NAME = "snapshot"
"""The challenger's name in the gate's pairing seeds (the current kept best takes it too when it replays the
challenger's games against the earlier kept bests)."""
KEPT_BEST_NAME = "kept_best"
"""The current kept best's name in the head-to-head."""
Z = 2.0
"""Standard errors behind both statistical rules (one-sided, ~2%): rule 1's head-to-head must be this far above an
even score, rule 2 rejects a challenger this far below the kept best against the earlier kept bests."""


def head_to_head_bar(games: int) -> float:
    """Rule 1's bar: an even score plus Z standard errors of it over ``games`` games, 0.5 + Z * sqrt(0.25 / games)."""
    return 0.5 + Z * math.sqrt(0.25 / games)


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """What a challenger scored in the gate, from its side."""

    against_best: MatchOutcome
    """The head-to-head against the current kept best."""
    earlier: tuple[int, ...] = ()
    """Updates of the earlier kept bests played (empty: rule 2 did not apply)."""
    challenger_scores: tuple[float, ...] = ()
    """The challenger's score against each of ``earlier``."""
    kept_best_scores: tuple[float, ...] = ()
    """The current kept best's score in the same games."""
    games: int = 0
    """Games per earlier kept best."""

    @property
    def challenger_score(self) -> float | None:
        """The challenger's mean score against the earlier kept bests (None: none played)."""
        return _mean(self.challenger_scores)

    @property
    def kept_best_score(self) -> float | None:
        """The kept best's mean score in the same games (None: none played)."""
        return _mean(self.kept_best_scores)

    @property
    def tolerance(self) -> float:
        """How far below the kept best's mean the challenger's may be: Z standard errors of the difference
        of the two means (binomial errors of ``games`` games per score; 0 when nothing was played)."""
        if not self.earlier:
            return 0.0
        variance = sum(p * (1 - p) for p in (*self.challenger_scores, *self.kept_best_scores)) / self.games
        return Z * math.sqrt(variance) / len(self.earlier)

    @property
    def passed(self) -> bool:
        """Both rules: head-to-head significantly above an even score, and against the earlier kept bests not
        significantly worse."""
        if self.against_best.score_a < head_to_head_bar(self.against_best.games):
            return False
        return not self.earlier or self.challenger_score >= self.kept_best_score - self.tolerance

    def record(self) -> dict:
        """The keys this adds to the challenger's evaluation.jsonl line."""
        o = self.against_best
        doc = {"against_best": {"wins": o.wins_a, "draws": o.draws, "losses": o.wins_b, "games": o.games,
                                "score": o.score_a, "bar": head_to_head_bar(o.games)}, "gate_passed": self.passed}
        if self.earlier:
            doc["against_earlier_bests"] = {
                "updates": list(self.earlier), "games": self.games, "scores": list(self.challenger_scores),
                "kept_best_scores": list(self.kept_best_scores), "score": self.challenger_score,
                "kept_best_score": self.kept_best_score, "tolerance": self.tolerance}
        return doc


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class KeptBestGate:
    """Plays a challenger against the kept best and the earlier kept bests (see the module docstring)."""

    def __init__(self, run_dir: Path, config: RunConfig, spec: EnvSpec, store: SnapshotStore, *, games: int,
                 seed: int) -> None:
        self.run_dir = run_dir
        self.config = config
        self.spec = spec
        self.store = store
        self.games = games
        self.seed = seed

    def judge(self, arrays: dict[str, np.ndarray], version: int, *, best: dict,
              earlier: Sequence[KeptBest]) -> GateResult | None:
        """The challenger (weights ``arrays``, policy ``version``) against the kept best (``best``: best.json's
        document) and then each of ``earlier`` (the kept bests before it, oldest first; one whose weights are no
        longer in the pool is left out). None when the kept best's weights cannot be read: no gate."""
        try:
            kept_arrays = load_safetensors(str(self.run_dir / BEST_DIR / best["weights"]))
        except (OSError, TypeError, KeyError, SafetensorError):
            return None
        kept_version = int(best.get("policy_version", 0))
        challenger = self._player(CHALLENGER_NAME, arrays, version)
        against_best = self._match(challenger, self._player(KEPT_BEST_NAME, kept_arrays, kept_version), KEPT_BEST_NAME)
        head_to_head = GateResult(against_best=against_best)
        if not head_to_head.passed:  # rule 1 failed: the lineage games cannot change the verdict
            return head_to_head
        kept_as_challenger = self._player(CHALLENGER_NAME, kept_arrays, kept_version)
        played, mine, theirs = [], [], []
        for old in earlier:
            old_player = self._earlier_player(old)
            if old_player is None:
                continue
            name = f"kept_best@{old.update}"
            played.append(old.update)
            mine.append(self._match(challenger, old_player, name).score_a)
            theirs.append(self._match(kept_as_challenger, old_player, name).score_a)
        if not played:
            return head_to_head
        return GateResult(against_best=against_best, earlier=tuple(played), challenger_scores=tuple(mine),
                          kept_best_scores=tuple(theirs), games=self.games)

    def _player(self, name: str, arrays: dict[str, np.ndarray], version: int) -> PolicyPlayer:
        return PolicyPlayer(name, self.spec, self.config.model, arrays, greedy=False, seed=self.seed,
                            version=version)

    def _earlier_player(self, old: KeptBest) -> PolicyPlayer | None:
        try:
            arrays = self.store.load(old.hash)
        except (OSError, SnapshotStoreError, SafetensorError):
            return None
        return self._player(f"kept_best@{old.update}", arrays, old.policy_version)

    def _match(self, a: PolicyPlayer, b: PolicyPlayer, b_name: str) -> MatchOutcome:
        """``gate_games`` games; the seed depends on the opponent's name only, so the challenger and the kept best
        (both named CHALLENGER_NAME) meet the same games of an earlier kept best."""
        return play_match(a, b, episodes=self.games, env_config=self.config.env,
                          seed=pairing_seed(self.seed, CHALLENGER_NAME, b_name))
