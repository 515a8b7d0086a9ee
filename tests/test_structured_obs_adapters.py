"""Structured (nested Dict / Tuple) observations through the real Gymnasium, Gymnasium-vector and PettingZoo
adapters and the registry: the flat rows they write read back as what the env returned, action masks, leaf checks
naming env, index, call and leaf, env.obs_keys and its messages, per-key env.tokens, and real MiniGrid DoorKey."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium
import numpy as np
import pytest

from configs.env_config import EnvConfig
from configs.loader import load_config, resolve_config_path
from envs.adapters.gym_adapter import GymnasiumVecEnv
from envs.adapters.gym_vector_adapter import GymnasiumVectorAdapter
from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
from envs.base import StepBuffers, TokenLayout
from envs.errors import EnvConfigError
from envs.obs_layout import unflatten_obs
from envs.registry import env_spec, make_vec_env
from evaluation.check_env import describe
from policies.encoders import encoder_kind
from tests.structured_envs import EPISODE, obs_at

GYM_ID = "SluiceTest/Structured-v0"
DOORKEY = "minigrid:MiniGrid-DoorKey-8x8-v0"
LEAVES = ["cells", "flags", "grid", "pos.0", "pos.1"]


@pytest.fixture(scope="module", autouse=True)
def _registered() -> Iterator[None]:
    gymnasium.register(id=GYM_ID, entry_point="tests.structured_envs:StructuredEnv", disable_env_checker=True)
    yield
    del gymnasium.registry[GYM_ID]


def expected(seed: int, t: int) -> dict:
    """What the flat row reads back as: the env's observation without its action mask."""
    obs = obs_at(seed, t)
    return {key: obs[key] for key in ("cells", "flags", "grid", "pos")}


def assert_reads_back(row: np.ndarray, leaves, want: dict) -> None:
    got = unflatten_obs(row, leaves)
    assert list(got) == list(want)
    for key in want:
        for a, b in zip(np.atleast_1d(got[key]) if key != "pos" else got[key],
                        np.atleast_1d(want[key]) if key != "pos" else want[key]):
            np.testing.assert_array_equal(a, b)


def test_gymnasium_adapter_writes_every_leaf_and_the_mask() -> None:
    env = GymnasiumVecEnv(GYM_ID, 2, max_steps=0, kwargs={})
    spec = env.spec
    assert [leaf.name for leaf in spec.obs_leaves] == LEAVES and spec.action_mask
    assert spec.obs_dtype == "float32" and spec.obs_shape == (12 + 4 + 50 + 1 + 2,)  # pos.1 is a float Box
    buf = StepBuffers.allocate(spec, 2)
    env.reset(buf, seed=10)
    for t in range(EPISODE + 2):
        for i in range(2):
            step = t % EPISODE  # auto-reset (unseeded: seed + 1000) after EPISODE steps
            seed = 10 + i + (1000 if t >= EPISODE else 0)
            assert_reads_back(buf.obs[i], spec.obs_leaves, expected(seed, step))
            np.testing.assert_array_equal(buf.action_mask[i], obs_at(seed, step)["action_mask"])
        buf.actions[:] = np.flatnonzero(buf.action_mask[0])[0]
        env.step(buf)
    env.close()


def test_vector_adapter_flattens_the_whole_batch() -> None:
    env = GymnasiumVectorAdapter("tests.structured_envs:make_vec", 3, max_steps=0, kwargs={})
    buf = StepBuffers.allocate(env.spec, 3)
    env.reset(buf, seed=5)
    for t in range(3):
        for i in range(3):
            assert_reads_back(buf.obs[i], env.spec.obs_leaves, expected(5 + i, t))
            np.testing.assert_array_equal(buf.action_mask[i], obs_at(5 + i, t)["action_mask"])
        buf.actions[:] = np.flatnonzero(buf.action_mask[0])[0]
        env.step(buf)
    env.close()


def test_pettingzoo_adapter_flattens_each_agent() -> None:
    env = PettingZooParallelAdapter("tests.structured_envs:StructuredParallelEnv", 2, max_steps=0, kwargs={})
    assert [leaf.name for leaf in env.spec.obs_leaves] == LEAVES and env.spec.num_agents == 2
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=3)
    for slot, seed in enumerate((3, 4, 4, 5)):  # env e agent j: seed + e + j
        assert_reads_back(buf.obs[slot], env.spec.obs_leaves, expected(seed, 0))
    buf.actions[:] = 1
    env.step(buf)
    assert_reads_back(buf.obs[3], env.spec.obs_leaves, expected(5, 1))
    env.close()


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GymnasiumVecEnv(GYM_ID, 2, max_steps=0, kwargs={"bad": "pos.0", "bad_at": 1}),
     r"^gymnasium env 'SluiceTest/Structured-v0' \(env 0\) step\(\) returned leaf 'pos.0' with dtype int64 holds 7, "
     r"outside \[1, 7\) \(discrete int64\)$"),
    (lambda: GymnasiumVectorAdapter("tests.structured_envs:make_vec", 2, max_steps=0,
                                    kwargs={"bad": "pos.0", "bad_at": 1}),
     r"^gymnasium_vector env 'tests.structured_envs:make_vec' \(all 2 envs\) step\(\) returned leaf 'pos.0' with "
     r"dtype int64 holds 7 at index \[0\], outside \[1, 7\) \(discrete int64\)$"),
    (lambda: PettingZooParallelAdapter("tests.structured_envs:StructuredParallelEnv", 1, max_steps=0,
                                       kwargs={"bad": "grid"}),
     r"^pettingzoo env 'tests.structured_envs:StructuredParallelEnv' \(env 0, agent 'b'\) step\(\) returned leaf "
     r"'grid' with shape \(5, 5, 1\)"),
])
def test_a_bad_leaf_names_the_env_the_index_the_call_and_the_leaf(make, message: str) -> None:
    env = make()
    buf = StepBuffers.allocate(env.spec, env.num_envs)
    env.reset(buf, seed=0)
    buf.actions[:] = 1
    try:
        with pytest.raises(EnvConfigError, match=message):
            env.step(buf)
    finally:
        env.close()


def test_obs_keys_keep_some_keys_and_the_mask_stays_a_mask() -> None:
    spec = env_spec(EnvConfig(name="gymnasium", gym_id=GYM_ID, max_steps=0, obs_keys=["pos", "grid"]))
    assert [leaf.name for leaf in spec.obs_leaves] == ["grid", "pos.0", "pos.1"] and spec.action_mask


def test_an_unknown_obs_key_is_named_with_the_keys_the_env_has() -> None:
    with pytest.raises(EnvConfigError, match=r"^env.obs_keys: key 'position' is not in the observation of gymnasium "
                                             r"env 'SluiceTest/Structured-v0'; its keys are cells, flags, grid, pos "
                                             r"\(action_mask is always the action mask\)$"):
        env_spec(EnvConfig(name="gymnasium", gym_id=GYM_ID, max_steps=0, obs_keys=["grid", "position"]))


def test_obs_keys_on_a_box_observation_or_a_built_in_env_are_refused() -> None:
    with pytest.raises(EnvConfigError, match=r"env.obs_keys \['x'\]: gymnasium env 'CartPole-v1' has a Box "
                                             r"observation space, not a Dict, so it has no keys to keep"):
        env_spec(EnvConfig(name="gymnasium", gym_id="CartPole-v1", obs_keys=["x"]))
    with pytest.raises(EnvConfigError, match=r"the built-in env 'cartpole' declares its own observations: drop "
                                             r"env.obs_keys"):
        env_spec(EnvConfig(name="cartpole", obs_keys=["x"]))


def test_per_key_tokens_declare_a_token_leaf() -> None:
    config = load_config(None, ["env.name=gymnasium", f"env.gym_id={GYM_ID}", "env.max_steps=0",
                                "env.tokens.cells.num_locations=5", "env.tokens.cells.num_features=2",
                                "env.tokens.cells.pad_value=255"])
    env = make_vec_env(config.env, 1)
    try:
        cells = {leaf.name: leaf for leaf in env.spec.obs_leaves}["cells"]
        assert cells.tokens == TokenLayout(num_locations=5, num_features=2, pad_value=255)
        assert encoder_kind(env.spec, config.model) == "leaves"
    finally:
        env.close()
    with pytest.raises(EnvConfigError, match=r"env.tokens.grid: env 'gymnasium:SluiceTest/Structured-v0': leaf 'grid': "
                                             r"token observations must have shape \[L, 3\]"):
        env_spec(EnvConfig(name="gymnasium", gym_id=GYM_ID, max_steps=0,
                           tokens={"grid": {"num_locations": 5, "num_features": 2, "pad_value": 255}}))
    with pytest.raises(EnvConfigError, match=r"env.tokens.cels: env 'gymnasium:SluiceTest/Structured-v0' has no "
                                             r"top-level observation leaf 'cels'; its top-level leaves: cells, flags, "
                                             r"grid"):
        env_spec(EnvConfig(name="gymnasium", gym_id=GYM_ID, max_steps=0,
                           tokens={"cels": {"num_locations": 5, "num_features": 2, "pad_value": 255}}))


def test_minigrid_text_mission_must_be_left_out() -> None:
    with pytest.raises(EnvConfigError, match=r"^env.obs_keys: gymnasium env 'minigrid:MiniGrid-DoorKey-8x8-v0': leaf "
                                             r"'mission' is a MissionSpace space, which Sluice cannot carry \(it "
                                             r"carries Box, Discrete, MultiDiscrete and MultiBinary leaves\); leave "
                                             r"it out with env.obs_keys: \[direction, image\]$"):
        env_spec(EnvConfig(name="gymnasium", gym_id=DOORKEY, max_steps=0))


def test_minigrid_doorkey_config_steps_real_minigrid() -> None:
    config = load_config(resolve_config_path("minigrid_doorkey"))
    assert config.env.obs_keys == ["direction", "image"]
    env = make_vec_env(config.env, 2)
    spec = env.spec
    assert [(leaf.name, leaf.kind, leaf.shape) for leaf in spec.obs_leaves] == [
        ("direction", "discrete", ()), ("image", "box", (7, 7, 3))]
    assert spec.obs_shape == (148,) and spec.obs_dtype == "uint8" and spec.obs_leaves[1].image_layout == "hwc"
    reference = gymnasium.make(DOORKEY)
    first, _ = reference.reset(seed=7)
    buf = StepBuffers.allocate(spec, 2)
    try:
        env.reset(buf, seed=7)
        got = unflatten_obs(buf.obs[0], spec.obs_leaves)
        np.testing.assert_array_equal(got["image"], first["image"])
        assert got["direction"] == first["direction"]
        rng = np.random.default_rng(0)
        for _ in range(20):
            buf.actions[:] = rng.integers(0, 7, size=2)
            env.step(buf)
        assert set(np.unique(buf.obs[:, 0])) <= {0, 1, 2, 3}
    finally:
        env.close()
        reference.close()


def test_check_env_describes_the_leaves_and_their_encoders() -> None:
    config = load_config(resolve_config_path("minigrid_doorkey"))
    lines = describe(config, env_spec(config.env))
    assert "observation: shape [148] uint8, structured: 2 leaves carried flat" in lines
    assert "encoder (model.encoder auto): leaves" in lines
    assert "  leaf direction: discrete [] int64 of [4] values -> embedding (16 features)" in lines
    assert "  leaf image: box [7, 7, 3] uint8 hwc -> cnn (64 features)" in lines
