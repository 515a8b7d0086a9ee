"""The built-in simple_spread against mpe2's simple_spread_v3 (continuous actions), step by step, plus the VecEnv
contract: auto-reset, episode returns, the global state's layout, seeding, errors and the registry."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpe2 import simple_spread_v3

from configs.env_config import EnvConfig
from configs.loader import load_config, resolve_config_path
from envs.base import StepBuffers
from envs.errors import EnvConfigError
from envs.registry import env_spec, make_vec_env
from envs.builtin.simple_spread import SimpleSpreadVec, obs_dim, spread_local_ratio, state_dim

MAX_CYCLES = 25
FLOAT32_TOL = {"rtol": 1e-6, "atol": 1e-6}


def make_mpe2(num_agents: int, local_ratio: float = 0.5):
    """The reference: mpe2's parallel simple_spread with continuous actions."""
    return simple_spread_v3.parallel_env(N=num_agents, max_cycles=MAX_CYCLES, local_ratio=local_ratio,
                                         continuous_actions=True)


def mpe2_world(reference) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(agent_pos, agent_vel, landmark_pos)`` of an mpe2 env, each [N, 2] float64."""
    world = reference.unwrapped.world
    return (np.array([a.state.p_pos for a in world.agents]), np.array([a.state.p_vel for a in world.agents]),
            np.array([lm.state.p_pos for lm in world.landmarks]))


def set_mpe2_world(reference, agent_pos: np.ndarray, landmark_pos: np.ndarray) -> None:
    """Place mpe2's agents (at rest) and landmarks by hand."""
    world = reference.unwrapped.world
    for agent, pos in zip(world.agents, agent_pos):
        agent.state.p_pos = pos.astype(np.float64).copy()
        agent.state.p_vel = np.zeros(2)
    for landmark, pos in zip(world.landmarks, landmark_pos):
        landmark.state.p_pos = pos.astype(np.float64).copy()


def stacked(values: dict, names: list[str]) -> np.ndarray:
    """A PettingZoo per-agent dict as one array in agent order."""
    return np.stack([np.asarray(values[name]) for name in names])


def new_env(num_envs: int, num_agents: int, **kwargs) -> tuple[SimpleSpreadVec, StepBuffers]:
    """A SimpleSpreadVec and private buffers for it."""
    env = SimpleSpreadVec(num_envs, num_agents=num_agents, **kwargs)
    return env, StepBuffers.allocate(env.spec, num_envs)


def run_side_by_side(reference, env: SimpleSpreadVec, buffers: StepBuffers, rng: np.random.Generator,
                     steps: int) -> int:
    """Step mpe2 and env 0 with the same actions, comparing every output; returns how many agent pairs collided.

    Our env gets raw actions (some outside [0, 1]); mpe2 gets them clipped, which is what its
    ClipOutOfBoundsWrapper does (without the warning it prints per clipped action).
    """
    n = env.num_agents
    names = reference.possible_agents
    collisions = 0
    for t in range(steps):
        actions = rng.uniform(-0.25, 1.25, size=(n, 5)).astype(np.float32)
        obs, rewards, terms, truncs, _ = reference.step(dict(zip(names, np.clip(actions, 0.0, 1.0))))
        buffers.actions[:n] = actions
        env.step(buffers)
        ours = buffers.final_obs[:n] if buffers.truncated[0] else buffers.obs[:n]
        np.testing.assert_allclose(ours, stacked(obs, names), **FLOAT32_TOL, err_msg=f"obs at step {t + 1}")
        np.testing.assert_allclose(buffers.rewards[:n], stacked(rewards, names), **FLOAT32_TOL,
                                   err_msg=f"rewards at step {t + 1}")
        np.testing.assert_array_equal(buffers.terminated[:n], stacked(terms, names))
        np.testing.assert_array_equal(buffers.truncated[:n], stacked(truncs, names))
        positions = mpe2_world(reference)[0]
        collisions += sum(int(np.linalg.norm(positions[i] - positions[j]) < 0.3)
                          for i in range(n) for j in range(i + 1, n))
    return collisions


@pytest.mark.parametrize("num_agents", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_mpe2_step_by_step(num_agents: int, seed: int) -> None:
    """mpe2's world copied into env 0: 25 steps of random actions give the same obs, rewards and flags."""
    reference = make_mpe2(num_agents)
    first_obs, _ = reference.reset(seed=seed)
    env, buffers = new_env(2, num_agents)
    env.reset(buffers, seed=seed + 100)
    agent_pos, agent_vel, landmark_pos = mpe2_world(reference)
    env.set_world(0, agent_pos, agent_vel, landmark_pos, buffers=buffers)
    np.testing.assert_array_equal(buffers.obs[:num_agents], stacked(first_obs, reference.possible_agents))
    run_side_by_side(reference, env, buffers, np.random.default_rng(seed), MAX_CYCLES)
    assert buffers.truncated[:num_agents].all() and not reference.agents


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), num_agents=st.integers(2, 5), spread=st.floats(0.05, 0.4),
       local_ratio=st.floats(0.0, 1.0))
def test_crowded_worlds_match_mpe2(seed: int, num_agents: int, spread: float, local_ratio: float) -> None:
    """Agents packed within ``spread`` of each other (contact forces and collision penalties at work)."""
    rng = np.random.default_rng(seed)
    agent_pos = rng.uniform(-spread, spread, size=(num_agents, 2))
    landmark_pos = rng.uniform(-1.0, 1.0, size=(num_agents, 2))
    reference = make_mpe2(num_agents, local_ratio)
    reference.reset(seed=seed)
    set_mpe2_world(reference, agent_pos, landmark_pos)
    env, buffers = new_env(1, num_agents, local_ratio=local_ratio)
    env.reset(buffers, seed=seed)
    env.set_world(0, agent_pos, np.zeros((num_agents, 2)), landmark_pos)
    run_side_by_side(reference, env, buffers, rng, 10)
    np.testing.assert_allclose(np.stack(env.get_world(0)), np.stack(mpe2_world(reference)), rtol=1e-9, atol=1e-12)


def test_crowded_world_collides() -> None:
    """The crowded comparison does exercise collisions: agents on one spot are penalised in both envs."""
    reference = make_mpe2(3)
    reference.reset(seed=0)
    set_mpe2_world(reference, np.zeros((3, 2)) + [[0.0, 0.0], [0.05, 0.0], [0.0, 0.05]], np.ones((3, 2)))
    env, buffers = new_env(1, 3)
    env.reset(buffers, seed=0)
    env.set_world(0, *mpe2_world(reference))
    assert run_side_by_side(reference, env, buffers, np.random.default_rng(0), 1) > 0


@pytest.mark.parametrize("num_agents", [1, 3])
def test_seeded_reset_draws_mpe2_world(num_agents: int) -> None:
    """reset(seed) puts env 0 where mpe2's reset(seed=seed) puts its world (same generator, same order)."""
    reference = make_mpe2(num_agents)
    first_obs, _ = reference.reset(seed=42)
    env, buffers = new_env(3, num_agents)
    env.reset(buffers, seed=42)
    np.testing.assert_array_equal(buffers.obs[:num_agents], stacked(first_obs, reference.possible_agents))
    np.testing.assert_array_equal(np.stack(env.get_world(0)), np.stack(mpe2_world(reference)))


def random_actions(rng: np.random.Generator, buffers: StepBuffers) -> None:
    """Uniform actions in [0, 1] for every slot."""
    buffers.actions[:] = rng.uniform(0.0, 1.0, size=buffers.actions.shape).astype(np.float32)


def test_auto_reset_after_max_steps() -> None:
    """All agents of an env are truncated together at max_steps; the env restarts from a fresh world at rest."""
    env, buffers = new_env(4, 3, max_steps=5)
    env.reset(buffers, seed=3)
    rng = np.random.default_rng(3)
    for episode in range(3):
        for t in range(5):
            random_actions(rng, buffers)
            env.step(buffers)
            ended = t == 4
            assert (buffers.truncated == ended).all() and (buffers.episode_done == ended).all()
            assert not buffers.terminated.any()
        assert (buffers.episode_length == 5).all()
        np.testing.assert_array_equal(buffers.obs[:, :2], 0.0)  # the new episode starts at rest
        assert not np.allclose(buffers.obs[:, 2:4], buffers.final_obs[:, 2:4])


def test_max_steps_zero_means_25() -> None:
    assert SimpleSpreadVec(1, max_steps=0).max_steps == 25
    assert SimpleSpreadVec(1, max_steps=-3).max_steps == 25
    assert SimpleSpreadVec(1, max_steps=7).max_steps == 7


def test_episode_return_is_sum_of_rewards() -> None:
    env, buffers = new_env(8, 3, max_steps=25, local_ratio=0.3)
    env.reset(buffers, seed=5)
    rng = np.random.default_rng(5)
    totals = np.zeros(24)
    for _ in range(25):
        random_actions(rng, buffers)
        env.step(buffers)
        totals += buffers.rewards
    assert buffers.episode_done.all()
    np.testing.assert_allclose(buffers.episode_return, totals, rtol=1e-5)
    assert buffers.episode_return.dtype == np.float32


def test_global_state_layout() -> None:
    """[agent positions, agent velocities, landmark positions], consistent with the world and the observations."""
    n = 4
    env, buffers = new_env(5, n, max_steps=3)
    env.reset(buffers, seed=9)
    rng = np.random.default_rng(9)
    state = np.zeros((5, state_dim(n)), dtype=np.float32)
    final = np.zeros_like(state)
    for t in range(3):
        random_actions(rng, buffers)
        if t == 2:
            env.global_state(final)  # the state before the last step
        env.step(buffers)
    env.global_state(state)
    env.final_global_state(final)
    assert state.shape == (5, 6 * n) and env.state_dim == 24
    blocks = state.reshape(5, 3, n, 2)
    for e in range(5):
        pos, vel, landmarks = env.get_world(e)
        np.testing.assert_array_equal(blocks[e], np.stack([pos, vel, landmarks]).astype(np.float32))
    obs = buffers.obs.reshape(5, n, obs_dim(n))
    np.testing.assert_allclose(obs[:, :, 0:2], blocks[:, 1], **FLOAT32_TOL)
    np.testing.assert_allclose(obs[:, :, 2:4], blocks[:, 0], **FLOAT32_TOL)
    np.testing.assert_allclose(obs[:, :, 4:4 + 2 * n].reshape(5, n, n, 2),
                               blocks[:, 2][:, None] - blocks[:, 0][:, :, None], **FLOAT32_TOL)
    final_obs = buffers.final_obs.reshape(5, n, obs_dim(n))
    final_blocks = final.reshape(5, 3, n, 2)
    np.testing.assert_allclose(final_obs[:, :, 2:4], final_blocks[:, 0], **FLOAT32_TOL)
    np.testing.assert_allclose(final_obs[:, :, 0:2], final_blocks[:, 1], **FLOAT32_TOL)
    with pytest.raises(EnvConfigError, match=r"float32 of shape \(5, 24\)"):
        env.global_state(np.zeros((5, 24), dtype=np.float64))


def test_buffers_global_state_matches_methods_across_episode_ends() -> None:
    """buffers.global_state / final_global_state hold each env's global_state() / final_global_state() row
    in every one of its slots, after reset, every step and the truncations at max_steps (in slot views)."""
    num_envs, n, max_steps = 4, 3, 3
    env = SimpleSpreadVec(num_envs, num_agents=n, max_steps=max_steps)
    assert env.spec.state_size == state_dim(n)
    whole = StepBuffers.allocate(env.spec, num_envs + 2)
    whole.global_state[:] = 7.0
    rows = slice(n, n + num_envs * n)  # one env's slots on either side stay untouched
    buffers = StepBuffers(**{name: getattr(whole, name)[rows] for name in StepBuffers.__dataclass_fields__})
    assert buffers.global_state.shape == (num_envs * n, state_dim(n))
    state = np.zeros((num_envs, state_dim(n)), dtype=np.float32)
    final = np.zeros_like(state)
    env.reset(buffers, seed=3)
    env.global_state(state)
    np.testing.assert_array_equal(buffers.global_state, np.repeat(state, n, axis=0))
    assert not buffers.final_global_state.any()
    rng = np.random.default_rng(3)
    ends = 0
    for _ in range(3 * max_steps + 1):
        random_actions(rng, buffers)
        before = buffers.global_state.copy()
        env.step(buffers)
        env.global_state(state)
        np.testing.assert_array_equal(buffers.global_state, np.repeat(state, n, axis=0))
        assert not np.array_equal(buffers.global_state, before)
        if buffers.truncated.any():
            ends += 1
            assert buffers.truncated.all()
            env.final_global_state(final)
            np.testing.assert_array_equal(buffers.final_global_state, np.repeat(final, n, axis=0))
            assert not np.array_equal(final, state)  # the old episode's last state, not the new one's first
    assert ends == 3
    assert (whole.global_state[:n] == 7.0).all() and (whole.global_state[-n:] == 7.0).all()


def test_dtypes_and_spec() -> None:
    env, buffers = new_env(2, 3)
    assert env.spec.obs_shape == (18,) and env.spec.obs_dtype == "float32"
    assert env.spec.action.kind == "box" and env.spec.action.shape == (5,)
    assert env.spec.action.low == (0.0,) * 5 and env.spec.action.high == (1.0,) * 5
    env.reset(buffers, seed=0)
    assert buffers.obs.dtype == np.float32 and buffers.rewards.dtype == np.float32


def test_same_seed_same_run() -> None:
    outputs = []
    for _ in range(2):
        env, buffers = new_env(3, 2, max_steps=4)
        env.reset(buffers, seed=11)
        rng = np.random.default_rng(0)
        trace = []
        for _ in range(10):
            random_actions(rng, buffers)
            env.step(buffers)
            trace.append(buffers.obs.copy())
        outputs.append(np.stack(trace))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_errors_name_the_thing_and_allowed_values() -> None:
    with pytest.raises(EnvConfigError, match="unknown keys \\['N'\\]; allowed keys: 'local_ratio'"):
        spread_local_ratio({"N": 3})
    for bad in (1.5, -0.1, True, "half"):
        with pytest.raises(EnvConfigError, match=r"local_ratio .* must be a number in \[0, 1\]"):
            spread_local_ratio({"local_ratio": bad})
    assert spread_local_ratio({}) == 0.5 and spread_local_ratio({"local_ratio": 1}) == 1.0
    with pytest.raises(EnvConfigError, match="num_agents >= 1"):
        SimpleSpreadVec(1, num_agents=0)
    with pytest.raises(EnvConfigError, match="num_envs >= 1"):
        SimpleSpreadVec(0)
    env, buffers = new_env(2, 3)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(buffers)
    env.reset(buffers, seed=0)
    buffers.actions[4, 2] = np.nan
    with pytest.raises(EnvConfigError, match="agent slot 4 has NaN"):
        env.step(buffers)
    with pytest.raises(EnvConfigError, match=r"agent_vel must have shape \(3, 2\)"):
        env.set_world(0, np.zeros((3, 2)), np.zeros(2), np.zeros((3, 2)))


def test_registry_builds_simple_spread() -> None:
    cfg = EnvConfig(name="simple_spread", num_agents=4, max_steps=0, kwargs={"local_ratio": 0.2})
    assert env_spec(cfg).obs_shape == (24,)
    env = make_vec_env(cfg, 3)
    assert isinstance(env, SimpleSpreadVec) and env.max_steps == 25 and env.local_ratio == 0.2
    with pytest.raises(EnvConfigError, match="num_agents for env 'simple_spread' must be >= 1"):
        env_spec(EnvConfig(name="simple_spread", num_agents=0))
    with pytest.raises(EnvConfigError, match="unknown keys"):
        make_vec_env(EnvConfig(name="simple_spread", num_agents=3, kwargs={"N": 3}), 1)


def test_shipped_config() -> None:
    config = load_config(resolve_config_path("simple_spread"))
    assert config.env.name == "simple_spread" and config.env.num_agents == 3 and config.env.max_steps == 25
    assert env_spec(config.env).action.kind == "box"


def test_many_envs_step_and_report_speed() -> None:
    """1024 envs step in one kernel call each; prints (never asserts) env steps per second against mpe2's."""
    env, buffers = new_env(1024, 3)
    env.reset(buffers, seed=0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(0.0, 1.0, size=(8, *buffers.actions.shape)).astype(np.float32)
    env.step(buffers)  # compile
    steps = 2000
    start = time.perf_counter()
    for t in range(steps):
        buffers.actions[:] = actions[t % 8]
        env.step(buffers)
    ours = 1024 * steps / (time.perf_counter() - start)
    assert np.isfinite(buffers.obs).all() and np.isfinite(buffers.rewards).all()
    reference = make_mpe2(3)
    reference.reset(seed=0)
    names = reference.possible_agents
    start = time.perf_counter()
    for t in range(steps):
        if not reference.agents:
            reference.reset()
        reference.step(dict(zip(names, actions[t % 8, :3])))
    theirs = steps / (time.perf_counter() - start)
    print(f"\nsimple_spread N=3 env steps/s: numba 1024 envs {ours:,.0f}; mpe2 one env {theirs:,.0f} "
          f"({ours / theirs:,.0f}x)")
