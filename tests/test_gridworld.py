"""The built-in gridworld against expectations written out here: maps set by hand, step by step."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import StepBuffers
from envs.builtin.gridworld import (CONVERTER, DEPLETED, EMPTY, FORWARD, LEFT, NOOP, RESOURCE, RIGHT, USE,
                                   GridworldVec)
from envs.registry import env_spec, make_vec_env
from configs.env_config import EnvConfig
from configs.loader import load_config
from configs.plan import make_plan
from tests.processes import REPO

NORTH, EAST, SOUTH, WEST = 0, 1, 2, 3
H, W = 11, 11
CY, CX = H // 2, W // 2


def _env(num_envs: int = 1, num_agents: int = 2, *, max_steps: int = 1000, **kwargs) -> tuple[GridworldVec, StepBuffers]:
    env = GridworldVec(num_envs, num_agents=num_agents, obs_height=H, obs_width=W, max_steps=max_steps,
                       kwargs=kwargs)
    buffers = StepBuffers.allocate(env.spec, num_envs)
    env.reset(buffers, seed=3)
    return env, buffers


def _step(env: GridworldVec, buffers: StepBuffers, *actions: int) -> None:
    buffers.actions[:] = actions
    env.step(buffers)


def test_spec_and_obs_through_registry() -> None:
    cfg = EnvConfig(name="gridworld", num_agents=3, obs_width=9, obs_height=7, max_steps=50)
    spec = env_spec(cfg)
    assert spec.num_agents == 3 and spec.obs_shape == (6, 7, 9) and spec.obs_dtype == "uint8"
    assert spec.num_actions == 5
    env = make_vec_env(cfg, 4)
    buffers = StepBuffers.allocate(env.spec, 4)
    buffers.rewards[:] = 9
    env.reset(buffers, seed=0)
    assert buffers.obs.shape == (12, 6, 7, 9) and buffers.obs.dtype == np.uint8
    assert set(np.unique(buffers.obs)) <= {0, 255}  # inventories start at 0
    assert (buffers.obs[:, 0] == 255).any() and (buffers.rewards == 0).all()
    env.close()


def test_walls_and_agents_block_movement() -> None:
    env, buffers = _env(num_agents=2)
    env.set_map(0, ["#...",
                    "0.1.",
                    "...."])
    _step(env, buffers, FORWARD, NOOP)  # wall ahead of agent 0 (north)
    assert env.agent_state(0, 0)[:2] == (1, 0)
    _step(env, buffers, RIGHT, FORWARD)  # agent 1 moves north onto an empty cell
    assert env.agent_state(0, 1)[:2] == (0, 2)
    _step(env, buffers, FORWARD, NOOP)  # agent 0 moves east
    assert env.agent_state(0, 0)[:2] == (1, 1)


def test_set_map_requires_every_agent() -> None:
    env, _ = _env(num_agents=2)
    with pytest.raises(ValueError, match="must place all 2 agents"):
        env.set_map(0, ["0."])


def test_movement_blocked_by_border_agent_and_open_cells() -> None:
    env, buffers = _env(num_agents=2)
    env.set_map(0, ["0...",
                    "....",
                    "1..."], orientations=[NORTH, NORTH])
    _step(env, buffers, FORWARD, NOOP)  # border wall ahead
    assert env.agent_state(0, 0)[:2] == (0, 0)
    _step(env, buffers, NOOP, FORWARD)  # agent 1 moves to (1, 0)
    assert env.agent_state(0, 1)[:2] == (1, 0)
    _step(env, buffers, NOOP, FORWARD)  # agent 0 is ahead: blocked
    assert env.agent_state(0, 1)[:2] == (1, 0)
    _step(env, buffers, RIGHT, NOOP)
    _step(env, buffers, FORWARD, NOOP)  # east onto an empty cell
    assert env.agent_state(0, 0)[:2] == (0, 1)
    env.set_map(0, ["0R..",
                    "C...",
                    "1..."], orientations=[EAST, NORTH])
    _step(env, buffers, FORWARD, FORWARD)  # resources and converters block too
    assert env.agent_state(0, 0)[:2] == (0, 0) and env.agent_state(0, 1)[:2] == (2, 0)


def test_turning_changes_orientation() -> None:
    env, buffers = _env(num_agents=2)
    env.set_map(0, ["0.1"], orientations=[NORTH, SOUTH])
    _step(env, buffers, LEFT, RIGHT)
    assert env.agent_state(0, 0)[2] == WEST and env.agent_state(0, 1)[2] == WEST
    _step(env, buffers, LEFT, RIGHT)
    assert env.agent_state(0, 0)[2] == SOUTH and env.agent_state(0, 1)[2] == NORTH
    for _ in range(2):
        _step(env, buffers, RIGHT, NOOP)
    assert env.agent_state(0, 0)[2] == NORTH
    _step(env, buffers, NOOP, NOOP)
    assert env.agent_state(0, 0)[2] == NORTH and (buffers.rewards == 0).all()


def test_collect_then_convert_gives_one_per_resource() -> None:
    env, buffers = _env(num_agents=1, regrow_steps=2, inventory_cap=5)
    env.set_map(0, ["R0C"], orientations=[WEST])
    _step(env, buffers, USE)
    assert env.agent_state(0, 0)[3] == 1 and env.tile(0, 0, 0) == DEPLETED and buffers.rewards[0] == 0
    _step(env, buffers, USE)  # nothing to collect yet
    assert env.agent_state(0, 0)[3] == 1
    _step(env, buffers, NOOP)  # step 3 = 1 + regrow_steps: back
    assert env.tile(0, 0, 0) == RESOURCE
    _step(env, buffers, USE)
    assert env.agent_state(0, 0)[3] == 2
    _step(env, buffers, RIGHT)
    _step(env, buffers, RIGHT)
    assert buffers.rewards[0] == 0
    _step(env, buffers, USE)  # converter: two resources -> +2
    assert buffers.rewards[0] == 2.0 and env.agent_state(0, 0)[3] == 0
    _step(env, buffers, USE)  # empty inventory -> nothing
    assert buffers.rewards[0] == 0.0


def test_inventory_cap_and_convert_reward() -> None:
    env, buffers = _env(num_agents=1, inventory_cap=1)
    env.set_map(0, ["R0C", ".R."], orientations=[SOUTH])
    _step(env, buffers, USE)
    assert env.agent_state(0, 0)[3] == 1 and env.tile(0, 1, 1) == DEPLETED
    _step(env, buffers, RIGHT)  # west
    _step(env, buffers, USE)  # full: the resource stays
    assert env.agent_state(0, 0)[3] == 1 and env.tile(0, 0, 0) == RESOURCE
    env.set_map(0, ["0C"], orientations=[EAST], inventories=[4])
    _step(env, buffers, USE)
    assert buffers.rewards[0] == 4.0


def test_resource_regrows_after_the_delay_and_shows_in_the_obs() -> None:
    env, buffers = _env(num_agents=1, regrow_steps=3)
    env.set_map(0, ["R", "0"], orientations=[NORTH], buffers=buffers)
    assert buffers.obs[0, 1, CY - 1, CX] == 255
    _step(env, buffers, USE)
    assert buffers.obs[0, 1, CY - 1, CX] == 0 and buffers.obs[0, 5, CY - 1, CX] == 255
    assert buffers.obs[0, 4, CY, CX] == 255 // 5  # own inventory 1 of 5 at the centre
    for t in (2, 3, 4):  # collected on step 1, back after step 1 + regrow_steps = 4 (USE meanwhile: nothing)
        _step(env, buffers, USE)
        assert env.tile(0, 0, 0) == (RESOURCE if t == 4 else DEPLETED), t
        assert env.agent_state(0, 0)[3] == 1
    assert buffers.obs[0, 1, CY - 1, CX] == 255 and buffers.obs[0, 5, CY - 1, CX] == 0
    _step(env, buffers, USE)
    assert env.agent_state(0, 0)[3] == 2


def test_truncation_final_obs_and_auto_reset() -> None:
    env, buffers = _env(num_envs=2, num_agents=3, max_steps=5)
    env.set_map(1, ["0C", "1.", "2."], orientations=[EAST, NORTH, NORTH], inventories=[3, 0, 0])
    for t in range(1, 5):
        _step(env, buffers, *([USE] + [NOOP] * 5 if t > 1 else [NOOP, NOOP, NOOP, USE, NOOP, NOOP]))
        assert not buffers.truncated.any() and not buffers.episode_done.any() and not buffers.terminated.any()
    assert buffers.rewards.sum() == 0  # reward 3 came on step 1 (slot 3 = env 1, agent 0)
    before = buffers.obs.copy()
    state_before = env.agent_state(1, 1)
    _step(env, buffers, *[NOOP] * 6)
    assert buffers.truncated.all() and buffers.episode_done.all() and not buffers.terminated.any()
    assert (buffers.episode_length == 5).all()
    np.testing.assert_array_equal(buffers.episode_return, [0, 0, 0, 3, 0, 0])
    np.testing.assert_array_equal(buffers.final_obs, before)  # noops: the last obs is the one before
    assert not np.array_equal(buffers.obs[3:], before[3:])  # fresh map for env 1
    assert env.agent_state(1, 0)[3] == 0 and env.agent_state(1, 1) != state_before
    for _ in range(4):
        _step(env, buffers, *[NOOP] * 6)
        assert not buffers.truncated.any() and not buffers.episode_done.any()
    _step(env, buffers, *[NOOP] * 6)
    assert buffers.truncated.all() and (buffers.episode_length == 5).all() and (buffers.episode_return == 0).all()


def _episode_ends(env: GridworldVec, buffers: StepBuffers, steps: int) -> list[tuple[int, int, int]]:
    """(step, agent slot, episode_length) of every episode end over ``steps`` steps of random actions."""
    rng = np.random.default_rng(2)
    ends = []
    for t in range(1, steps + 1):
        buffers.actions[:] = rng.integers(0, 5, size=buffers.actions.shape)
        env.step(buffers)
        ends += [(t, int(s), int(buffers.episode_length[s])) for s in np.flatnonzero(buffers.episode_done)]
    return ends


def test_stagger_start_spreads_the_first_episode_ends_then_runs_whole_episodes() -> None:
    max_steps, num_envs, agents = 50, 40, 2
    env, buffers = _env(num_envs=num_envs, num_agents=agents, max_steps=max_steps, stagger_start=1)
    plain, plain_buffers = _env(num_envs=num_envs, num_agents=agents, max_steps=max_steps)
    np.testing.assert_array_equal(buffers.obs, plain_buffers.obs)  # the same maps: only the clocks differ
    ends = _episode_ends(env, buffers, 3 * max_steps)
    first = {}
    for t, slot, length in ends:
        first.setdefault(slot, (t, length))
    assert sorted(first) == list(range(num_envs * agents))  # every agent's first episode ended by max_steps
    for slot, (t, length) in first.items():
        assert 1 <= t <= max_steps and length == t  # the first episode is cut short, and says how short
        assert first[slot - slot % agents] == (t, length)  # the agents of one env end together
    first_ends = {t for t, _ in first.values()}
    assert len(first_ends) >= 20  # spread over the window, not all at once
    later = [(t, slot, length) for t, slot, length in ends if t > first[slot][0]]
    assert later and all(length == max_steps and (t - first[slot][0]) % max_steps == 0 for t, slot, length in later)
    assert {t for t, _, _ in _episode_ends(plain, plain_buffers, 3 * max_steps)} == {50, 100, 150}


def test_reproducible_from_the_seed() -> None:
    def run(seed: int) -> list[np.ndarray]:
        env = GridworldVec(3, num_agents=4, max_steps=7)
        buffers = StepBuffers.allocate(env.spec, 3)
        env.reset(buffers, seed=seed)
        rng = np.random.default_rng(1)
        out = [buffers.obs.copy()]
        for _ in range(20):  # two auto-resets
            buffers.actions[:] = rng.integers(0, 5, size=12)
            env.step(buffers)
            out += [buffers.obs.copy(), buffers.rewards.copy(), buffers.final_obs.copy()]
        return out

    a, b, c = run(5), run(5), run(6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_window_is_centred_on_each_agent_and_rotates() -> None:
    env, buffers = _env(num_agents=2)
    env.set_map(0, ["#....",
                    ".0.1.",
                    ".....",
                    "..C.."], orientations=[NORTH, NORTH], inventories=[5, 2], buffers=buffers)
    obs0, obs1 = buffers.obs[0], buffers.obs[1]
    assert obs0[4, CY, CX] == 255 and obs1[4, CY, CX] == 255 * 2 // 5  # own inventory at the centre
    assert obs0[3, CY, CX] == 0 and obs1[3, CY, CX] == 0  # not "another agent" on itself
    assert obs0[3, CY, CX + 2] == 255 and obs0[4, CY, CX + 2] == 255 * 2 // 5  # agent 1 two to the right
    assert obs1[3, CY, CX - 2] == 255 and obs1[3].sum() == 255
    assert obs0[0, CY - 1, CX - 1] == 255 and obs0[0, CY - 1, CX] == 0  # interior wall up-left
    assert obs0[0, CY - 2, CX] == 255  # border wall two rows up
    assert obs0[2, CY + 2, CX + 1] == 255 and obs1[2, CY + 2, CX - 1] == 255  # converter
    # Facing east, agent 1 (two cells east) is straight ahead; the converter is to the right, behind.
    env.set_map(0, ["#....",
                    ".0.1.",
                    ".....",
                    "..C.."], orientations=[EAST, NORTH], buffers=buffers)
    assert buffers.obs[0, 3, CY - 2, CX] == 255 and buffers.obs[0, 2, CY - 1, CX + 2] == 255
    # Facing south the map is upside down: the converter (two rows down, one column east) is ahead two,
    # one to the left.
    env.set_map(0, ["#....",
                    ".0.1.",
                    ".....",
                    "..C.."], orientations=[SOUTH, WEST], buffers=buffers)
    assert buffers.obs[0, 2, CY - 2, CX - 1] == 255 and buffers.obs[0, 3, CY, CX - 2] == 255
    assert buffers.obs[1, 3, CY - 2, CX] == 255  # agent 1 faces west: agent 0 ahead


def test_bad_action_raises() -> None:
    env, buffers = _env(num_agents=2)
    buffers.actions[:] = [0, 5]
    with pytest.raises(ValueError, match="action 5 for agent slot 1 is out of range"):
        env.step(buffers)


def test_kwargs_errors() -> None:
    with pytest.raises(ValueError) as err:
        env_spec(EnvConfig(name="gridworld", num_agents=3, kwargs={"map_sise": 20, "speed": 1}))
    assert str(err.value) == (
        "env.kwargs for env 'gridworld' has unknown keys ['map_sise', 'speed']; allowed keys: 'map_size', "
        "'num_walls', 'num_resources', 'num_converters', 'regrow_steps', 'inventory_cap', 'stagger_start'")
    with pytest.raises(ValueError, match=r"env.kwargs.stagger_start for env 'gridworld' must be 0 or 1, got 2"):
        env_spec(EnvConfig(name="gridworld", num_agents=3, kwargs={"stagger_start": 2}))
    with pytest.raises(ValueError, match=r"env.kwargs.map_size for env 'gridworld' must be an integer, got 2.5"):
        make_vec_env(EnvConfig(name="gridworld", num_agents=3, kwargs={"map_size": 2.5}), 1)
    with pytest.raises(ValueError, match=r"env.kwargs.regrow_steps for env 'gridworld' must be >= 1, got 0"):
        env_spec(EnvConfig(name="gridworld", num_agents=3, kwargs={"regrow_steps": 0}))
    with pytest.raises(ValueError, match="gridworld map too full"):
        env_spec(EnvConfig(name="gridworld", num_agents=24, kwargs={"map_size": 5}))
    spec = env_spec(EnvConfig(name="gridworld", num_agents=2, kwargs={"map_size": 8, "num_resources": 3}))
    assert spec.num_agents == 2


def test_map_settings_defaults() -> None:
    assert GridworldVec(1, num_agents=3).side == 15 and GridworldVec(1, num_agents=24).side == 24
    env, buffers = _env(num_agents=3, map_size=10, num_walls=0, num_resources=7, num_converters=2)
    tiles = [env.tile(0, y, x) for y in range(10) for x in range(10)]
    assert tiles.count(RESOURCE) == 7 and tiles.count(CONVERTER) == 2 and tiles.count(EMPTY) == 91


@pytest.mark.parametrize("name, agents", [("grid_3agents", 3), ("grid_24agents", 24)])
def test_configs_fit_the_plan(name: str, agents: int) -> None:
    config = load_config(REPO / "configs" / f"{name}.yaml")
    spec = env_spec(config.env)
    assert spec.num_agents == agents and spec.obs_shape == (6, 11, 11) and config.env.max_steps == 1000
    plan = make_plan(config.trainer, num_agents=agents)  # raises PlanError if the arithmetic does not fit
    assert plan.segments >= plan.total_agents and config.trainer.bptt_horizon == 64


def test_named_episode_stats_count_collected_and_converted_items() -> None:
    env, buffers = _env(num_agents=2, max_steps=6, regrow_steps=50)
    assert env.spec.episode_stats == ("items_collected", "items_converted")
    env.set_map(0, ["R0R.",
                    ".C..",
                    "..1."], orientations=[EAST, NORTH])
    _step(env, buffers, USE, NOOP)  # agent 0 collects the resource to its east
    _step(env, buffers, LEFT, NOOP)
    _step(env, buffers, LEFT, NOOP)  # facing west
    _step(env, buffers, USE, NOOP)  # collects the resource to its west
    _step(env, buffers, LEFT, NOOP)  # facing south, onto the converter
    assert not buffers.episode_done.any()
    _step(env, buffers, USE, NOOP)  # converts both items; the episode ends on this step
    assert buffers.episode_done.all() and list(buffers.episode_return) == [2.0, 0.0]
    assert buffers.episode_stats.tolist() == [[2.0, 2.0], [0.0, 0.0]]


def test_items_converted_equals_the_return_and_stats_reset_between_episodes() -> None:
    cap = 2
    env, buffers = _env(num_envs=3, num_agents=3, max_steps=40, map_size=5, num_walls=0, num_resources=8,
                        num_converters=2, regrow_steps=3, inventory_cap=cap)
    rng = np.random.default_rng(7)
    returns = np.zeros(9)
    collected = np.zeros(9)
    episodes, stat_sums = 0, np.zeros(2)
    for _ in range(200):  # five episodes per env
        actions = rng.choice([FORWARD, LEFT, RIGHT, USE, USE, USE], size=9)
        before = np.array([env.agent_state(s // 3, s % 3)[3] for s in range(9)])
        _step(env, buffers, *actions)
        after = np.array([env.agent_state(s // 3, s % 3)[3] for s in range(9)])
        done = buffers.episode_done.copy()
        # An ended episode's last inventory is in its final observation (channel 4 at the centre).
        after[done] = np.rint(buffers.final_obs[done, 4, CY, CX].astype(np.float64) * cap / 255.0)
        collected += (actions == USE) & (after == before + 1)
        returns += buffers.rewards
        if done.any():
            episodes += int(done.sum())
            stats = buffers.episode_stats[done]
            assert np.array_equal(stats[:, 1], buffers.episode_return[done])
            assert np.array_equal(stats[:, 1], returns[done])
            assert np.array_equal(stats[:, 0], collected[done])
            assert np.array_equal(stats[:, 0] - stats[:, 1], after[done])  # still carried at the end
            stat_sums += stats.sum(axis=0)
            returns[done] = 0.0
            collected[done] = 0.0
    assert episodes == 45 and stat_sums[1] > 0
