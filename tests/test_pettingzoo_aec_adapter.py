"""PettingZooAECAdapter on the real PettingZoo tic-tac-toe and connect_four_v3: turns, per-seat reward crediting in
hand-played games, held episode ends, dead steps, time limits, illegal moves and the config errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from configs.env_config import EnvConfig
from envs.adapters.pettingzoo_aec_adapter import PettingZooAECAdapter
from envs.base import StepBuffers
from envs.builtin.connect_four.game import STONE, ConnectFourVec
from envs.errors import EnvConfigError
from envs.registry import env_spec, make_vec_env
from envs.spaces import ActionSpace

TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"
CONNECT_FOUR_V3 = "pettingzoo.classic.connect_four_v3:env"
KNOCKOUT = "tests.fake_aec_envs:Knockout"
IGNORED = 99
"""An inactive slot's action: out of range, so the adapter must not look at it."""


def _adapter(entry_point: str = TICTACTOE, num_envs: int = 1, max_steps: int = 0,
             **kwargs: Any) -> tuple[PettingZooAECAdapter, StepBuffers]:
    env = PettingZooAECAdapter(entry_point, num_envs, max_steps=max_steps, kwargs=kwargs)
    return env, StepBuffers.allocate(env.spec, num_envs)


def _move(env: PettingZooAECAdapter, buf: StepBuffers, action: int) -> dict[str, list]:
    """Env 0's mover plays ``action`` (every other slot an ignored action); what the step wrote."""
    buf.actions[:] = np.where(buf.active, action, IGNORED)
    env.step(buf)
    return {name: getattr(buf, name).tolist() for name in
            ("active", "rewards", "terminated", "truncated", "episode_done", "episode_return", "episode_length")}


def test_spec_of_tictactoe() -> None:
    env, _ = _adapter(num_envs=2)
    assert env.spec.num_agents == 2 and env.spec.obs_shape == (3, 3, 2) and env.spec.obs_dtype == "int8"
    assert env.spec.action == ActionSpace.discrete(9) and env.spec.action_mask and env.spec.image_layout == "hwc"
    assert env.spec.episode_stats == ("first_player_won", "second_player_won", "draw", "moves")
    env.close()


# Hand-played games: squares are marked by the moves, 0 1 2 / 3 4 5 / 6 7 8 in obs[r, c] = square 3 r + c.
GAMES = {
    "first mover wins": ([0, 3, 1, 4, 2], [1, -1], [3, 2], [1, 0, 0, 5]),       # player_1: 0 1 2
    "second mover wins": ([0, 4, 1, 2, 8, 6], [-1, 1], [3, 3], [0, 1, 0, 6]),  # player_2: 2 4 6
    "draw": ([0, 4, 8, 2, 6, 3, 5, 7, 1], [0, 0], [5, 4], [0, 0, 1, 9]),
}


@pytest.mark.parametrize("game", GAMES, ids=list(GAMES))
def test_a_hand_played_game_credits_each_seat_on_its_own_steps(game: str) -> None:
    moves, returns, lengths, stats = GAMES[game]
    env, buf = _adapter()
    env.reset(buf, seed=0)
    assert buf.active.tolist() == [True, False]
    for k, square in enumerate(moves[:-1]):
        got = _move(env, buf, square)
        mover_next = (k + 1) % 2
        assert got["active"] == [mover_next == 0, mover_next == 1], k
        assert got["rewards"] == [0, 0] and not any(got["terminated"] + got["truncated"] + got["episode_done"]), k
        assert buf.obs[mover_next, square // 3, square % 3].tolist() == [0, 1]  # the opponent's mark, from its side
    got = _move(env, buf, moves[-1])  # the game ends: both episodes reported, the new game's first mover at once
    assert got["episode_done"] == [True, True]
    assert got["episode_return"] == returns and got["episode_length"] == lengths
    assert buf.episode_stats.tolist() == [stats, stats]
    assert got["active"] == [True, False] and not buf.obs[0].any()  # player_1 opens the next game on an empty board
    assert got["rewards"] == [returns[0], 0] and got["terminated"] == [True, False]  # player_2's end is held
    assert not any(got["truncated"])
    got = _move(env, buf, 4)  # player_1's first move of the new game: player_2 gets what was held
    assert got["active"] == [False, True] and got["rewards"] == [0, returns[1]]
    assert got["terminated"] == [False, True] and not any(got["episode_done"])
    assert buf.obs[1, 1, 1].tolist() == [0, 1] and buf.obs[1].sum() == 1  # its first observation of the new game
    got = _move(env, buf, 0)  # nothing held any more
    assert got["rewards"] == [0, 0] and not any(got["terminated"]) and got["active"] == [True, False]
    env.close()


def test_envs_play_their_own_games_side_by_side() -> None:
    env, buf = _adapter(num_envs=2)
    env.reset(buf, seed=3)
    assert buf.active.tolist() == [True, False, True, False]
    first, second = GAMES["first mover wins"][0], GAMES["draw"][0]
    for k in range(len(first)):
        buf.actions[:] = IGNORED
        buf.actions[k % 2] = first[k]
        buf.actions[2 + k % 2] = second[k]
        env.step(buf)
    assert buf.episode_done.tolist() == [True, True, False, False]
    assert buf.rewards.tolist() == [1, 0, 0, 0] and buf.active.tolist() == [True, False, False, True]
    env.close()


def test_time_limit_truncates_both_seats_and_delivers_their_final_observations() -> None:
    env, buf = _adapter(max_steps=3)
    env.reset(buf, seed=0)
    _move(env, buf, 0)
    _move(env, buf, 3)
    got = _move(env, buf, 1)  # the third move: cut
    assert got["episode_done"] == [True, True] and got["episode_return"] == [0, 0] and got["episode_length"] == [2, 1]
    assert buf.episode_stats.tolist() == [[0, 0, 0, 3]] * 2
    assert got["active"] == [True, False] and got["truncated"] == [True, False] and not any(got["terminated"])
    own, theirs = buf.final_obs[0, :, :, 0], buf.final_obs[0, :, :, 1]
    assert np.flatnonzero(own).tolist() == [0, 1] and np.flatnonzero(theirs).tolist() == [3]
    got = _move(env, buf, 4)
    assert got["truncated"] == [False, True] and got["rewards"] == [0, 0]
    own, theirs = buf.final_obs[1, :, :, 0], buf.final_obs[1, :, :, 1]
    assert np.flatnonzero(own).tolist() == [3] and np.flatnonzero(theirs).tolist() == [0, 1]
    env.close()


def test_a_time_limit_below_the_agent_count_is_refused() -> None:
    with pytest.raises(EnvConfigError, match=r"env.max_steps for pettingzoo_aec env 'pettingzoo.classic.tictactoe_v3:"
                                             r"env' must be >= 2 \(its agent count\) or <= 0 for no limit, got 1"):
        _adapter(max_steps=1)


def test_an_illegal_move_is_an_error_naming_env_slot_agent_and_action_and_steps_nothing() -> None:
    env, buf = _adapter(num_envs=2)
    env.reset(buf, seed=0)
    buf.actions[:] = [0, IGNORED, 4, IGNORED]
    env.step(buf)
    buf.actions[:] = [IGNORED, 8, IGNORED, 4]
    with pytest.raises(EnvConfigError) as err:
        env.step(buf)
    assert str(err.value) == ("pettingzoo_aec env 'pettingzoo.classic.tictactoe_v3:env': env 1, agent slot 3 "
                              "('player_2' to move): illegal move, action 4 is not allowed by its action mask "
                              "(legal flags: [0, 1, 2, 3, 5, 6, 7, 8])")
    buf.actions[:] = [IGNORED, 9, IGNORED, 1]
    with pytest.raises(EnvConfigError, match=r"\(env 0, agent slot 1, 'player_2' to move\): action 9 is out of range "
                                             r"\[0, 9\)"):
        env.step(buf)
    buf.actions[:] = [IGNORED, 8, IGNORED, 1]  # nothing was stepped: the same seats are still to move
    env.step(buf)
    assert buf.active.tolist() == [True, False, True, False]
    assert np.flatnonzero(buf.obs[2, :, :, 0]).tolist() == [4] and np.flatnonzero(buf.obs[2, :, :, 1]).tolist() == [1]
    env.close()


def test_dead_steps_are_taken_inside_and_every_reward_reaches_its_seat() -> None:
    # agents a, b, c (slots 0, 1, 2): the mover gets 1 + action, the others in the game 0.5; c is knocked out by
    # its own move (reward 10), which needs a dead step; the game ends after 5 live moves
    env, buf = _adapter(KNOCKOUT)
    assert env.spec.episode_stats == ("moves",)
    env.reset(buf, seed=0)
    assert buf.active.tolist() == [True, False, False]
    steps = [  # (action of the mover, active after, rewards after)
        (0, [False, True, False], [0, 0.5, 0]),
        (1, [False, False, True], [0, 0, 1.0]),
        (0, [True, False, False], [2.0, 0, 0]),       # c is out: its dead step taken; a gets 1 + 0.5 + 0.5
        (0, [False, True, False], [0, 3.0, 0]),       # b: its own 2, then 0.5 twice
    ]
    for action, active, rewards in steps:
        got = _move(env, buf, action)
        assert (got["active"], got["rewards"]) == (active, rewards)
        assert not any(got["episode_done"] + got["terminated"])
    assert env._envs[0].dead_steps == 1
    got = _move(env, buf, 0)  # the fifth move ends the game for all three
    assert got["episode_done"] == [True] * 3 and got["episode_return"] == [3.5, 4.5, 11.0]
    assert got["episode_length"] == [2, 2, 1] and buf.episode_stats.tolist() == [[5]] * 3
    assert got["active"] == [True, False, False] and got["rewards"] == [1.5, 0, 0]
    assert got["terminated"] == [True, False, False]
    later = [  # the new game: b and c get their held ends on their first moves; what came before a first move waits
        (1, [False, True, False], [0, 1.0, 0], [False, True, False]),
        (0, [False, False, True], [0, 0, 10.0], [False, False, True]),
        (0, [True, False, False], [3.0, 0, 0], [False] * 3),
        (0, [False, True, False], [0, 2.5, 0], [False] * 3),
    ]
    for action, active, rewards, terminated in later:
        got = _move(env, buf, action)
        assert (got["active"], got["rewards"], got["terminated"]) == (active, rewards, terminated)
    assert env._envs[0].dead_steps == 2
    assert [agent for agent, _ in env._envs[0].received] == ["a", "b", "c", "a", "b", "a", "b", "c", "a"]
    env.close()


def test_connect_four_v3_plays_move_for_move_as_the_builtin_env() -> None:
    """The same random legal moves in PettingZoo's connect_four_v3 (through the adapter) and the built-in env give the
    same turns, rewards, episode ends, statistics, masks and observations (channels last, 1 for a stone)."""
    n = 3
    env, buf = _adapter(CONNECT_FOUR_V3, num_envs=n)
    builtin = ConnectFourVec(n)
    ref = StepBuffers.allocate(builtin.spec, n)
    env.reset(buf, seed=0)
    builtin.reset(ref, seed=0)
    rng = np.random.default_rng(0)
    games = 0
    for _ in range(400):
        active = ref.active.copy()
        assert buf.active.tolist() == active.tolist()
        assert buf.action_mask[active].tolist() == ref.action_mask[active].tolist()
        assert (np.moveaxis(buf.obs[active], -1, 1).astype(np.int64) * STONE).tolist() == ref.obs[active].tolist()
        legal = ref.action_mask != 0
        actions = np.where(legal, rng.random(legal.shape), -1).argmax(axis=1)
        buf.actions[:] = np.where(active, actions, IGNORED)
        ref.actions[:] = actions
        env.step(buf)
        builtin.step(ref)
        for name in ("rewards", "terminated", "truncated", "episode_done", "episode_return", "episode_length",
                     "episode_stats"):
            assert getattr(buf, name).tolist() == getattr(ref, name).tolist(), name
        games += int(ref.episode_done.sum()) // 2
    assert games >= 10
    env.close()


def test_through_the_registry_with_the_agent_count_checked() -> None:
    cfg = EnvConfig(name="pettingzoo_aec", entry_point=TICTACTOE, num_agents=2, max_steps=0)
    assert env_spec(cfg).num_agents == 2
    env = make_vec_env(cfg, 2)
    assert env.num_envs == 2
    env.close()
    with pytest.raises(EnvConfigError, match=r"env.num_agents=1 but env 'pettingzoo_aec:pettingzoo.classic."
                                             r"tictactoe_v3:env' has 2 agents per environment"):
        env_spec(EnvConfig(name="pettingzoo_aec", entry_point=TICTACTOE, num_agents=1))
    with pytest.raises(EnvConfigError, match="env.name 'pettingzoo_aec' needs env.entry_point, e.g. "
                                             "'pettingzoo.classic.tictactoe_v3:env'"):
        env_spec(EnvConfig(name="pettingzoo_aec", num_agents=2))


def test_a_parallel_env_is_refused_with_the_adapter_to_use() -> None:
    with pytest.raises(EnvConfigError, match=r"pettingzoo_aec env 'mpe2.simple_spread_v3:parallel_env': the entry "
                                             r"point returned a .*, not a pettingzoo AECEnv \(it is a ParallelEnv: "
                                             r"use env.name: pettingzoo for it\)"):
        _adapter("mpe2.simple_spread_v3:parallel_env")
