"""The replay buffer (learner/coma/replay_buffer.py): wrap-around keeps exactly the newest transitions in order, sampling is
uniform (chi-square goodness of fit), the state dict round-trips through safetensors, dtypes are kept, and wrong
input is refused with the field named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from learner.coma.replay_buffer import ReplayBuffer

FIELDS = {"obs": ((2, 3), np.uint8), "action": ((2,), np.float32), "reward": ((), np.float32),
          "terminated": ((), np.bool_)}


def transitions(start: int, count: int) -> dict[str, np.ndarray]:
    """Transitions numbered start .. start + count - 1; every field encodes its number."""
    ids = np.arange(start, start + count)
    return {"obs": np.broadcast_to((ids % 256).astype(np.uint8)[:, None, None], (count, 2, 3)).copy(),
            "action": np.stack([ids, -ids], axis=1).astype(np.float32),
            "reward": ids.astype(np.float32), "terminated": ids % 2 == 0}


def stored_ids(buffer: ReplayBuffer) -> list[int]:
    """The transition numbers held, oldest first (through the state dict)."""
    return buffer.state_dict()["field.reward"].astype(int).tolist()


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 12), batch_sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8))
def test_wrap_around_keeps_exactly_the_newest_transitions_in_order(capacity, batch_sizes):
    buffer = ReplayBuffer(capacity, FIELDS)
    added = 0
    for count in batch_sizes:
        buffer.add(transitions(added, count))
        added += count
        newest = list(range(max(0, added - capacity), added))
        assert len(buffer) == len(newest) and stored_ids(buffer) == newest
        assert buffer.position == added % capacity
        state = buffer.state_dict()
        np.testing.assert_array_equal(state["field.action"][:, 1], -np.array(newest, np.float32))
        np.testing.assert_array_equal(state["field.obs"][:, 0, 0], np.array(newest) % 256)


def test_sampling_is_uniform_over_stored_transitions():
    capacity, stored = 50, 40
    buffer = ReplayBuffer(capacity, FIELDS)
    buffer.add(transitions(1000, 30))
    buffer.add(transitions(2000, stored))  # wraps: 20 of the first batch are gone
    rng = np.random.default_rng(0)
    draws = np.concatenate([buffer.sample(256, rng)["reward"] for _ in range(200)]).astype(int)
    held = set(stored_ids(buffer))
    assert set(draws) <= held and len(held) == capacity
    counts = np.array([np.sum(draws == i) for i in sorted(held)])
    expected = len(draws) / capacity
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 100.0  # 49 degrees of freedom: p < 1e-4 above 100


def test_sample_returns_copies_with_field_shapes_and_dtypes():
    buffer = ReplayBuffer(8, FIELDS)
    buffer.add(transitions(0, 5))
    batch = buffer.sample(7, np.random.default_rng(1))
    for name, (shape, dtype) in FIELDS.items():
        assert batch[name].shape == (7, *shape) and batch[name].dtype == np.dtype(dtype)
    batch["reward"][:] = -1
    assert (buffer.state_dict()["field.reward"] >= 0).all()  # writing into a sample leaves the buffer alone


def test_state_dict_round_trips_through_safetensors(tmp_path):
    buffer = ReplayBuffer(6, FIELDS)
    buffer.add(transitions(0, 4))
    buffer.add(transitions(4, 5))  # wrapped: holds 3 .. 8, write position 3
    state = buffer.state_dict()
    assert state["position"].shape == () and state["position"].dtype == np.int64 and int(state["size"]) == 6
    save_file(state, str(tmp_path / "replay.safetensors"))
    restored = ReplayBuffer(6, FIELDS)
    restored.load_state_dict(load_file(str(tmp_path / "replay.safetensors")))
    assert len(restored) == 6 and restored.position == buffer.position
    assert stored_ids(restored) == list(range(3, 9))
    for name in FIELDS:
        np.testing.assert_array_equal(restored.state_dict()[f"field.{name}"], state[f"field.{name}"])
    restored.add(transitions(9, 2))
    buffer.add(transitions(9, 2))
    assert stored_ids(restored) == stored_ids(buffer) == list(range(5, 11))
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    np.testing.assert_array_equal(restored.sample(32, rng_a)["obs"], buffer.sample(32, rng_b)["obs"])


def test_partly_filled_state_dict_round_trips():
    buffer = ReplayBuffer(10, FIELDS)
    buffer.add(transitions(0, 3))
    restored = ReplayBuffer(10, FIELDS)
    restored.load_state_dict(buffer.state_dict())
    assert len(restored) == 3 and restored.position == 3 and stored_ids(restored) == [0, 1, 2]


def test_dtypes_are_kept():
    buffer = ReplayBuffer(4, FIELDS)
    batch = transitions(0, 2)
    batch["action"] = batch["action"].astype(np.float64)  # same kind: stored as the field's float32
    buffer.add(batch)
    state = buffer.state_dict()
    assert state["field.obs"].dtype == np.uint8 and state["field.action"].dtype == np.float32
    assert state["field.terminated"].dtype == np.bool_


@pytest.mark.parametrize(("change", "words"), [
    (lambda b: b.update(bogus=np.zeros(2)), r"unknown fields \['bogus'\]"),
    (lambda b: b.pop("reward"), r"missing fields \['reward'\]"),
    (lambda b: b.update(obs=np.zeros((2, 3, 2), np.uint8)), r"field 'obs' has shape \[2, 3, 2\], expected \[n, 2, 3\]"),
    (lambda b: b.update(reward=np.zeros((2, 1), np.float32)), r"field 'reward' has shape \[2, 1\], expected \[n\]"),
    (lambda b: b.update(obs=np.zeros((2, 2, 3), np.float32)), "field 'obs' has dtype float32"),
    (lambda b: b.update(reward=np.zeros(3, np.float32)), "different numbers of transitions"),
])
def test_add_errors_name_the_field(change, words):
    buffer = ReplayBuffer(4, FIELDS)
    batch = transitions(0, 2)
    change(batch)
    with pytest.raises(ValueError, match=words):
        buffer.add(batch)
    assert len(buffer) == 0


def test_other_errors():
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        ReplayBuffer(0, FIELDS)
    buffer = ReplayBuffer(4, FIELDS)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(2, np.random.default_rng(0))
    buffer.add(transitions(0, 2))
    state = buffer.state_dict()
    with pytest.raises(ValueError, match="keys"):
        ReplayBuffer(4, {"obs": FIELDS["obs"]}).load_state_dict(state)
    with pytest.raises(ValueError, match="capacity 1"):
        ReplayBuffer(1, FIELDS).load_state_dict(state)
    state["field.obs"] = state["field.obs"].astype(np.float32)
    with pytest.raises(ValueError, match="field 'obs' is float32"):
        ReplayBuffer(4, FIELDS).load_state_dict(state)


@settings(max_examples=40, deadline=None)
@given(saved_capacity=st.integers(1, 20), added=st.integers(0, 45), parts=st.integers(1, 4), capacity=st.integers(1, 12))
def test_ranks_resuming_from_one_buffer_take_disjoint_shares_of_it(saved_capacity, added, parts, capacity):
    """load_share: rank r of K takes the saved transitions r, r + K, ... (oldest first), the newest ``capacity``."""
    saved = ReplayBuffer(saved_capacity, FIELDS)
    if added:
        saved.add(transitions(0, added))
    state = saved.state_dict()
    ids = stored_ids(saved)
    shares = []
    for part in range(parts):
        share = ReplayBuffer(capacity, FIELDS)
        share.load_share(state, part=part, parts=parts)
        assert stored_ids(share) == ids[part::parts][-capacity:]
        shares.append(stored_ids(share))
        if len(share):
            np.testing.assert_array_equal(share.state_dict()["field.obs"][:, 0, 0], np.array(shares[-1]) % 256)
    if capacity >= len(ids):  # room for every share: together they are the saved buffer
        assert sorted(sum(shares, [])) == ids
