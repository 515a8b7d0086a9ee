"""EnvSpec.image_layout: its validation, what the built-in envs and the Gymnasium / PettingZoo adapters declare, and
the cnn encoder reading a channels-last (hwc) image exactly as the channels-first one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.builtin.connect_four.game import ConnectFourVec
from envs.errors import EnvConfigError
from envs.builtin.gridworld import GridworldVec
from envs.adapters.gym_adapter import GymnasiumVecEnv
from envs.adapters.gym_spaces import image_layout_of, spec_from_spaces
from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
from envs.spaces import ActionSpace
from policies.encoders import CNNEncoder, encoder_kind, make_encoder
from policies.factory import make_policy
from tests.fake_envs import StaggeredParallelEnv

HWC_ID = "SluiceTest/HwcImage-v0"
IMAGE_HWC = (12, 10, 3)
MODEL = ModelSection(hidden_size=8, num_layers=1, cnn_channels=[4, 5])


class HwcImageEnv(gymnasium.Env):
    """A Gymnasium env with a channels-last uint8 image observation, as Gymnasium's image envs write them."""

    observation_space = spaces.Box(0, 255, shape=IMAGE_HWC, dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


class ImageParallelEnv(StaggeredParallelEnv):
    """The staggered PettingZoo env with a uint8 image observation of ``shape``."""

    def __init__(self, shape: list[int]) -> None:
        super().__init__()
        self._obs_space = spaces.Box(0, 255, shape=tuple(shape), dtype=np.uint8)

    def _obs(self, agent: str) -> Any:
        return np.zeros(self._obs_space.shape, dtype=np.uint8)


@pytest.fixture(scope="module", autouse=True)
def _registered_env() -> Iterator[None]:
    gymnasium.register(id=HWC_ID, entry_point=HwcImageEnv, disable_env_checker=True)
    yield
    del gymnasium.registry[HWC_ID]


def image_spec(shape: tuple[int, ...], layout: str) -> EnvSpec:
    return EnvSpec(num_agents=1, obs_shape=shape, obs_dtype="uint8", action=ActionSpace.discrete(3),
                   image_layout=layout)


# --- the spec's declaration ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "layout", "message"), [
    ((3, 4, 5), "CHW", r"image_layout must be one of 'chw', 'hwc' or ''.*got 'CHW'"),
    ((3, 4, 5), "nchw", "got 'nchw'"),
    ((12,), "chw", r"image_layout 'chw' needs a rank-3 obs_shape, got \(12,\)"),
    ((2, 3, 4, 5), "hwc", "needs a rank-3 obs_shape"),
])
def test_env_spec_validates_its_image_layout(shape: tuple[int, ...], layout: str, message: str) -> None:
    with pytest.raises(EnvConfigError, match=message):
        image_spec(shape, layout)


def test_built_in_grids_declare_channels_first() -> None:
    assert GridworldVec.spec_for(3, 11, 11).image_layout == "chw"
    assert ConnectFourVec.SPEC.image_layout == "chw"


@pytest.mark.parametrize(("shape", "layout"), [
    ((210, 160, 3), "hwc"), ((84, 84, 4), "hwc"), ((5, 5, 1), "hwc"), ((3, 3, 3), "hwc"),  # last axis wins a tie
    ((3, 5, 5), "chw"), ((4, 84, 84), "chw"), ((6, 11, 11), ""), ((4,), ""), ((16, 3), ""), ((2, 2, 2, 2), ""),
])
def test_adapters_read_the_image_convention(shape: tuple[int, ...], layout: str) -> None:
    assert image_layout_of(shape) == layout
    box = spaces.Box(0, 255, shape=shape, dtype=np.uint8)
    assert spec_from_spaces("test", box, spaces.Discrete(2)).image_layout == layout
    masked = spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(2)})
    assert spec_from_spaces("test", masked, spaces.Discrete(2)).image_layout == layout


def test_gymnasium_adapter_declares_hwc_and_auto_picks_cnn() -> None:
    env = GymnasiumVecEnv(HWC_ID, 2, max_steps=0, kwargs={})
    try:
        assert env.spec.obs_shape == IMAGE_HWC and env.spec.image_layout == "hwc"
        assert encoder_kind(env.spec, ModelSection()) == "cnn"
        encoder = make_encoder(env.spec, MODEL)
        assert isinstance(encoder, CNNEncoder) and encoder.conv_output_shape == (5, 8, 6)  # 12x10 -> 10x8 -> 8x6
    finally:
        env.close()


@pytest.mark.parametrize(("shape", "layout"), [((12, 10, 3), "hwc"), ((2, 7, 9), "chw"), ((6, 7, 9), "")])
def test_pettingzoo_adapter_declares_the_layout(shape: tuple[int, ...], layout: str) -> None:
    env = PettingZooParallelAdapter("tests.test_image_layout:ImageParallelEnv", 1, max_steps=0,
                                    kwargs={"shape": list(shape)})
    try:
        assert env.spec.obs_shape == shape and env.spec.image_layout == layout
    finally:
        env.close()


# --- the cnn reads hwc as the transposed chw ----------------------------------------------------------------------

@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_hwc_cnn_equals_the_chw_cnn_on_the_transposed_input(core: str) -> None:
    hwc = GymnasiumVecEnv(HWC_ID, 1, max_steps=0, kwargs={})
    hwc_spec = hwc.spec
    hwc.close()
    height, width, channels = IMAGE_HWC
    chw_spec = replace(hwc_spec, obs_shape=(channels, height, width), image_layout="chw")
    model = replace(MODEL, core=core)
    torch.manual_seed(0)
    hwc_policy, chw_policy = make_policy(hwc_spec, model), make_policy(chw_spec, model)
    assert list(hwc_policy.state_dict()) == list(chw_policy.state_dict())
    chw_policy.load_state_dict(hwc_policy.state_dict())  # the same weights: the conv stack is one and the same
    obs = np.random.default_rng(1).integers(0, 256, size=(4, *IMAGE_HWC), dtype=np.uint8)
    transposed = np.ascontiguousarray(obs.transpose(0, 3, 1, 2))
    state = torch.zeros(4, hwc_policy.state_size)
    with torch.no_grad():
        got = hwc_policy.step(torch.from_numpy(obs), state)
        want = chw_policy.step(torch.from_numpy(transposed), state)
        assert not torch.allclose(chw_policy.step(torch.from_numpy(np.ascontiguousarray(  # the layout matters
            obs.reshape(4, channels, height, width))), state)[0], want[0])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
