"""evaluation.arena.play_match's per-game records (returns, lengths and seats from a's side) and its observer,
which ``python -m evaluation.evaluate --opponent`` reports per seat and draws videos from (issue 32)."""

from __future__ import annotations

import numpy as np

from configs.loader import load_config
from evaluation.arena import MatchOutcome, OnePlyPlayer, RandomPlayer, play_match

ENV = load_config(None, ["env.name=connect_four", "env.num_agents=2", "env.max_steps=0"]).env


class ColumnPlayer:
    """Always the given column while it is legal (else the first legal one)."""

    def __init__(self, name: str, column: int) -> None:
        self.name, self.column = name, column

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        fallback = (masks != 0).argmax(axis=1)
        return np.where(masks[:, self.column] != 0, self.column, fallback).astype(np.int32)


def test_each_game_is_recorded_from_a_side() -> None:
    """Whoever moves first stacks four in its column first: a wins the games it opens in 4 moves and loses the
    others after 3 of its own."""
    outcome = play_match(ColumnPlayer("a", 0), ColumnPlayer("b", 1), episodes=9, env_config=ENV, num_envs=4)
    assert outcome == MatchOutcome(wins_a=5, draws=0, wins_b=4, a_first=5)  # the records do not take part in ==
    assert len(outcome.returns_a) == len(outcome.lengths_a) == len(outcome.seats_a) == 9
    assert sorted(outcome.seats_a.tolist()) == [0] * 5 + [1] * 4
    first = outcome.seats_a == 0
    assert (outcome.returns_a[first] == 1).all() and (outcome.returns_a[~first] == -1).all()
    assert (outcome.lengths_a[first] == 4).all() and (outcome.lengths_a[~first] == 3).all()
    assert outcome.returns_a.dtype == np.float64 and outcome.lengths_a.dtype == outcome.seats_a.dtype == np.int64


def test_records_agree_with_the_totals_and_hand_made_outcomes_have_none() -> None:
    outcome = play_match(OnePlyPlayer(), RandomPlayer(), episodes=50, env_config=ENV, seed=4)
    assert int((outcome.returns_a > 0).sum()) == outcome.wins_a
    assert int((outcome.returns_a < 0).sum()) == outcome.wins_b
    assert int((outcome.returns_a == 0).sum()) == outcome.draws
    assert int((outcome.seats_a == 0).sum()) == outcome.a_first == 25
    assert ((outcome.lengths_a >= 3) & (outcome.lengths_a <= 21)).all()
    made = MatchOutcome(wins_a=1, draws=0, wins_b=0)
    assert len(made.returns_a) == len(made.lengths_a) == len(made.seats_a) == 0


def test_the_observer_sees_env_0_until_its_games_are_counted() -> None:
    seen: list[int] = []

    def observe(env, buffers) -> None:
        seen.append(int((env.board(0) != 0).sum()))

    # env 0 of 2 plays games 0 and 2: a opens game 0 (7 stones), b opens game 2 (7 stones)
    play_match(ColumnPlayer("a", 0), ColumnPlayer("b", 1), episodes=4, env_config=ENV, num_envs=2, observer=observe)
    assert seen == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6]
