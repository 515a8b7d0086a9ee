"""CartPoleVec against Gymnasium's CartPole-v1, step for step."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from envs.base import StepBuffers
from envs.builtin.cartpole import CartPoleVec

NUM_ENVS = 4
NUM_ACTIONS = 600


def _make(max_steps: int = 500) -> tuple[CartPoleVec, StepBuffers]:
    env = CartPoleVec(NUM_ENVS, max_steps=max_steps)
    return env, StepBuffers.allocate(env.spec, NUM_ENVS)


def test_spec() -> None:
    env, _ = _make()
    assert env.spec.num_agents == 1
    assert env.spec.obs_shape == (4,)
    assert env.spec.obs_dtype == "float32"
    assert env.spec.num_actions == 2
    assert env.num_envs == NUM_ENVS


@pytest.mark.parametrize("seed", [0, 1, 7, 1234])
@pytest.mark.parametrize("index", range(NUM_ENVS))
def test_matches_gymnasium_step_for_step(seed: int, index: int) -> None:
    """Same state + same actions -> bitwise-identical obs and identical reward/flags/episode stats.

    Exact equality holds because the kernel evaluates the same float64 expressions in the same order as
    Gymnasium and both sides round the state to float32 the same way. The float64 state is compared
    exactly too; a libm whose sin/cos differs from NumPy's by one ulp would show up here first.
    """
    env, buf = _make()
    env.reset(buf, seed=seed + 100)
    gym_env = gymnasium.make("CartPole-v1")
    gym_env.reset(seed=seed)
    env.set_state(index, gym_env.unwrapped.state)
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, 2, size=(NUM_ACTIONS, NUM_ENVS)).astype(np.int32)
    gym_return = 0.0
    gym_length = 0
    episodes = 0
    for t in range(NUM_ACTIONS):
        buf.actions[:] = actions[t]
        obs, reward, terminated, truncated, _ = gym_env.step(int(actions[t, index]))
        env.step(buf)
        gym_return += reward
        gym_length += 1
        assert buf.rewards[index] == reward == 1.0, t
        assert bool(buf.terminated[index]) == terminated, t
        assert bool(buf.truncated[index]) == (truncated and not terminated), t
        if not (terminated or truncated):
            assert not buf.episode_done[index], t
            np.testing.assert_array_equal(buf.obs[index], obs, err_msg=f"step {t}")
            assert buf.obs.dtype == np.float32
            np.testing.assert_array_equal(env.get_state(index), gym_env.unwrapped.state)
            continue
        assert buf.episode_done[index], t
        assert buf.episode_return[index] == gym_return
        assert buf.episode_length[index] == gym_length
        if truncated and not terminated:
            np.testing.assert_array_equal(buf.final_obs[index], obs)
        episodes += 1
        gym_return, gym_length = 0.0, 0
        gym_env.reset()
        env.set_state(index, gym_env.unwrapped.state)
    assert episodes >= 5  # random actions end episodes after ~20 steps
    gym_env.close()


def _balanced_state() -> np.ndarray:
    return np.zeros(4, dtype=np.float64)


def test_truncation_sets_truncated_and_final_obs() -> None:
    max_steps = 10
    env, buf = _make(max_steps=max_steps)
    env.reset(buf, seed=3)
    gym_env = gymnasium.make("CartPole-v1", max_episode_steps=max_steps)
    gym_env.reset(seed=3)
    for i in range(NUM_ENVS):
        env.set_state(i, _balanced_state())
    gym_env.unwrapped.state = _balanced_state()
    for t in range(max_steps):
        buf.actions[:] = t % 2  # alternate pushes: stays well inside the thresholds
        obs, _, terminated, truncated, _ = gym_env.step(t % 2)
        env.step(buf)
        assert not buf.terminated.any() and not terminated
        if t < max_steps - 1:
            assert not buf.truncated.any() and not buf.episode_done.any() and not truncated
            np.testing.assert_array_equal(buf.obs, np.tile(obs, (NUM_ENVS, 1)))
    assert truncated
    assert buf.truncated.all() and buf.episode_done.all()
    np.testing.assert_array_equal(buf.final_obs, np.tile(obs, (NUM_ENVS, 1)))
    np.testing.assert_array_equal(buf.episode_length, max_steps)
    np.testing.assert_array_equal(buf.episode_return, float(max_steps))
    # Auto-reset: a fresh start state, not the final one.
    assert np.all(np.abs(buf.obs) <= 0.05)
    assert not np.array_equal(buf.obs, buf.final_obs)
    # The next step clears the flags.
    buf.actions[:] = 0
    env.step(buf)
    assert not buf.truncated.any() and not buf.episode_done.any() and not buf.terminated.any()


def test_terminating_on_last_allowed_step_is_terminated_not_truncated() -> None:
    env, buf = _make(max_steps=1)
    env.reset(buf, seed=0)
    falling = np.array([0.0, 0.0, 0.2094, 2.0])  # crosses 12 degrees on the first step
    env.set_state(0, falling)
    buf.actions[:] = 1
    buf.final_obs[:] = -7.0
    env.step(buf)
    assert buf.terminated[0] and not buf.truncated[0] and buf.episode_done[0]
    assert buf.episode_length[0] == 1 and buf.episode_return[0] == 1.0
    np.testing.assert_array_equal(buf.final_obs[0], -7.0)  # final_obs only for truncation
    # The others hit the 1-step limit without terminating.
    assert not buf.terminated[1:].any() and buf.truncated[1:].all()


def test_reset_is_deterministic_by_seed() -> None:
    def run(seed: int) -> list[np.ndarray]:
        env, buf = _make(max_steps=50)
        env.reset(buf, seed=seed)
        out = [buf.obs.copy()]
        rng = np.random.default_rng(0)
        for _ in range(300):  # several auto-resets per env
            buf.actions[:] = rng.integers(0, 2, size=NUM_ENVS)
            env.step(buf)
            out.append(buf.obs.copy())
        return out

    a, b, c = run(5), run(5), run(6)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert np.all(np.abs(a[0]) <= 0.05)
    # Env 0's first state is exactly what gymnasium's reset(seed=...) draws.
    gym_obs, _ = gymnasium.make("CartPole-v1").reset(seed=5)
    np.testing.assert_array_equal(a[0][0], gym_obs)


def test_reset_clears_buffers_and_rejects_bad_actions() -> None:
    env, buf = _make()
    buf.rewards[:] = 3.0
    buf.terminated[:] = True
    buf.episode_done[:] = True
    env.reset(buf, seed=1)
    assert not buf.terminated.any() and not buf.episode_done.any()
    np.testing.assert_array_equal(buf.rewards, 0.0)
    before = [env.get_state(i) for i in range(NUM_ENVS)]
    buf.actions[:] = [0, 1, 2, 0]
    with pytest.raises(ValueError, match="action 2 for env 2"):
        env.step(buf)
    for i in range(NUM_ENVS):  # nothing was stepped
        np.testing.assert_array_equal(env.get_state(i), before[i])
