"""env.name connect_four: rules against PettingZoo's connect_four_v3, the turn / held-reward semantics step by
step as the actor host records them, the two baselines, and the error for an illegal move."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3

from envs.base import StepBuffers
from envs.builtin.connect_four.game import EPISODE_STATS, STONE, ConnectFourVec
from envs.builtin.connect_four.baselines import one_ply_moves, random_legal_moves
from envs.registry import env_spec, make_vec_env
from configs.env_config import EnvConfig

VERTICAL_P0 = [0, 1, 0, 1, 0, 1, 0]                    # P0 wins up column 0 on move 7
HORIZONTAL_P1 = [6, 1, 6, 2, 5, 3, 5, 4]               # P1 wins along the bottom row on move 8
DIAGONAL_UP_P0 = [0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3]     # P0 wins on the "/" diagonal on move 11
DIAGONAL_DOWN_P1 = [1] + [6 - c for c in DIAGONAL_UP_P0]  # mirrored, shifted by one move: P1 wins on "\"
DRAW = [4, 2, 3, 5, 3, 4, 4, 6, 5, 3, 3, 3, 1, 3, 0, 5, 0, 5, 4, 6, 6, 2, 1, 6, 1, 4, 6, 1, 0, 0, 4, 6, 5, 2, 1,
        5, 2, 2, 0, 2, 0, 1]                         # 42 moves, nobody connects four


def make(num_envs: int = 1, max_steps: int = 0) -> tuple[ConnectFourVec, StepBuffers]:
    env = ConnectFourVec(num_envs, max_steps=max_steps)
    buffers = StepBuffers.allocate(env.spec, num_envs)
    env.reset(buffers, seed=0)
    return env, buffers


def move(env: ConnectFourVec, b: StepBuffers, column: int) -> None:
    """Env 0's mover plays ``column``; the inactive slot gets garbage, which must be ignored."""
    mover = env.to_move(0)
    b.actions[:] = 99
    b.actions[mover] = column
    env.step(b)


def record(env: ConnectFourVec, b: StepBuffers, columns: list[int]) -> dict[int, list[dict]]:
    """Play ``columns`` in env 0 and keep what the host records: per slot, its ACTIVE steps only."""
    steps: dict[int, list[dict]] = {0: [], 1: []}

    def keep() -> None:
        assert b.active.sum() == 1  # exactly one player to move
        s = int(np.flatnonzero(b.active)[0])
        steps[s].append({"obs": b.obs[s].copy(), "reward": float(b.rewards[s]), "terminated": bool(b.terminated[s]),
                         "truncated": bool(b.truncated[s]), "final_obs": b.final_obs[s].copy()})

    keep()
    for column in columns:
        move(env, b, column)
        keep()
    return steps


def stones(obs: np.ndarray) -> tuple[int, int]:
    return int((obs[0] == STONE).sum()), int((obs[1] == STONE).sum())


@pytest.mark.parametrize("columns, winner", [(VERTICAL_P0, 0), (HORIZONTAL_P1, 1), (DIAGONAL_UP_P0, 0),
                                             (DIAGONAL_DOWN_P1, 1), (DRAW, None)])
def test_terminal_rewards_land_on_each_players_last_transition(columns: list[int], winner: int | None) -> None:
    env, b = make()
    n = len(columns)
    for i, column in enumerate(columns[:-1]):
        move(env, b, column)
        assert not b.episode_done.any() and not b.rewards.any() and env.to_move(0) == (i + 1) % 2
    move(env, b, columns[-1])  # the game-ending move: both episodes are reported now
    expected = {p: 0.0 if winner is None else (1.0 if p == winner else -1.0) for p in (0, 1)}
    assert list(b.episode_done) == [True, True]
    assert list(b.episode_return) == [expected[0], expected[1]]
    assert list(b.episode_length) == [(n + 1) // 2, n // 2]  # each player's own moves
    stats = [float(winner == 0), float(winner == 1), float(winner is None), float(n)]
    np.testing.assert_array_equal(b.episode_stats, [stats, stats])
    assert list(b.active) == [True, False] and env.to_move(0) == 0 and not env.board(0).any()
    assert b.rewards[0] == expected[0] and b.terminated[0] and not b.truncated.any()
    assert b.rewards[1] == 0 and not b.terminated[1]  # P1's end is held: it does not move now
    assert (b.obs == 0).all() and (b.action_mask == 1).all()

    env, b = make()
    steps = record(env, b, columns + [3])  # one more move: P0 opens the next game, P1 gets its held end
    for p in (0, 1):
        own = steps[p]
        assert len(own) == (n + 1 - p) // 2 + 1  # its moves in the game + its first step of the next game
        for k, step in enumerate(own[:-1]):  # each decision point sees its own k stones, the opponent's k + p
            assert stones(step["obs"]) == (k, k + p)
            assert step["reward"] == 0 and not step["terminated"]
        last = own[-1]
        assert last["reward"] == expected[p] and last["terminated"] and not last["truncated"]
        assert stones(last["obs"]) == (0, p)  # the first obs of its next episode
    assert steps[1][-1]["obs"][1, 5, 3] == STONE  # P1's new episode starts after P0's first stone


def test_truncation_delivers_final_obs_now_for_the_first_player_and_held_for_the_second() -> None:
    env, b = make(max_steps=4)
    steps = record(env, b, [0, 1, 2, 3, 4])
    assert [len(steps[0]), len(steps[1])] == [3, 3]
    for p, (own, opp) in ((0, (2, 2)), (1, (2, 2))):
        last = steps[p][-1]
        assert last["truncated"] and not last["terminated"] and last["reward"] == 0
        assert stones(last["final_obs"]) == (own, opp)
        assert last["final_obs"][0, 5, p] == STONE and last["final_obs"][1, 5, 1 - p] == STONE
    assert stones(steps[0][-1]["obs"]) == (0, 0) and stones(steps[1][-1]["obs"]) == (0, 1)
    assert not any(s["truncated"] for p in (0, 1) for s in steps[p][:-1])
    assert ConnectFourVec(1, max_steps=42).max_steps == 0 and ConnectFourVec(1, max_steps=-1).max_steps == 0
    with pytest.raises(ValueError, match="must be >= 2"):
        ConnectFourVec(1, max_steps=1)


def test_rules_match_pettingzoo_on_random_games() -> None:
    n = 300
    env, b = make(n)
    zoo = [connect_four_v3.env() for _ in range(n)]
    for game in zoo:
        game.reset()
    live = np.ones(n, dtype=bool)
    rng = np.random.default_rng(7)
    outcomes = np.zeros(3)
    while live.any():
        movers = np.array([env.to_move(e) for e in range(n)])
        slots = 2 * np.arange(n) + movers
        assert b.active[slots].all() and not b.active[slots ^ 1].any()
        for e in np.flatnonzero(live):
            game, s = zoo[e], slots[e]
            assert game.agent_selection == f"player_{movers[e]}"
            seen = game.observe(game.agent_selection)
            np.testing.assert_array_equal(b.action_mask[s], seen["action_mask"])
            np.testing.assert_array_equal(b.obs[s], seen["observation"].transpose(2, 0, 1).astype(np.uint8) * STONE)
            board = np.array(game.unwrapped.board).reshape(6, 7)
            np.testing.assert_array_equal(env.board(e), board)
        b.actions[:] = random_legal_moves(b.action_mask, rng)
        env.step(b)
        for e in np.flatnonzero(live):
            zoo[e].step(int(b.actions[slots[e]]))
            ended = zoo[e].terminations["player_0"]
            assert ended == zoo[e].terminations["player_1"]
            assert list(b.episode_done[2 * e:2 * e + 2]) == [ended, ended]
            if ended:
                live[e] = False
                rewards = [zoo[e].rewards["player_0"], zoo[e].rewards["player_1"]]
                assert list(b.episode_return[2 * e:2 * e + 2]) == rewards
                assert b.rewards[2 * e] == rewards[0]  # P0 gets its end now, P1's is held
                stats = b.episode_stats[2 * e]
                assert stats[3] == sum(1 for x in zoo[e].unwrapped.board if x)
                assert list(stats[:3]) == [rewards[0] == 1, rewards[1] == 1, rewards[0] == 0]
                outcomes += stats[:3]
    assert outcomes.sum() == n and outcomes.min() > 0  # wins for both sides and at least one draw seen


def test_one_ply_wins_then_blocks_then_plays_legal() -> None:
    obs = np.zeros((3, 2, 6, 7), dtype=np.uint8)
    obs[0, 0, 3:6, 4] = STONE  # own three up column 4: win at (2, 4) ...
    obs[0, 1, 5, 0:3] = STONE  # ... beats blocking the opponent's bottom row at (5, 3)
    obs[1, 0, 5, 6] = STONE
    obs[1, 1, 5, 0:3] = STONE  # must block at column 3
    obs[2, 1, 4, 1:4] = STONE  # opponent threatens (4, 0) and (4, 4) but both cells hang over empty ones
    obs[2, 0, 5, 0:4] = 0
    masks = np.ones((3, 7), dtype=np.uint8)
    masks[2] = [0, 1, 0, 0, 0, 1, 0]
    seen = set()
    for seed in range(40):
        moves = one_ply_moves(obs, masks, np.random.default_rng(seed))
        assert moves.dtype == np.int32 and moves[0] == 4 and moves[1] == 3 and moves[2] in (1, 5)
        seen.add(int(moves[2]))
    assert seen == {1, 5}
    env, b = make()  # a diagonal threat on a real board, one move before DIAGONAL_UP_P0 ends
    for column in DIAGONAL_UP_P0[:-1]:
        move(env, b, column)
    assert one_ply_moves(b.obs[0:1], b.action_mask[0:1], np.random.default_rng(0))[0] == 3  # win
    # in P1's seat it would rather complete its own bottom row (5, 1..4) than block the diagonal at column 3
    assert one_ply_moves(b.obs[1:2], b.action_mask[1:2], np.random.default_rng(0))[0] == 4


def test_random_baseline_is_legal_and_uniform() -> None:
    masks = np.zeros((8000, 7), dtype=np.uint8)
    masks[:, [0, 2, 3, 6]] = 1
    moves = random_legal_moves(masks, np.random.default_rng(1))
    assert moves.dtype == np.int32
    counts = np.bincount(moves, minlength=7)
    assert counts[[1, 4, 5]].sum() == 0
    assert np.abs(counts[[0, 2, 3, 6]] - 2000).max() < 150  # about 5 standard deviations
    assert set(random_legal_moves(np.zeros((200, 7)), np.random.default_rng(2))) == set(range(7))


def test_one_ply_beats_random_through_the_env() -> None:
    n = 200
    env, b = make(n)
    rng = np.random.default_rng(3)
    one_ply_slot = 2 * np.arange(n) + np.arange(n) % 2  # one-ply moves first in even envs, second in odd
    is_one_ply = np.zeros(2 * n, dtype=bool)
    is_one_ply[one_ply_slot] = True
    wins = games = 0
    while games < 400:
        b.actions[:] = np.where(is_one_ply, one_ply_moves(b.obs, b.action_mask, rng),
                                random_legal_moves(b.action_mask, rng))
        env.step(b)
        done = b.episode_done[one_ply_slot]
        games += int(done.sum())
        wins += int((b.episode_return[one_ply_slot][done] == 1).sum())
    assert wins / games >= 0.8, f"one-ply won {wins} of {games} games against random"


def test_illegal_moves_name_env_slot_and_column() -> None:
    env, b = make(2)
    b.actions[:] = [0, 99, 1, 99]  # the inactive slots' garbage is ignored
    for _ in range(6):
        env.step(b)
        b.actions[:] = [0, 0, 1, 1]
    assert list(env.board(0)[:, 0]) == [2, 1, 2, 1, 2, 1]
    before = env.board(1)
    b.actions[:] = [0, 5, 7, 5]
    with pytest.raises(ValueError, match=r"env 0, agent slot 0 \(player 1 to move\): illegal move, column 0 is full"):
        env.step(b)
    b.actions[:] = [1, 5, 7, 5]
    with pytest.raises(ValueError, match=r"env 1, agent slot 2 .*column 7 is out of range \[0, 7\)"):
        env.step(b)
    np.testing.assert_array_equal(env.board(1), before)  # nothing was stepped
    assert env.board(0)[:, 1].sum() == 0
    with pytest.raises(RuntimeError, match="before reset"):
        ConnectFourVec(1).step(b)


def test_reset_and_registry() -> None:
    env, b = make(3)
    for column in VERTICAL_P0:
        b.actions[:] = column
        env.step(b)
    env.reset(b, seed=1)  # also drops the held end of P1's finished game
    assert list(b.active) == [True, False] * 3 and (b.obs == 0).all() and (b.action_mask == 1).all()
    b.actions[:] = 3
    env.step(b)
    assert not b.rewards.any() and not b.terminated.any() and list(b.active) == [False, True] * 3
    cfg = EnvConfig(name="connect_four", num_agents=2)
    spec = env_spec(cfg)
    assert spec == ConnectFourVec.SPEC and spec.obs_shape == (2, 6, 7) and spec.mask_size == 7
    assert spec.episode_stats == EPISODE_STATS
    built = make_vec_env(cfg, 4)
    assert isinstance(built, ConnectFourVec) and built.num_envs == 4 and built.max_steps == 0
    with pytest.raises(ValueError, match="has 2 agents per environment"):
        env_spec(EnvConfig(name="connect_four"))
    with pytest.raises(ValueError, match="must be >= 2"):
        env_spec(EnvConfig(name="connect_four", num_agents=2, max_steps=1))
