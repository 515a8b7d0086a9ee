"""GymnasiumVecEnv and the env registry: dtypes, auto-reset, episode stats, action spaces, masks and errors."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from envs.base import EnvSpec, StepBuffers
from envs.builtin.cartpole import CartPoleVec
from envs.adapters.gym_adapter import GymnasiumVecEnv
from envs.adapters.gym_spaces import SpaceConverter, reward_value
from envs.spaces import ActionSpace
from envs.registry import env_spec, make_vec_env
from configs.env_config import EnvConfig
from tests.fake_envs import mask_at

UINT8_ID = "SluiceTest/Uint8Grid-v0"
BAD_OBS_ID = "SluiceTest/BadObs-v0"
RAISING_ID = "SluiceTest/Raising-v0"
ECHO_ID = "SluiceTest/Echo-v0"
UNSUPPORTED_ID = "SluiceTest/Unsupported-v0"
OLD_API_ID = "SluiceTest/OldApi-v0"


@pytest.fixture(scope="module", autouse=True)
def _registered_envs() -> Iterator[None]:
    ids = {UINT8_ID: "Uint8GridEnv", BAD_OBS_ID: "BadObsEnv", RAISING_ID: "RaisingEnv", ECHO_ID: "EchoEnv",
           UNSUPPORTED_ID: "UnsupportedEnv", OLD_API_ID: "OldApiEnv"}
    for env_id, cls in ids.items():
        gymnasium.register(id=env_id, entry_point=f"tests.fake_envs:{cls}",
                           max_episode_steps=3 if env_id == UINT8_ID else None, disable_env_checker=True)
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


def test_pendulum_box_action_space() -> None:
    env = GymnasiumVecEnv("Pendulum-v1", 2, max_steps=3, kwargs={})
    assert env.spec.action == ActionSpace.box([-2.0], [2.0]) and env.spec.obs_shape == (3,)
    buf = _buffers(env)
    env.reset(buf, seed=0)
    buf.actions[:] = [[5.0], [-0.5]]  # 5.0 is clipped to the space's bound 2.0
    for _ in range(3):
        env.step(buf)
    assert buf.truncated.all() and buf.episode_done.all() and (buf.episode_length == 3).all()
    env.close()


@pytest.mark.parametrize(
    ("kind", "actions", "received"),
    [
        ("discrete", [0, 2], [-1, 1]),  # Discrete(3, start=-1)
        ("multi_discrete", [[0, 0], [2, 1]], [[1, -1], [3, 0]]),  # MultiDiscrete([3, 2], start=[1, -1])
        ("box", [[-7.0, 0.5], [0.25, 9.0]], [[-1.0, 0.5], [0.25, 2.0]]),  # clipped to [-1, 1] x [0, 2]
        ("multi_binary", [[1, 0, 1], [0, 0, 1]], [[1, 0, 1], [0, 0, 1]]),  # MultiBinary(3): int8 flags
    ],
)
def test_actions_reach_the_env_converted(kind: str, actions: list, received: list) -> None:
    env = GymnasiumVecEnv(ECHO_ID, 2, max_steps=0, kwargs={"kind": kind, "length": 5})
    assert env.spec.action.kind == ("multi_discrete" if kind == "multi_binary" else kind)
    buf = _buffers(env)
    env.reset(buf, seed=0)
    buf.actions[:] = np.asarray(actions, dtype=buf.actions.dtype)
    env.step(buf)
    for i in range(2):
        got = env._envs[i].unwrapped.received[-1]
        np.testing.assert_array_equal(got, received[i])
        if kind in ("box", "multi_binary"):
            assert got.dtype == (np.float64 if kind == "box" else np.int8)  # the space's dtype
        assert buf.rewards[i] == 10.0 + np.sum(received[i])


def test_action_out_of_range_names_env() -> None:
    env = GymnasiumVecEnv(ECHO_ID, 2, max_steps=0, kwargs={"kind": "multi_discrete"})
    buf = _buffers(env)
    env.reset(buf, seed=0)
    buf.actions[:] = [[0, 0], [1, 2]]
    with pytest.raises(ValueError, match=rf"gymnasium env '{ECHO_ID}' \(env 1\): action \[1, 2\] is out of range "
                                         r"for MultiDiscrete\(\[3, 2\]\)"):
        env.step(buf)
    env = GymnasiumVecEnv(ECHO_ID, 1, max_steps=0, kwargs={})
    buf = _buffers(env)
    env.reset(buf, seed=0)
    buf.actions[:] = 3
    with pytest.raises(ValueError, match=r"\(env 0\): action 3 is out of range \[0, 3\)"):
        env.step(buf)


def test_dict_observation_masks_reach_buffers() -> None:
    env = GymnasiumVecEnv(ECHO_ID, 2, max_steps=0, kwargs={"kind": "masked", "length": 3})
    assert env.spec.action_mask and env.spec.mask_size == 4 and env.spec.obs_shape == (3,)
    buf = _buffers(env)
    env.reset(buf, seed=4)
    np.testing.assert_array_equal(buf.obs, [[0, 0, 4], [0, 0, 5]])
    for t in range(6):
        np.testing.assert_array_equal(buf.action_mask, [mask_at(t % 3, 0)] * 2)
        buf.actions[:] = np.flatnonzero(buf.action_mask[0])[-1]  # a legal action (the env raises otherwise)
        env.step(buf)
    env.close()


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("sequence_obs", r"observation space is Sequence\(.*\(Sequence\); supported: Box observation"),
        ("text_action", r"action space is Text\(.*\(Text\); supported:"),
        ("int_box_action", r"action space is Box\(.*; a Box action space needs a float dtype, not int64; supported"),
        ("2d_box_action", r"action space is Box\(.*; a Box action space needs shape \(d,\), not \(2, 2\)"),
        ("2d_multi_discrete", r"action space is MultiDiscrete\(\[\[2 3\] \[4 5\]\]\) \(MultiDiscrete\); its nvec "
                              r"has shape \(2, 2\), not 1-D"),
        ("2d_multi_binary", r"action space is MultiBinary\(\(2, 2\)\) \(MultiBinary\); a MultiBinary action space "
                            r"needs shape \(n,\), not \(2, 2\)"),
        ("dict_with_sequence", r"leaf '1' is a Sequence space, which Sluice cannot carry \(it carries Box, "
                               r"Discrete, MultiDiscrete and MultiBinary leaves\)"),
        ("mask_wrong_size", r"observation space is Dict\(.*\(Dict\); its action_mask has shape \(3,\) but the "
                            r"action space Discrete\(2\) needs \(2,\)"),
        ("mask_with_box_action", r"observation space is Dict\(.*; an action mask needs Discrete or MultiDiscrete "
                                 r"actions, not Box\("),
    ],
)
def test_unsupported_spaces_rejected(what: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^gymnasium env '{UNSUPPORTED_ID}': {message}"):
        GymnasiumVecEnv(UNSUPPORTED_ID, 1, max_steps=0, kwargs={"what": what})


def test_discrete_observation_is_one_embedded_leaf() -> None:
    env = GymnasiumVecEnv("FrozenLake-v1", 2, max_steps=0, kwargs={})
    assert env.spec.obs_shape == (1,) and env.spec.obs_dtype == "uint8"
    assert [(leaf.name, leaf.kind, leaf.nvec) for leaf in env.spec.obs_leaves] == [("", "discrete", (16,))]
    buf = _buffers(env)
    env.reset(buf, seed=0)
    np.testing.assert_array_equal(buf.obs, [[0], [0]])  # the start square
    env.close()


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
    assert str(info.value).endswith("needs the package named first, e.g. env.gym_id: minigrid:MiniGrid-Empty-5x5-v0)")
    with pytest.raises(ValueError, match=r"'minigrid:NoSuchEnv-v3'") as info:
        GymnasiumVecEnv("minigrid:NoSuchEnv-v3", 1, max_steps=0, kwargs={})
    assert "package named first" not in str(info.value)  # the package is named: the hint would mislead
    cfg = EnvConfig(name="gymnasium", gym_id="NoSuchEnv-v3")
    with pytest.raises(ValueError, match="'NoSuchEnv-v3'"):
        env_spec(cfg)
    with pytest.raises(ValueError, match="'NoSuchEnv-v3'"):
        make_vec_env(cfg, 2)


def test_unknown_env_name() -> None:
    cfg = EnvConfig(name="atari")
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 1)):
        with pytest.raises(ValueError, match=r"unknown env.name 'atari'; allowed names: 'cartpole', .*'gymnasium'"):
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


@pytest.mark.parametrize(("declared", "returned", "expected"), [
    (np.float32, np.array([1.5, -2.0, 1e-3]), np.array([1.5, -2.0, 1e-3], dtype=np.float32)),  # float64
    (np.float32, [1, 2, 3], np.array([1, 2, 3], dtype=np.float32)),  # Python ints
    (np.float64, np.array([0.25, 2, 3], dtype=np.float32), np.array([0.25, 2, 3])),
    (np.uint8, [0, 7, 255], np.array([0, 7, 255], dtype=np.uint8)),  # int64 that fits
    (np.uint8, np.array([True, False, True]), np.array([1, 0, 1], dtype=np.uint8)),
    (np.int16, np.array([-300, 0, 300], dtype=np.int64), np.array([-300, 0, 300], dtype=np.int16)),
])
def test_an_observation_of_a_wider_or_other_number_dtype_is_cast_to_the_declared_one(declared, returned,
                                                                                      expected) -> None:
    low, high = (0, 255) if declared == np.uint8 else (-1000, 1000)
    converter = SpaceConverter("test env", spaces.Box(low, high, shape=(3,), dtype=declared), spaces.Discrete(2))
    obs, mask = converter.obs_and_mask(returned, call="step", where="(env 0)")
    assert obs.dtype == np.dtype(declared) and mask is None
    np.testing.assert_array_equal(obs, expected)


@pytest.mark.parametrize(("declared", "returned", "why"), [
    (np.uint8, [0, 7, 256], r"dtype int64 \(values 0 to 256, beyond uint8\); expected shape \(3,\) dtype uint8"),
    (np.uint8, [-1, 0, 1], r"dtype int64 \(values -1 to 1, beyond uint8\)"),
    (np.uint8, np.array([0.0, 1.0, 2.0]), r"dtype float64; expected shape \(3,\) dtype uint8"),  # floats stay floats
    (np.float32, np.array(["a", "b", "c"]), r"dtype <U1; expected shape \(3,\) dtype float32"),
])
def test_an_observation_that_cannot_be_cast_is_refused_saying_why(declared, returned, why: str) -> None:
    converter = SpaceConverter("test env", spaces.Box(0, 255, shape=(3,), dtype=declared), spaces.Discrete(2))
    with pytest.raises(ValueError, match=rf"^test env \(env 0\) step\(\) returned an observation with shape \(3,\) "
                                         rf"{why}"):
        converter.obs_and_mask(returned, call="step", where="(env 0)")


def test_a_float16_observation_space_is_carried_as_float32() -> None:
    """The compiled row assembler has no float16: the adapter declares float32 and casts what the env returns."""
    converter = SpaceConverter("test env", spaces.Box(-1, 1, shape=(3,), dtype=np.float16), spaces.Discrete(2))
    assert converter.spec.obs_dtype == "float32"
    obs, _ = converter.obs_and_mask(np.array([0.5, -0.25, 1.0], dtype=np.float16), call="step", where="(env 0)")
    assert obs.dtype == np.float32 and obs.tolist() == [0.5, -0.25, 1.0]


@pytest.mark.parametrize("dtype", ["float16", "complex64", "str"])
def test_an_env_spec_with_an_observation_dtype_nothing_carries_is_refused(dtype: str) -> None:
    with pytest.raises(ValueError, match=rf"^obs_dtype '{np.dtype(dtype).name}' cannot be carried; one of bool, "
                                         r"int8, .*, float32, float64 \(write float16 observations as float32\)$"):
        EnvSpec(num_agents=1, obs_shape=(3,), obs_dtype=np.dtype(dtype).name, action=ActionSpace.discrete(2))


@pytest.mark.parametrize(("raw", "value"), [(1, 1.0), (True, 1.0), (np.float32(0.5), 0.5), (np.array(-2.0), -2.0),
                                            (np.array([0.25]), 0.25), (np.array([[3]], dtype=np.int64), 3.0)])
def test_a_reward_is_a_number_or_an_array_of_one(raw, value: float) -> None:
    assert reward_value(raw, lambda: "test env (env 0) step()") == value


@pytest.mark.parametrize(("raw", "shown"), [(np.array([1.0, 2.0]), r"ndarray with shape \(2,\) dtype float64"),
                                            ("1.0", r"str with shape \(\) dtype <U3"),
                                            (None, r"NoneType with shape \(\) dtype object")])
def test_a_reward_that_is_not_one_number_is_refused_naming_the_env(raw, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^test env \(env 0\) step\(\) returned a reward of {shown}; expected a "
                                         r"number$"):
        reward_value(raw, lambda: "test env (env 0) step()")


@pytest.mark.parametrize(("where", "got", "fields"), [("reset", "ndarray", "obs, info"),
                                                      ("step", "4 values", "obs, reward, terminated, truncated, info")])
def test_an_env_of_gyms_old_api_is_named_with_what_to_do(where: str, got: str, fields: str) -> None:
    env = GymnasiumVecEnv(OLD_API_ID, 1, max_steps=0, kwargs={"where": where})
    buf = _buffers(env)
    with pytest.raises(ValueError, match=rf"^gymnasium env '{OLD_API_ID}' \(env 0\) {where}\(\) returned {got}, not "
                                         rf"\({fields}\) as Gymnasium's API has it since 0.26; an env written for "
                                         r"gym's old API needs shimmy's GymV21CompatibilityV0"):
        env.reset(buf, seed=0)
        env.step(buf)
    env.close()


def test_an_observation_dtype_nothing_carries_is_refused_naming_the_carried_ones() -> None:
    with pytest.raises(ValueError, match=r"^test env: observation space is Box\(.*\(Box\); its dtype float128 is none "
                                         r"of bool, int8, .*, float32, float64; supported:"):
        SpaceConverter("test env", spaces.Box(-1, 1, shape=(3,), dtype=np.longdouble), spaces.Discrete(2))
