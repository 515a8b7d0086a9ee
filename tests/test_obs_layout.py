"""envs.obs_layout: structured observations flattened into one buffer and read back bit for bit, the flat dtype
rule, the leaf checks and their messages, and EnvSpec's checks of declared leaves."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.adapters.gym_leaves import leaves_of
from envs.base import EnvSpec, ObsLeaf, TokenLayout
from envs.errors import EnvConfigError
from envs.obs_layout import ObsFlattener, flatten_obs, random_flat_obs, structured_obs, unflatten_obs
from envs.spaces import ActionSpace

ACTION = ActionSpace.discrete(3)


def leaf_spaces(uint8_only: bool) -> st.SearchStrategy[spaces.Space]:
    """Leaf spaces whose samples the flat buffer holds exactly (uint8 ones only, or any)."""
    shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
    uint8 = [shapes.map(lambda s: spaces.Box(0, 255, s, np.uint8)),
             st.tuples(st.integers(1, 256), st.integers(-3, 3)).map(lambda a: spaces.Discrete(a[0], start=a[1])),
             st.lists(st.integers(1, 256), min_size=1, max_size=4).map(spaces.MultiDiscrete),
             st.integers(1, 5).map(spaces.MultiBinary)]
    wide = [shapes.map(lambda s: spaces.Box(-2.0, 2.0, s, np.float32)),
            shapes.map(lambda s: spaces.Box(-1000, 1000, s, np.int32)),
            st.integers(257, 70000).map(spaces.Discrete),
            st.lists(st.integers(1, 5000), min_size=1, max_size=3).map(
                lambda v: spaces.MultiDiscrete(v, start=[-7] * len(v)))]
    return st.one_of(uint8 if uint8_only else uint8 + wide)


def structured_spaces(uint8_only: bool) -> st.SearchStrategy[spaces.Space]:
    """Nested Dict / Tuple spaces (depth <= 3) of those leaves."""
    names = st.text("abcdefgh_", min_size=1, max_size=6)
    return st.recursive(
        leaf_spaces(uint8_only),
        lambda inner: st.one_of(st.lists(inner, min_size=1, max_size=3).map(lambda items: spaces.Tuple(items)),
                                st.dictionaries(names, inner, min_size=1, max_size=3).map(spaces.Dict)),
        max_leaves=6).filter(lambda space: isinstance(space, (spaces.Dict, spaces.Tuple)))


def spec_of(space: spaces.Space) -> EnvSpec:
    return EnvSpec(num_agents=1, action=ACTION, **structured_obs(leaves_of("test env", space)))


def assert_same(a, b) -> None:
    """Two nested structures with the same containers, and arrays equal in value, dtype and shape."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=60, deadline=None)
@given(space=st.one_of(structured_spaces(True), structured_spaces(False)), seed=st.integers(0, 2 ** 31))
def test_round_trip_is_bit_for_bit(space: spaces.Space, seed: int) -> None:
    space.seed(seed)
    spec = spec_of(space)
    uint8 = all(isinstance(s, (spaces.MultiBinary, spaces.Discrete, spaces.MultiDiscrete)) and
                (not hasattr(s, "nvec") or int(np.max(s.nvec)) <= 256) and (not hasattr(s, "n") or int(s.n) <= 256)
                or (isinstance(s, spaces.Box) and s.dtype == np.uint8) for s in _leaf_spaces(space))
    assert spec.obs_dtype == ("uint8" if uint8 else "float32")
    samples = [space.sample() for _ in range(4)]
    flat = np.stack([flatten_obs(sample, spec) for sample in samples])
    assert flat.shape == (4, *spec.obs_shape)
    for row, sample in zip(flat, samples):
        assert_same(unflatten_obs(row, spec.obs_leaves), sample)
    batch = unflatten_obs(flat, spec.obs_leaves)  # a batch read back, then flattened at once (a vector env)
    np.testing.assert_array_equal(ObsFlattener(spec).flatten(batch, lead=(4,)), flat)


def _leaf_spaces(space: spaces.Space) -> list[spaces.Space]:
    if isinstance(space, spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaf_spaces(sub)]
    if isinstance(space, spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaf_spaces(sub)]
    return [space]


NESTED = spaces.Dict({"image": spaces.Box(0, 255, (4, 4, 3), np.uint8), "direction": spaces.Discrete(4),
                      "inner": spaces.Tuple((spaces.MultiDiscrete([3, 5]), spaces.Box(-1.0, 1.0, (2,), np.float32)))})


def test_leaves_are_named_by_path_and_laid_out_in_the_spaces_order() -> None:
    spec = spec_of(NESTED)
    assert [(leaf.name, leaf.kind, leaf.shape, leaf.offset, leaf.size) for leaf in spec.obs_leaves] == [
        ("direction", "discrete", (), 0, 1), ("image", "box", (4, 4, 3), 1, 48),
        ("inner.0", "multi_discrete", (2,), 49, 2), ("inner.1", "box", (2,), 51, 2)]
    assert spec.obs_shape == (53,) and spec.obs_dtype == "float32"
    assert spec.obs_leaves[1].image_layout == "hwc"


def test_discrete_values_are_stored_less_their_start() -> None:
    spec = spec_of(spaces.Dict({"d": spaces.Discrete(3, start=-1), "m": spaces.MultiDiscrete([2, 4], start=[5, 1])}))
    flat = flatten_obs({"d": np.int64(1), "m": np.array([6, 4])}, spec)
    np.testing.assert_array_equal(flat, [2, 1, 3])
    assert_same(unflatten_obs(flat, spec.obs_leaves), {"d": np.int64(1), "m": np.array([6, 4])})


GOOD = {"image": np.zeros((4, 4, 3), np.uint8), "direction": 2,
        "inner": (np.array([2, 4]), np.zeros(2, np.float32))}


@pytest.mark.parametrize(("change", "message"), [
    ({"direction": 4}, r"^env e \(env 1\) step\(\) returned leaf 'direction' with dtype int64 holds 4, outside "
                       r"\[0, 4\) \(discrete int64\)$"),
    ({"image": np.zeros((4, 4), np.uint8)}, r"leaf 'image' with shape \(4, 4\) dtype uint8; expected shape "
                                            r"\(4, 4, 3\) of integers \(box uint8\)"),
    ({"image": np.zeros((4, 4, 3), np.float32)}, r"leaf 'image' with shape \(4, 4, 3\) dtype float32; expected "
                                                 r"shape \(4, 4, 3\) of integers"),
    ({"image": np.full((4, 4, 3), 300, np.int64)}, r"leaf 'image' with dtype int64 holds 300 at index \[0, 0, 0\], "
                                                   r"outside \[0, 255\]"),
    ({"inner": (np.array([2, 5]), np.zeros(2, np.float32))}, r"leaf 'inner.0' with dtype int64 holds 5 at index "
                                                             r"\[1\], outside \[start\[i\], start\[i\] \+ nvec\[i\]\)"),
    ({"inner": (np.array([2, 4]), np.array([0.0, np.nan], np.float32))}, r"leaf 'inner.1' holds a non-finite "
                                                                         r"value nan at index \[1\]"),
    ({"inner": (np.array([2, 4]),)}, r"an observation without item 1 at inner \(for leaf 'inner.1'\); it has 1 items"),
    ({"direction": None}, r"leaf 'direction' with shape \(\) dtype object; expected shape \(\) of integers"),
])
def test_a_bad_leaf_is_refused_naming_the_env_the_call_and_the_leaf(change: dict, message: str) -> None:
    spec = spec_of(NESTED)
    with pytest.raises(EnvConfigError, match=message):
        flatten_obs({**GOOD, **change}, spec, where="env e (env 1) step() returned")


def test_a_missing_key_is_named_with_the_keys_there_are() -> None:
    with pytest.raises(EnvConfigError, match=r"an observation without key 'direction' at the top \(for leaf "
                                             r"'direction'\); it has \['image', 'inner'\]"):
        flatten_obs({key: value for key, value in GOOD.items() if key != "direction"}, spec_of(NESTED))


def test_integers_past_float32_are_refused() -> None:
    with pytest.raises(EnvConfigError, match=r"observation leaf 'big' is an integer Box \(int64\) with bounds "
                                             r"\[0, 100000000\]: integers beyond \+-2\*\*24 are not exact"):
        spec_of(spaces.Dict({"big": spaces.Box(0, 10 ** 8, (2,), np.int64)}))
    with pytest.raises(EnvConfigError, match=r"observation leaf 'huge' has 20000000 values, more than float32 holds "
                                             r"exactly"):
        spec_of(spaces.Dict({"huge": spaces.Discrete(20_000_000)}))
    spec = spec_of(spaces.Dict({"n": spaces.Box(-5, 5, (1,), np.int32), "x": spaces.Box(0, 1, (1,), np.float32)}))
    with pytest.raises(EnvConfigError, match=r"leaf 'n' with dtype int64 holds 16777217 at index \[0\], outside "
                                             r"\[-16777216, 16777216\]"):
        flatten_obs({"n": np.array([2 ** 24 + 1]), "x": np.zeros(1, np.float32)}, spec)


def test_declared_leaves_are_checked_by_the_spec() -> None:
    image = ObsLeaf(path=("image",), kind="box", shape=(7, 7, 3), dtype="uint8", image_layout="hwc")
    with pytest.raises(EnvConfigError, match=r"observation leaf 'pos' \(box float32\) is not exact in a uint8 flat "
                                             r"obs; use obs_dtype float32"):
        EnvSpec(num_agents=1, action=ACTION, obs_shape=(149,), obs_dtype="uint8",
                obs_leaves=(image, ObsLeaf(path=("pos",), kind="box", shape=(2,), dtype="float32", offset=147)))
    with pytest.raises(EnvConfigError, match=r"observation leaf 'direction' at \[100, 101\) overlaps another leaf"):
        EnvSpec(num_agents=1, action=ACTION, obs_shape=(148,), obs_dtype="uint8",
                obs_leaves=(image, ObsLeaf(path=("direction",), kind="discrete", nvec=(4,), offset=100)))
    with pytest.raises(EnvConfigError, match=r"observation leaf 'd': nvec must hold 1 counts >= 1"):
        ObsLeaf(path=("d",), kind="discrete")
    with pytest.raises(EnvConfigError, match=r"token observations must have shape \[L, 3\]"):
        ObsLeaf(path=("t",), kind="box", shape=(4, 2), dtype="uint8",
                tokens=TokenLayout(num_locations=4, num_features=2, pad_value=255))


def test_random_flat_observations_are_valid_leaf_by_leaf() -> None:
    spec = spec_of(NESTED)
    obs = random_flat_obs(spec, 16, np.random.default_rng(0))
    ObsFlattener(spec).flatten(unflatten_obs(obs, spec.obs_leaves), lead=(16,))  # every leaf passes its checks
