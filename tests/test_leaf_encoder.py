"""policies.leaf_encoder: one encoder per leaf of a structured observation, on slices of the flat row. Shapes per
leaf, bytes outside the leaves and token padding never reaching the features, damaged discrete values clamped, MLP
and LSTM policies on a Dict spec, obs_norm on the Box leaves, the config errors, and export of such a policy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from configs.loader import ConfigError, load_config
from configs.schema import ModelSection
from envs.adapters.gym_leaves import leaves_of
from envs.base import EnvSpec, ObsLeaf, TokenLayout
from envs.obs_layout import random_flat_obs, structured_obs
from envs.spaces import ActionSpace
from evaluation.export import export_policy, random_inputs
from evaluation.load_policy import LoadedPolicy
from policies.encoders import CNNEncoder, TokenEncoder, encoder_kind, make_encoder
from policies.factory import make_policy
from policies.layers import ObsInput
from policies.leaf_encoder import EMBEDDING_WIDTH, BinaryLeaf, DictEncoder, EmbeddingLeaf
from policies.obs_normalization import update_obs_normalizer

MODEL = ModelSection(hidden_size=32, cnn_channels=[8, 8])
TOKENS = TokenLayout(num_locations=6, num_features=3, pad_value=255)
LEAVES = [ObsLeaf(path=("image",), kind="box", shape=(5, 5, 3), dtype="uint8", image_layout="hwc"),
          ObsLeaf(path=("direction",), kind="discrete", nvec=(4,)),
          ObsLeaf(path=("cells",), kind="box", shape=(4, 3), dtype="uint8", tokens=TOKENS),
          ObsLeaf(path=("extra", 0), kind="multi_discrete", shape=(2,), nvec=(3, 5)),
          ObsLeaf(path=("extra", 1), kind="multi_binary", shape=(3,), dtype="int8"),
          ObsLeaf(path=("vec",), kind="box", shape=(2,), dtype="uint8")]
SPEC = EnvSpec(num_agents=1, action=ActionSpace.discrete(3), **structured_obs(LEAVES))
GAP = 7
"""Unused values left before every leaf of ``GAPPED``."""


def gapped_spec() -> EnvSpec:
    """SPEC's leaves with GAP unused values before each (a native env may lay its row out so)."""
    laid, offset = [], 0
    for leaf in LEAVES:
        laid.append(replace(leaf, offset=offset + GAP))
        offset += GAP + leaf.size
    return EnvSpec(num_agents=1, action=ActionSpace.discrete(3), obs_shape=(offset,), obs_dtype="uint8",
                   obs_leaves=tuple(laid))


def test_auto_builds_one_encoder_per_leaf_and_concatenates_them() -> None:
    assert SPEC.obs_dtype == "uint8" and encoder_kind(SPEC, MODEL) == "leaves"
    encoder = make_encoder(SPEC, MODEL)
    assert isinstance(encoder, DictEncoder)
    assert [type(e) for e in encoder.encoders] == [CNNEncoder, EmbeddingLeaf, TokenEncoder, EmbeddingLeaf,
                                                   BinaryLeaf, ObsInput]
    assert encoder.kinds == ["cnn", "embedding", "tokens", "embedding", "binary", "mlp"]
    widths = [32, EMBEDDING_WIDTH, 32, 2 * EMBEDDING_WIDTH, 3, 2]
    assert [e.out_features for e in encoder.encoders] == widths and encoder.out_features == sum(widths)
    obs = torch.from_numpy(random_flat_obs(SPEC, 6, np.random.default_rng(0))).reshape(2, 3, -1)
    assert encoder(obs).shape == (2, 3, sum(widths))  # any leading dims
    assert encoder.describe()[1] == "leaf direction: discrete [] int64 of [4] values -> embedding (16 features)"


def test_bytes_outside_the_leaves_and_token_padding_do_not_leak() -> None:
    spec = gapped_spec()
    torch.manual_seed(0)
    encoder = make_encoder(spec, MODEL)
    torch.manual_seed(0)
    packed = make_encoder(SPEC, MODEL)
    dense = random_flat_obs(SPEC, 8, np.random.default_rng(1))
    obs = np.zeros((8, *spec.obs_shape), np.uint8)
    for leaf, dense_leaf in zip(spec.obs_leaves, SPEC.obs_leaves):
        obs[:, leaf.offset:leaf.offset + leaf.size] = dense[:, dense_leaf.offset:dense_leaf.offset + leaf.size]
    noisy = obs.copy()
    used = np.zeros(spec.obs_shape[0], bool)
    for leaf in spec.obs_leaves:
        used[leaf.offset:leaf.offset + leaf.size] = True
    noisy[:, ~used] = np.random.default_rng(2).integers(0, 256, size=(8, int((~used).sum())))
    cells = {leaf.name: leaf for leaf in spec.obs_leaves}["cells"]
    rows = noisy[:, cells.offset:cells.offset + cells.size].reshape(8, 4, 3)
    rows[..., 1:] = np.where(rows[..., :1] == TOKENS.pad_value, 2, rows[..., 1:])  # padding rows' other columns
    noisy[:, cells.offset:cells.offset + cells.size] = rows.reshape(8, -1)
    with torch.no_grad():
        quiet = encoder(torch.from_numpy(obs))
        torch.testing.assert_close(encoder(torch.from_numpy(noisy)), quiet, rtol=0, atol=0)
        # the same weights on the same leaves laid out without gaps: the same features
        torch.testing.assert_close(packed(torch.from_numpy(dense)), quiet, rtol=0, atol=0)


def test_damaged_discrete_values_are_clamped_not_indexed_out_of_range() -> None:
    encoder = make_encoder(SPEC, MODEL)
    obs = torch.from_numpy(random_flat_obs(SPEC, 2, np.random.default_rng(0)))
    direction = SPEC.obs_leaves[1]
    obs[:, direction.offset] = torch.tensor([200, 3], dtype=torch.uint8)  # a row no env wrote (Discrete(4))
    with torch.no_grad():
        features = encoder(obs)
        clamped = obs.clone()
        clamped[0, direction.offset] = 3
        torch.testing.assert_close(features, encoder(clamped))


def test_a_float32_row_reads_uint8_leaves_as_bytes() -> None:
    leaves = [ObsLeaf(path=("vec",), kind="box", shape=(2,), dtype="uint8"),
              ObsLeaf(path=("pos",), kind="box", shape=(1,), dtype="float32")]
    spec = EnvSpec(num_agents=1, action=ActionSpace.discrete(2), **structured_obs(leaves))
    assert spec.obs_dtype == "float32"
    encoder = make_encoder(spec, MODEL)
    features = encoder(torch.tensor([[255.0, 51.0, -2.5]]))
    torch.testing.assert_close(features, torch.tensor([[1.0, 0.2, -2.5]]))


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_mlp_and_lstm_policies_act_and_train_on_rows(core: str) -> None:
    model = replace(MODEL, core=core)
    policy = make_policy(SPEC, model)
    obs = torch.from_numpy(random_flat_obs(SPEC, 4 * 5, np.random.default_rng(3))).reshape(4, 5, -1)
    params, values = policy.forward_rows(obs, torch.zeros(4, 5), torch.zeros(4, policy.state_size))
    assert params.shape == (4, 5, 3) and values.shape == (4, 5)
    (params.sum() + values.sum()).backward()
    embedding = policy.encoder.encoders[1].embedding.weight
    assert embedding.grad is not None and embedding.grad.abs().sum() > 0
    logits, step_values, state = policy.step(obs[:, 0], torch.zeros(4, policy.state_size))
    assert logits.shape == (4, 3) and step_values.shape == (4,) and state.shape == (4, policy.state_size)


def test_obs_norm_normalises_the_box_leaves_that_are_not_tokens() -> None:
    policy = make_policy(SPEC, replace(MODEL, obs_norm=True))
    encoder = policy.encoder
    assert [e.obs_norm is not None for e in encoder.encoders] == [True, False, False, False, False, True]
    names = [name for name in policy.state_dict() if "obs_norm" in name]
    assert names and all(name.startswith(("encoder.encoders.0.", "encoder.encoders.5.")) for name in names)
    obs = torch.from_numpy(random_flat_obs(SPEC, 64, np.random.default_rng(4)))
    update_obs_normalizer(policy, obs)
    assert encoder.encoders[0].obs_norm.stats.count > 1 and encoder.encoders[5].obs_norm.stats.count > 1
    discrete_only = EnvSpec(num_agents=1, action=ActionSpace.discrete(2),
                            **structured_obs([ObsLeaf(path=("d",), kind="discrete", nvec=(4,))]))
    with pytest.raises(ConfigError, match=r"model.obs_norm: true normalises an env's Box leaves \(not token lists\), "
                                          r"and this env's structured observation has none \(leaves d \(discrete\)\); "
                                          r"allowed: false"):
        make_policy(discrete_only, replace(MODEL, obs_norm=True))


def test_encoders_that_read_one_array_are_refused_and_mlp_flattens_the_row() -> None:
    for choice in ("cnn", "tokens"):
        with pytest.raises(ConfigError, match=rf"model.encoder: '{choice}' reads one image or token list, but the "
                                              rf"env's observation is structured \(leaves image, direction, cells, "
                                              rf"extra.0, extra.1, vec\); allowed here: auto"):
            make_encoder(SPEC, replace(MODEL, encoder=choice))
    flat = make_encoder(SPEC, replace(MODEL, encoder="mlp"))
    assert isinstance(flat, ObsInput) and flat.out_features == SPEC.obs_shape[0]


def test_a_gymnasium_dict_spec_builds_its_policy() -> None:
    space = spaces.Dict({"direction": spaces.Discrete(4), "image": spaces.Box(0, 255, (7, 7, 3), np.uint8)})
    spec = EnvSpec(num_agents=1, action=ActionSpace.discrete(7), **structured_obs(leaves_of("minigrid-like", space)))
    policy = make_policy(spec, load_config(None, ["model.obs_norm=true"]).model)
    assert policy.encoder.kinds == ["embedding", "cnn"]


@pytest.mark.parametrize(("fmt", "core"), [("torchscript", "mlp"), ("onnx", "lstm")])
def test_export_of_a_structured_policy_acts_as_the_policy(tmp_path: Path, fmt: str, core: str) -> None:
    config = load_config(None, [f"model.core={core}", "model.hidden_size=32", "model.cnn_channels=[8, 8]"])
    policy = make_policy(SPEC, config.model).eval()
    inputs = random_inputs(SPEC, policy.state_size, 5, np.random.default_rng(0))
    assert inputs["obs"].dtype == np.uint8 and inputs["obs"].shape == (5, *SPEC.obs_shape)
    result = export_policy(LoadedPolicy(policy=policy, spec=SPEC, config=config, update=1), fmt, tmp_path / "p")
    sidecar = json.loads(result.sidecar.read_text())
    assert [leaf["name"] for leaf in sidecar["observation_leaves"]] == [leaf.name for leaf in SPEC.obs_leaves]
    assert sidecar["source"]["encoder"] == "leaves"
