"""env.name native: the worked example (examples/corridor.py) step by step against the StepBuffers contract,
and the messages for entry points that do not build a VecEnv."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import StepBuffers
from envs.registry import env_spec, make_vec_env
from configs.loader import load_config
from examples.corridor import LEFT, RIGHT, STAY, CorridorVec


def corridor(num_envs: int = 1, **kwargs) -> tuple[CorridorVec, StepBuffers]:
    env = CorridorVec(num_envs, max_steps=kwargs.pop("max_steps", 20), **kwargs)
    buffers = StepBuffers.allocate(env.spec, num_envs)
    env.reset(buffers, seed=0)
    return env, buffers


def test_corridor_through_the_registry() -> None:
    cfg = load_config("configs/corridor.yaml").env
    spec = env_spec(cfg)
    assert spec.num_agents == 2 and spec.mask_size == 3 and spec.episode_stats == ("steps_to_goal",)
    env = make_vec_env(cfg, 3)
    assert isinstance(env, CorridorVec) and env.num_envs == 3 and env.length == 8
    env.close()


def test_early_finisher_sits_out_and_gets_its_reward_at_the_reset() -> None:
    env, b = corridor(num_agents=2, length=4)
    env.pos[:] = [2, 0]  # agent 0 is one step from the goal (cell 3), agent 1 at the wall
    b.obs[:] = env._observe()
    b.action_mask[:] = env._masks()
    assert list(b.action_mask[1]) == [0, 1, 1]  # no "left" at the wall
    b.actions[:] = [RIGHT, RIGHT]
    env.step(b)
    # agent 0 arrived: its episode is reported now, but its reward and done wait for the env's reset
    assert list(b.active) == [False, True] and list(b.episode_done) == [True, False]
    assert b.episode_return[0] == pytest.approx(0.99) and b.episode_stats[0, 0] == 1
    assert b.rewards[1] == pytest.approx(-0.01) and not b.terminated.any()
    b.actions[:] = [LEFT, RIGHT]  # agent 0's action is ignored
    env.step(b)
    assert list(b.active) == [False, True] and env.pos[0] == 3
    b.actions[:] = [STAY, RIGHT]
    env.step(b)  # agent 1 arrives: the env is done, both agents active with the first obs of a new episode
    assert list(b.active) == [True, True] and list(b.terminated) == [True, True] and not b.truncated.any()
    assert b.rewards[0] == pytest.approx(0.99)  # held since it arrived: -0.01 + 1
    assert b.rewards[1] == pytest.approx(0.99)  # this step's -0.01 + 1 (its earlier steps were paid on time)
    assert list(b.episode_done) == [False, True] and b.episode_stats[1, 0] == 3
    assert (b.obs.sum(axis=1) == 255).all() and (env.pos < 3).all() and not env.home.any()


def test_time_limit_truncates_walkers_and_keeps_their_final_obs() -> None:
    env, b = corridor(num_agents=2, length=6, max_steps=2)
    env.pos[:] = [4, 0]
    b.actions[:] = [RIGHT, STAY]
    env.step(b)  # agent 0 home
    b.actions[:] = [STAY, STAY]
    env.step(b)  # time limit
    assert list(b.terminated) == [True, False] and list(b.truncated) == [False, True]
    assert b.final_obs[1, 0] == 255 and list(b.episode_done) == [False, True]
    assert b.episode_return[1] == pytest.approx(-0.02) and b.episode_length[1] == 2


def test_reset_is_seeded_and_clears_outputs() -> None:
    env, b = corridor(num_envs=4, num_agents=3)
    first = b.obs.copy()
    b.rewards[:] = 5
    b.active[:] = False
    env.reset(b, seed=0)
    np.testing.assert_array_equal(b.obs, first)
    assert (b.rewards == 0).all() and b.active.all()
    with pytest.raises(ValueError, match="actions must be 0, 1 or 2"):
        b.actions[:] = 3
        env.step(b)


@pytest.mark.parametrize("entry_point, message", [
    ("examples.corridor", "must look like 'module:callable'"),
    ("examples.nowhere:Env", "module 'examples.nowhere' cannot be imported"),
    ("examples.corridor:CorridorVex", "'examples.corridor' has no attribute 'CorridorVex'"),
    ("examples.corridor:LEFT", "is not callable"),
    ("numpy:zeros", "could not be built with num_envs="),
    ("tests.test_native_env:not_a_vec_env", "does not follow the VecEnv contract (envs/base.py): it has no spec"),
    ("tests.test_native_env:wrong_count", "it has num_envs=1, but 3 were asked for"),
    ("tests.test_native_env:raising_factory", "env 'native:tests.test_native_env:raising_factory' raised in make()"),
])
def test_native_entry_point_errors_name_what_is_wrong(entry_point: str, message: str) -> None:
    cfg = load_config("configs/corridor.yaml", [f"env.entry_point={entry_point}", "env.kwargs={}"]).env
    with pytest.raises((ValueError, RuntimeError)) as err:
        make_vec_env(cfg, 3)
    assert message in str(err.value)
    assert f"{entry_point!r}" in str(err.value) or f"native:{entry_point}" in str(err.value)


def test_native_env_without_entry_point() -> None:
    cfg = load_config("configs/corridor.yaml", ["env.entry_point=''"]).env
    with pytest.raises(ValueError, match="env.name 'native' needs env.entry_point, e.g. 'examples.corridor:CorridorVec'"):
        env_spec(cfg)


def not_a_vec_env(num_envs: int, max_steps: int) -> object:
    return object()


def wrong_count(num_envs: int, max_steps: int) -> CorridorVec:
    return CorridorVec(1, max_steps=max_steps)


def raising_factory(num_envs: int, max_steps: int) -> CorridorVec:
    raise KeyError("no such map")
