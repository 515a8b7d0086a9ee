"""PettingZooParallelAdapter: agent slots, early finishes held on inactive slots, masks, time limits, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envs.base import StepBuffers
from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
from envs.registry import env_spec, make_vec_env
from envs.spaces import ActionSpace
from configs.env_config import EnvConfig
from tests.fake_envs import mask_at

STAGGERED = "tests.fake_envs:StaggeredParallelEnv"
SPREAD = "mpe2.simple_spread_v3:parallel_env"


def _adapter(num_envs: int, entry_point: str = STAGGERED, max_steps: int = 0,
             **kwargs: Any) -> tuple[PettingZooParallelAdapter, StepBuffers]:
    env = PettingZooParallelAdapter(entry_point, num_envs, max_steps=max_steps, kwargs=kwargs)
    return env, StepBuffers.allocate(env.spec, num_envs)


def _step(env: PettingZooParallelAdapter, buf: StepBuffers, actions: Any) -> dict[str, list]:
    buf.actions[:] = actions
    env.step(buf)
    return {name: getattr(buf, name).tolist() for name in
            ("obs", "rewards", "terminated", "truncated", "active", "episode_done")}


def test_agents_finishing_early_sit_out_and_get_their_reward_with_the_next_episode() -> None:
    # agents a, b, c (slots 3e + 0/1/2): a terminates at t=1, b is truncated at t=2, c terminates at t=3;
    # obs [episode, t, j, seed]; reward 100 j + 10 t + env action; Discrete(3, start=-1)
    env, buf = _adapter(2)
    assert env.spec.num_agents == 3 and env.spec.obs_shape == (4,) and env.spec.action == ActionSpace.discrete(3)
    env.reset(buf, seed=5)
    assert buf.obs.tolist() == [[0, 0, j, 5 + e] for e in range(2) for j in range(3)]  # env e seeded 5 + e
    got = _step(env, buf, 2)  # env action 1 for everyone
    assert got["rewards"] == [0, 111, 211] * 2 and got["active"] == [False, True, True] * 2
    assert got["episode_done"] == [True, False, False] * 2 and not any(got["terminated"])
    assert buf.episode_return[[0, 3]].tolist() == [11, 11] and buf.episode_length[[0, 3]].tolist() == [1, 1]
    got = _step(env, buf, [99, 0, 1] * 2)  # slot a: inactive, its (invalid) action is neither checked nor passed
    assert got["rewards"] == [0, 0, 220] * 2 and got["active"] == [False, False, True] * 2
    assert got["episode_done"] == [False, True, False] * 2 and not any(got["truncated"])
    assert buf.episode_return[[1, 4]].tolist() == [230, 230] and buf.episode_length[[1, 4]].tolist() == [2, 2]
    got = _step(env, buf, [99, 99, 2] * 2)  # c terminates, the env is empty: it resets and delivers what was held
    assert got["obs"] == [[1, 0, j, 5 + e] for e in range(2) for j in range(3)]
    assert got["active"] == [True] * 6 and got["rewards"] == [11, 119, 231] * 2
    assert got["terminated"] == [True, False, True] * 2 and got["truncated"] == [False, True, False] * 2
    assert buf.final_obs[1].tolist() == [0, 2, 1, 5] and buf.final_obs[4].tolist() == [0, 2, 1, 6]
    assert got["episode_done"] == [False, False, True] * 2
    assert buf.episode_return[[2, 5]].tolist() == [211 + 220 + 231] * 2 and buf.episode_length[2] == 3
    assert env._envs[0].received == [{"a": 1, "b": 1, "c": 1}, {"b": -1, "c": 0}, {"c": 1}]
    got = _step(env, buf, 1)  # a fresh episode: plain rewards, nothing held any more
    assert got["rewards"] == [0, 110, 210] * 2 and got["active"] == [False, True, True] * 2
    env.close()


def test_adapter_time_limit_truncates_every_agent_of_the_env() -> None:
    env, buf = _adapter(1, max_steps=2)
    env.reset(buf, seed=0)
    _step(env, buf, 1)
    got = _step(env, buf, 1)  # b truncated by the env, c by the adapter: reset now
    assert got["active"] == [True] * 3 and got["obs"] == [[1, 0, j, 0] for j in range(3)]
    assert got["rewards"] == [10, 120, 220]
    assert got["terminated"] == [True, False, False] and got["truncated"] == [False, True, True]
    assert buf.final_obs[1:].tolist() == [[0, 2, 1, 0], [0, 2, 2, 0]] and got["episode_done"] == [False, True, True]
    assert buf.episode_length[1:].tolist() == [2, 2] and buf.episode_return[2].tolist() == 430


@pytest.mark.parametrize(
    ("kind", "actions", "received"),
    [
        ("multi_discrete", [[0, 0], [2, 1], [1, 0]], [[1, -1], [3, 0], [2, -1]]),
        ("box", [[-7.0, 0.5], [0.25, 9.0], [1.0, 1.0]], [[-1.0, 0.5], [0.25, 2.0], [1.0, 1.0]]),
    ],
)
def test_actions_converted(kind: str, actions: list, received: list) -> None:
    env, buf = _adapter(1, kind=kind)
    assert env.spec.action.kind == kind
    env.reset(buf, seed=0)
    buf.actions[:] = np.asarray(actions, dtype=buf.actions.dtype)
    env.step(buf)
    got = env._envs[0].received[-1]
    for j, agent in enumerate("abc"):
        np.testing.assert_array_equal(got[agent], received[j])
    np.testing.assert_allclose(buf.rewards[1:], [100 * j + 10 + np.sum(received[j]) for j in (1, 2)])


def test_masks_reach_buffers() -> None:
    env, buf = _adapter(2, kind="masked")
    assert env.spec.action_mask and env.spec.mask_size == 4 and env.spec.obs_shape == (4,)
    env.reset(buf, seed=0)
    for _ in range(7):
        for slot in np.flatnonzero(buf.active):
            t, j = int(buf.obs[slot, 1]), int(buf.obs[slot, 2])
            assert buf.action_mask[slot].tolist() == mask_at(t, j).tolist()
        buf.actions[:] = [np.flatnonzero(m)[0] for m in buf.action_mask]  # legal (the env raises otherwise)
        env.step(buf)


def test_action_out_of_range_names_env_and_agent() -> None:
    env, buf = _adapter(2)
    env.reset(buf, seed=0)
    buf.actions[:] = [0, 0, 0, 0, 3, 0]
    with pytest.raises(ValueError, match=rf"^pettingzoo env '{STAGGERED}' \(env 1, agent 'b'\): action 3 is out "
                                         r"of range \[0, 3\)"):
        env.step(buf)


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match=r"^pettingzoo env 'tests.fake_envs:staggered_aec': the entry point returned "
                                         r"a pettingzoo.utils.wrappers.order_enforcing.OrderEnforcingWrapper, not a "
                                         r"pettingzoo ParallelEnv \(for an AEC env use its module's parallel_env"):
        PettingZooParallelAdapter("tests.fake_envs:staggered_aec", 1, max_steps=0, kwargs={})
    with pytest.raises(RuntimeError, match=r"^pettingzoo env 'tests.fake_envs:raising_factory' \(env 0\) raised in "
                                           r"make\(\): OSError\('licence server unreachable'\)"):
        PettingZooParallelAdapter("tests.fake_envs:raising_factory", 1, max_steps=0, kwargs={})
    with pytest.raises(ValueError, match=r"^pettingzoo env 'tests.fake_envs:UnsupportedParallelEnv': action space "
                                         r"is Box\(.*a Box action space needs a float dtype, not int64; supported"):
        PettingZooParallelAdapter("tests.fake_envs:UnsupportedParallelEnv", 1, max_steps=0,
                                  kwargs={"what": "int_box_action"})
    with pytest.raises(ValueError, match=r"^env.entry_point 'mpe2.simple_spread_v3' \(env 'pettingzoo'\) must look"):
        PettingZooParallelAdapter("mpe2.simple_spread_v3", 1, max_steps=0, kwargs={})


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("raise_reset", RuntimeError, r"\(env 0\) raised in reset\(\): OSError\('simulator crashed in reset'\)"),
        ("raise_step", RuntimeError, r"\(env 0\) raised in step\(\): ZeroDivisionError\('physics blew up'\)"),
        ("bad_obs_reset", ValueError, r"\(env 0, agent 'b'\) reset\(\) returned an observation with shape \(4,\) "
                                      r"dtype <U32; expected shape \(4,\) dtype float32 \(from its "
                                      r"observation_space\('a'\)\)"),
        ("bad_obs_step", ValueError, r"\(env 0, agent 'c'\) step\(\) returned an observation with shape \(2,\) "
                                     r"dtype float32; expected shape \(4,\) dtype float32"),
        ("no_obs_step", ValueError, r"\(env 0, agent 'c'\) step\(\) returned no observation for an agent that acted"),
        ("vanish", ValueError, r"\(env 0, agent 'c'\) step\(\) removed the agent from env.agents without "
                               r"terminating or truncating it"),
        ("rejoin", ValueError, r"\(env 0\) step\(\) returned with agents \['a'\] in env.agents that were not "
                               r"playing before the step; agents joining mid-episode are not supported"),
        ("missing_agent", ValueError, r"\(env 0\) reset\(\) returned no observation for agents \['c'\]; every "
                                      r"agent of possible_agents \['a', 'b', 'c'\] must start each episode"),
    ],
)
def test_env_errors_name_env_agent_and_call(fault: str, error: type, message: str) -> None:
    env, buf = _adapter(1, "tests.fake_envs:FaultyParallelEnv", fault=fault)
    with pytest.raises(error, match=rf"^pettingzoo env 'tests.fake_envs:FaultyParallelEnv' {message}"):
        env.reset(buf, seed=0)
        for _ in range(2):
            env.step(buf)


def test_registry_builds_it() -> None:
    cfg = EnvConfig(name="pettingzoo", entry_point="tests.fake_envs:Factories.staggered", num_agents=3, max_steps=0)
    spec = env_spec(cfg)
    env = make_vec_env(cfg, 2)
    assert isinstance(env, PettingZooParallelAdapter) and env.spec == spec and env.num_envs == 2
    env.close()


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe_simple_spread(continuous: bool) -> None:
    env, buf = _adapter(2, SPREAD, max_cycles=5, continuous_actions=continuous)
    assert env.spec.num_agents == 3 and env.spec.obs_shape == (18,) and env.spec.obs_dtype == "float32"
    expected = ActionSpace.box([0.0] * 5, [1.0] * 5) if continuous else ActionSpace.discrete(5)
    assert env.spec.action == expected and not env.spec.action_mask
    env.reset(buf, seed=0)
    first = buf.obs.copy()
    rng = np.random.default_rng(0)
    for t in range(1, 11):
        if continuous:
            buf.actions[:] = rng.uniform(-0.5, 1.5, size=buf.actions.shape)  # clipped into [0, 1]
        else:
            buf.actions[:] = rng.integers(0, 5, size=buf.actions.shape)
        env.step(buf)
        done = t % 5 == 0  # max_cycles: every agent is truncated together; the env resets at once
        assert buf.active.all() and buf.episode_done.tolist() == [done] * 6
        assert buf.truncated.tolist() == [done] * 6 and not buf.terminated.any()
        assert (buf.rewards < 0).all()  # simple_spread's shared distance penalty
        if done:
            assert (buf.episode_length == 5).all() and (buf.episode_return < 0).all()
            assert not np.array_equal(buf.final_obs, buf.obs)
    assert not np.array_equal(first, buf.obs)
    env.close()
    env, buf = _adapter(1, SPREAD, max_steps=3)  # the adapter's limit before max_cycles (25)
    env.reset(buf, seed=0)
    for t in range(1, 4):
        env.step(buf)
    assert buf.truncated.all() and (buf.episode_length == 3).all()
    env.close()


def test_render_first_needs_an_rgb_frame_and_names_an_env_that_cannot_draw() -> None:
    drawn, _ = _adapter(1, SPREAD, render_mode="rgb_array")
    drawn.reset(StepBuffers.allocate(drawn.spec, 1), seed=0)
    frame = drawn.render_first()
    assert frame.shape == (700, 700, 3) and frame.dtype == np.uint8 and frame.std() > 0
    blind, _ = _adapter(1, SPREAD)  # render_mode None: render() draws nothing
    blind.reset(StepBuffers.allocate(blind.spec, 1), seed=0)
    with pytest.raises(ValueError, match=rf"^pettingzoo env '{SPREAD}' rendered NoneType instead of an RGB frame; it "
                                         r"needs render_mode='rgb_array' \(env.kwargs.render_mode\)$"):
        blind.render_first()
    unable, _ = _adapter(1)
    with pytest.raises(RuntimeError, match=rf"^pettingzoo env '{STAGGERED}' \(env 0\) raised in render\(\): "
                                           r"NotImplementedError\(\)$"):
        unable.render_first()
