"""Baselines by name on PettingZoo AEC games: entry points resolved in envs.baseline_players (and its errors), the
perfect tic-tac-toe player, the connect_four_v3 one-ply player, and evaluation.arena.play_match through the AEC
adapter."""

from __future__ import annotations

import numpy as np
import pytest

from actors.opponents import opponent_for
from configs.baselines import baseline_env_problem, is_baseline_name
from configs.env_config import EnvConfig
from envs.baseline_players import baseline_player
from envs.builtin.connect_four.baselines import one_ply_moves
from envs.errors import EnvConfigError
from evaluation.arena import NegamaxPlayer, RandomPlayer, play_match
from examples.connect_four_v3_players import OnePlyV3Player, builtin_planes
from examples.tictactoe_players import MinimaxPlayer, move_scores

MINIMAX = "examples.tictactoe_players:MinimaxPlayer"
TICTACTOE = EnvConfig(name="pettingzoo_aec", entry_point="pettingzoo.classic.tictactoe_v3:env", num_agents=2,
                      max_steps=0)
CONNECT_FOUR_V3 = EnvConfig(name="pettingzoo_aec", entry_point="pettingzoo.classic.connect_four_v3:env", num_agents=2,
                            max_steps=0)


class Recorder:
    """An entry-point player that remembers its seed."""

    def __init__(self, *, seed: int) -> None:
        self.seed = seed

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return (masks != 0).argmax(axis=1).astype(np.int32)


def raises(seed: int) -> None:
    raise RuntimeError("no board")


def no_act(seed: int) -> int:
    return seed


NOT_CALLABLE = 5


def test_names_resolve_to_players_with_their_seed() -> None:
    assert isinstance(baseline_player("random", seed=0), RandomPlayer)
    assert baseline_player("negamax-3", seed=0).depth == 3 and isinstance(baseline_player("negamax-3", seed=0),
                                                                          NegamaxPlayer)
    player = baseline_player("tests.test_aec_baselines:Recorder", seed=17)
    assert isinstance(player, Recorder) and player.seed == 17
    assert isinstance(baseline_player(MINIMAX, seed=0), MinimaxPlayer)
    masks = np.zeros((50, 9), dtype=np.uint8)
    masks[:, [2, 5]] = 1
    moves = baseline_player("random", seed=3).act(np.zeros((50, 3, 3, 2), np.int8), masks)  # any mask width
    assert set(moves.tolist()) == {2, 5}


@pytest.mark.parametrize("name, message", [
    ("no_such_module_xyz:make", "--opponent 'no_such_module_xyz:make': module 'no_such_module_xyz' cannot be "
                                "imported: No module named 'no_such_module_xyz'"),
    ("tests.test_aec_baselines:nope", "--opponent 'tests.test_aec_baselines:nope': 'tests.test_aec_baselines' has no "
                                      "attribute 'nope'"),
    ("tests.test_aec_baselines:NOT_CALLABLE", "--opponent 'tests.test_aec_baselines:NOT_CALLABLE' is not callable "
                                              "(its type is int)"),
    ("tests.test_aec_baselines:raises", "--opponent 'tests.test_aec_baselines:raises': calling it as fn(seed=4) "
                                        "raised RuntimeError('no board')"),
    ("tests.test_aec_baselines:no_act", "--opponent 'tests.test_aec_baselines:no_act' returned a int, not a player "
                                        "(an object with act(obs, masks) -> actions)"),
    ("two_ply", "--opponent 'two_ply': unknown baseline 'two_ply'; allowed: random, one_ply, negamax-<depth>"),
])
def test_entry_point_errors_name_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        baseline_player(name, seed=4, where=f"--opponent {name!r}", error=ValueError)
    assert str(err.value).startswith(message)
    with pytest.raises(EnvConfigError):  # the default error type: a usage error
        baseline_player(name, seed=4)


def test_baseline_names_and_the_envs_they_play() -> None:
    assert all(is_baseline_name(n) for n in ("random", "one_ply", "negamax-2", MINIMAX, "a.b:C.make"))
    assert not any(is_baseline_name(n) for n in ("negamax-0", "two_ply", "a b:c", "pkg-x:make", "mod:", ":f", 3))
    assert baseline_env_problem("one_ply", "connect_four") is None
    assert baseline_env_problem("random", "pettingzoo_aec") is None and baseline_env_problem(MINIMAX, "x") is None
    assert baseline_env_problem("negamax-4", "pettingzoo_aec") == (
        "baseline 'negamax-4' plays env.name 'connect_four' only, not 'pettingzoo_aec'; use random or an entry point "
        "module.path:callable returning a player for it")


def test_an_actor_host_plays_an_entry_point_baseline_from_a_pool_assignment() -> None:
    player = opponent_for(f"baseline:{MINIMAX}", build_snapshot=lambda digest: None, seed=0)
    assert isinstance(player, MinimaxPlayer)
    with pytest.raises(ValueError, match="pool assignment names an opponent this host cannot play: baseline "
                                         "'nope_xyz:f': module 'nope_xyz' cannot be imported"):
        opponent_for("baseline:nope_xyz:f", build_snapshot=lambda digest: None, seed=0)


def test_minimax_takes_wins_blocks_and_scores_the_empty_board_a_draw() -> None:
    assert max(s for s in move_scores((0,) * 9) if s is not None) == 0  # perfect play from the start: a draw
    obs = np.zeros((2, 3, 3, 2), dtype=np.int8)
    obs[0, 0, 0:2, 0] = 1  # row 0: own marks at squares 0 and 1 -> win at 2
    obs[0, 2, 0:2, 1] = 1  # the opponent threatens square 8 too
    obs[1, 1, :2, 1] = 1  # the opponent holds squares 3 and 4 -> block at 5
    obs[1, 2, 2, 0] = 1
    masks = (obs.sum(axis=3).reshape(2, 9) == 0).astype(np.uint8)
    assert MinimaxPlayer(seed=0).act(obs, masks).tolist() == [2, 5]


def test_minimax_never_loses_to_random_in_either_seat_and_draws_itself() -> None:
    against_random = play_match(MinimaxPlayer(seed=1), baseline_player("random", seed=2), episodes=400,
                                env_config=TICTACTOE, seed=0)
    assert against_random.games == 400 and against_random.a_first == 200
    assert against_random.wins_b == 0 and against_random.wins_a > 300
    seats = against_random.seats_a
    assert (against_random.returns_a[seats == 1] >= 0).all() and (against_random.returns_a[seats == 0] >= 0).all()
    itself = play_match(MinimaxPlayer(seed=3), MinimaxPlayer(seed=4), episodes=200, env_config=TICTACTOE, seed=1)
    assert itself.draws == 200


def test_one_ply_v3_reads_connect_four_v3_as_the_builtin_one_ply() -> None:
    rng = np.random.default_rng(0)
    obs = np.zeros((64, 6, 7, 2), dtype=np.int8)
    for i in range(64):  # random non-overlapping stones, dropped to the bottom of their columns
        heights = rng.integers(0, 4, size=7)
        for c, h in enumerate(heights):
            for r in range(6 - h, 6):
                obs[i, r, c, rng.integers(0, 2)] = 1
    masks = np.ones((64, 7), dtype=np.uint8)
    planes = builtin_planes(obs)
    assert planes.shape == (64, 2, 6, 7) and set(np.unique(planes).tolist()) <= {0, 255}
    ours = OnePlyV3Player(seed=5).act(obs, masks)
    assert ours.tolist() == one_ply_moves(planes, masks, np.random.default_rng(5)).tolist()
    outcome = play_match(OnePlyV3Player(seed=0), baseline_player("random", seed=1), episodes=100,
                         env_config=CONNECT_FOUR_V3, seed=0)
    assert outcome.wins_a >= 80


def test_play_match_with_the_aec_adapter_counts_each_game_once_with_seats_alternating() -> None:
    outcome = play_match(baseline_player("random", seed=0), baseline_player("random", seed=1), episodes=101,
                         env_config=TICTACTOE, seed=7, num_envs=8)
    assert outcome.games == 101 and outcome.a_first == 51 and len(outcome.returns_a) == 101
    assert outcome.wins_a > 25 and outcome.wins_b > 25
    assert set(outcome.lengths_a.tolist()) <= {2, 3, 4, 5}  # a's own moves: 3 to 9 moves a game
    again = play_match(baseline_player("random", seed=0), baseline_player("random", seed=1), episodes=101,
                       env_config=TICTACTOE, seed=7, num_envs=8)
    assert again.returns_a.tolist() == outcome.returns_a.tolist()  # reproducible
