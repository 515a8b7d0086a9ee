"""GymnasiumVecEnv and the env registry: dtypes, auto-reset, episode stats and error messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from actors.envs.base import StepBuffers
from actors.envs.cartpole import CartPoleVec
from actors.envs.gym_adapter import GymnasiumVecEnv
from actors.envs.registry import env_spec, make_vec_env
from configs.env_config import EnvConfig

UINT8_ID = "SluiceTest/Uint8Grid-v0"
BAD_OBS_ID = "SluiceTest/BadObs-v0"
RAISING_ID = "SluiceTest/Raising-v0"


class Uint8GridEnv(gymnasium.Env):
    """uint8 image observations; terminates after ``length`` steps; reward = action + 1."""

    observation_space = spaces.Box(0, 255, shape=(3, 5, 5), dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.t = 0

    def _obs(self) -> np.ndarray:
        return self.np_random.integers(0, 256, size=(3, 5, 5), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(action) + 1.0, self.t >= self.length, False, {}


class BadObsEnv(Uint8GridEnv):
    """Returns an observation of the wrong shape or dtype from reset or step."""

    def __init__(self, bad: str = "shape", when: str = "step") -> None:
        super().__init__(length=100)
        self.bad, self.when = bad, when

    def _wrong(self) -> np.ndarray:
        obs = self._obs()
        return obs.reshape(75) if self.bad == "shape" else obs.astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed)
        return (self._wrong() if self.when == "reset" else obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        _, reward, term, trunc, info = super().step(action)
        return self._wrong(), reward, term, trunc, info


class RaisingEnv(Uint8GridEnv):
    """Raises from step after one step, or from reset."""

    def __init__(self, where: str = "step") -> None:
        super().__init__(length=100)
        self.where = where

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if self.where == "reset":
            raise OSError("simulator crashed in reset")
        return super().reset(seed=seed)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.t >= 1:
            raise ZeroDivisionError("physics blew up")
        return super().step(action)


@pytest.fixture(scope="module", autouse=True)
def _registered_envs() -> Iterator[None]:
    ids = {UINT8_ID: Uint8GridEnv, BAD_OBS_ID: BadObsEnv, RAISING_ID: RaisingEnv}
    for env_id, cls in ids.items():
        gymnasium.register(id=env_id, entry_point=cls, max_episode_steps=3 if cls is Uint8GridEnv else None)
    yield
    for env_id in ids:
        del gymnasium.registry[env_id]


def _buffers(env: GymnasiumVecEnv) -> StepBuffers:
    return StepBuffers.allocate(env.spec, env.num_envs)


def test_cartpole_through_adapter_matches_spec_and_truncates() -> None:
    env = GymnasiumVecEnv("CartPole-v1", 3, max_steps=5, kwargs={})
    assert env.spec.obs_shape == (4,) and env.spec.obs_dtype == "float32" and env.spec.num_actions == 2
    buf = _buffers(env)
    env.reset(buf, seed=10)
    # env i is seeded with seed + i
    for i in range(3):
        np.testing.assert_array_equal(buf.obs[i], gymnasium.make("CartPole-v1").reset(seed=10 + i)[0])
    episodes = 0
    for _ in range(40):
        buf.actions[:] = np.arange(3) % 2
        env.step(buf)
        assert buf.obs.dtype == np.float32
        for i in np.flatnonzero(buf.episode_done):
            episodes += 1
            assert buf.episode_length[i] <= 5
            assert buf.episode_return[i] == buf.episode_length[i]
            assert buf.terminated[i] != buf.truncated[i]
            if buf.truncated[i]:
                assert buf.episode_length[i] == 5
                assert np.any(buf.final_obs[i] != 0)
        assert not (buf.terminated & ~buf.episode_done).any()
    assert episodes >= 3 * 40 // 5 - 3
    env.close()


def test_uint8_obs_kept_and_stats() -> None:
    env = GymnasiumVecEnv(UINT8_ID, 2, max_steps=10, kwargs={"length": 4})
    assert env.spec.obs_dtype == "uint8" and env.spec.obs_shape == (3, 5, 5) and env.spec.num_actions == 3
    buf = _buffers(env)
    assert buf.obs.dtype == np.uint8
    env.reset(buf, seed=0)
    first = buf.obs.copy()
    env.reset(buf, seed=0)
    np.testing.assert_array_equal(buf.obs, first)  # reset is deterministic by seed
    for t in range(1, 9):
        buf.actions[:] = [0, 2]
        env.step(buf)
        np.testing.assert_array_equal(buf.rewards, [1.0, 3.0])
        done = t % 4 == 0
        assert buf.episode_done.tolist() == [done, done]
        assert buf.terminated.tolist() == [done, done] and not buf.truncated.any()
        if done:
            np.testing.assert_array_equal(buf.episode_length, 4)
            np.testing.assert_array_equal(buf.episode_return, [4.0, 12.0])
    env.close()


def test_terminating_at_time_limit_is_not_truncated() -> None:
    env = GymnasiumVecEnv(UINT8_ID, 1, max_steps=4, kwargs={"length": 4})
    buf = _buffers(env)
    env.reset(buf, seed=0)
    for _ in range(4):
        env.step(buf)
    assert buf.terminated[0] and not buf.truncated[0] and buf.episode_done[0]


def test_max_steps_zero_keeps_registered_limit() -> None:
    env = GymnasiumVecEnv(UINT8_ID, 1, max_steps=0, kwargs={"length": 100})
    buf = _buffers(env)
    env.reset(buf, seed=0)
    for _ in range(3):
        env.step(buf)
    last = buf.final_obs[0].copy()
    assert buf.truncated[0] and not buf.terminated[0] and buf.episode_length[0] == 3
    assert not np.array_equal(last, buf.obs[0])  # obs is the next episode's first


def test_box_action_space_rejected() -> None:
    with pytest.raises(ValueError, match=r"gymnasium env 'Pendulum-v1': action space is Box.*Discrete action"):
        GymnasiumVecEnv("Pendulum-v1", 1, max_steps=0, kwargs={})


def test_non_box_observation_rejected() -> None:
    with pytest.raises(ValueError, match=r"'FrozenLake-v1': observation space is Discrete.*Box observation"):
        GymnasiumVecEnv("FrozenLake-v1", 1, max_steps=0, kwargs={})


@pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium's passive checker warns about the same obs
@pytest.mark.parametrize(
    ("bad", "when", "got"),
    [
        ("shape", "step", r"shape \(75,\) dtype uint8"),
        ("dtype", "step", r"shape \(3, 5, 5\) dtype float32"),
        ("shape", "reset", r"shape \(75,\) dtype uint8"),
    ],
)
def test_wrong_observation_rejected(bad: str, when: str, got: str) -> None:
    env = GymnasiumVecEnv(BAD_OBS_ID, 2, max_steps=0, kwargs={"bad": bad, "when": when})
    buf = _buffers(env)
    expected = r"expected shape \(3, 5, 5\) dtype uint8"
    with pytest.raises(ValueError, match=rf"'{BAD_OBS_ID}' \(env 0\) {when}\(\) returned .*{got}; {expected}"):
        env.reset(buf, seed=0)
        env.step(buf)
    env.close()


def test_env_raising_in_step_or_reset_is_wrapped() -> None:
    env = GymnasiumVecEnv(RAISING_ID, 1, max_steps=0, kwargs={})
    buf = _buffers(env)
    env.reset(buf, seed=0)
    env.step(buf)
    with pytest.raises(RuntimeError, match=rf"'{RAISING_ID}' \(env 0\) raised in step\(\).*physics blew up") as info:
        env.step(buf)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    env = GymnasiumVecEnv(RAISING_ID, 1, max_steps=0, kwargs={"where": "reset"})
    with pytest.raises(RuntimeError, match=r"raised in reset\(\).*simulator crashed") as info:
        env.reset(_buffers(env), seed=0)
    assert isinstance(info.value.__cause__, OSError)


def test_unknown_gym_id() -> None:
    with pytest.raises(ValueError, match=r"gymnasium has no env with id 'NoSuchEnv-v3'.*NoSuchEnv") as info:
        GymnasiumVecEnv("NoSuchEnv-v3", 1, max_steps=0, kwargs={})
    assert isinstance(info.value.__cause__, gymnasium.error.UnregisteredEnv)
    cfg = EnvConfig(name="gymnasium", gym_id="NoSuchEnv-v3")
    with pytest.raises(ValueError, match="'NoSuchEnv-v3'"):
        env_spec(cfg)
    with pytest.raises(ValueError, match="'NoSuchEnv-v3'"):
        make_vec_env(cfg, 2)


def test_unknown_env_name() -> None:
    cfg = EnvConfig(name="atari")
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 1)):
        with pytest.raises(ValueError, match=r"unknown env.name 'atari'; allowed names: 'cartpole', 'gymnasium'"):
            call()


def test_wrong_num_agents() -> None:
    cfg = EnvConfig(name="cartpole", num_agents=3)
    msg = r"env.num_agents=3 but env 'cartpole' has 1 agent per environment"
    with pytest.raises(ValueError, match=msg):
        env_spec(cfg)
    with pytest.raises(ValueError, match=msg):
        make_vec_env(cfg, 2)
    cfg = EnvConfig(name="gymnasium", gym_id="CartPole-v1", num_agents=2)
    msg = r"env.num_agents=2 but env 'gymnasium:CartPole-v1' has 1 agent per environment"
    with pytest.raises(ValueError, match=msg):
        env_spec(cfg)
    with pytest.raises(ValueError, match=msg):
        make_vec_env(cfg, 2)


def test_registry_builds_envs() -> None:
    cfg = EnvConfig(name="cartpole", max_steps=200)
    assert env_spec(cfg) == CartPoleVec.SPEC
    env = make_vec_env(cfg, 8)
    assert isinstance(env, CartPoleVec) and env.num_envs == 8 and env.max_steps == 200
    with pytest.raises(ValueError, match=r"env.kwargs is not supported for env 'cartpole'"):
        make_vec_env(EnvConfig(name="cartpole", kwargs={"x": 1}), 1)
    cfg = EnvConfig(name="gymnasium", gym_id=UINT8_ID, kwargs={"length": 2}, max_steps=0)
    spec = env_spec(cfg)
    assert spec.obs_dtype == "uint8" and spec.obs_shape == (3, 5, 5) and spec.num_actions == 3
    env = make_vec_env(cfg, 2)
    assert isinstance(env, GymnasiumVecEnv) and env.spec == spec
    buf = StepBuffers.allocate(spec, 2)
    env.reset(buf, seed=1)
    env.step(buf)
    env.step(buf)
    assert buf.episode_done.all() and buf.terminated.all()
    env.close()
