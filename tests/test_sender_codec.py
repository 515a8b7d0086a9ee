"""The registered actor hosts as bytes (learner/ranks/sender_codec.py) and the registry's snapshot/replace_all
(learner/serve/senders.py), as rank 0 hands its hosts to the other learner ranks."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.ranks.sender_codec import decode_senders, encode_senders
from learner.serve.senders import Sender, SenderRegistry

SENDER = st.builds(Sender, name=st.text(max_size=20), token=st.text(max_size=40),
                   curve_key=st.none() | st.text(min_size=40, max_size=40),
                   num_envs=st.integers(min_value=0, max_value=2**40),
                   agent_slots=st.integers(min_value=0, max_value=2**40))


def _entry(**changes: object) -> dict[str, object]:
    fields = {"name": "host-a", "token": "ab" * 16, "curve_key": None, "num_envs": 8, "agent_slots": 16}
    fields.update(changes)
    return fields


@settings(max_examples=100, deadline=None)
@given(senders=st.lists(SENDER, max_size=6))
def test_senders_round_trip(senders: list[Sender]) -> None:
    assert decode_senders(encode_senders(senders)) == senders


def test_an_empty_list_round_trips() -> None:
    assert decode_senders(encode_senders([])) == []


@pytest.mark.parametrize("value, kind", [({"name": "a"}, "dict"), (3, "int"), (None, "NoneType")])
def test_a_payload_that_is_not_a_list_is_refused(value: object, kind: str) -> None:
    with pytest.raises(ValueError, match=f"senders payload must be a list, got {kind}"):
        decode_senders(msgpack.packb(value))


@pytest.mark.parametrize("field, value, kind", [
    ("num_envs", "8", "str"),
    ("num_envs", True, "bool"),
    ("agent_slots", 1.5, "float"),
    ("agent_slots", False, "bool"),
    ("name", 7, "int"),
    ("token", None, "NoneType"),
    ("curve_key", b"key", "bytes"),
    ("curve_key", 3, "int"),
])
def test_a_field_of_the_wrong_type_names_the_entry_and_the_field(field: str, value: object, kind: str) -> None:
    payload = msgpack.packb([_entry(), _entry(**{field: value})], use_bin_type=True)
    with pytest.raises(ValueError, match=f"sender 1: field '{field}' has type {kind}"):
        decode_senders(payload)


def test_a_missing_field_names_the_entry_and_the_fields() -> None:
    entry = _entry()
    del entry["agent_slots"]
    with pytest.raises(ValueError, match=r"sender 0: expected the fields \['agent_slots', 'curve_key', 'name', "
                                         r"'num_envs', 'token'\]"):
        decode_senders(msgpack.packb([entry, _entry()]))


def test_an_extra_field_is_refused() -> None:
    with pytest.raises(ValueError, match="sender 2: expected the fields"):
        decode_senders(msgpack.packb([_entry(), _entry(), _entry(extra=1)]))


def test_an_entry_that_is_not_a_map_is_refused() -> None:
    with pytest.raises(ValueError, match="sender 0: expected the fields"):
        decode_senders(msgpack.packb([["host-a", "token"]]))


def _sender(name: str) -> Sender:
    return Sender(name=name, token=f"token-{name}", curve_key=None, num_envs=2, agent_slots=4)


def test_snapshot_counts_changes_and_lists_the_senders() -> None:
    registry = SenderRegistry()
    assert registry.snapshot() == (0, [])
    registry.add(_sender("a"))
    registry.add(_sender("b"))
    changes, senders = registry.snapshot()
    assert changes == 2
    assert sorted(senders, key=lambda sender: sender.name) == [_sender("a"), _sender("b")]
    registry.remove("token-a")
    assert registry.snapshot() == (3, [_sender("b")])


def test_replace_all_holds_exactly_the_given_senders_and_counts_a_change() -> None:
    registry = SenderRegistry()
    registry.add(_sender("a"))
    registry.add(_sender("b"))
    before, _ = registry.snapshot()
    registry.replace_all([_sender("c")])
    changes, senders = registry.snapshot()
    assert changes > before
    assert senders == [_sender("c")]
    assert registry.get("token-a") is None
    assert registry.get("token-c") == _sender("c")
    assert len(registry) == 1
    registry.replace_all([])
    assert registry.snapshot()[0] > changes
    assert len(registry) == 0


def test_the_snapshot_is_a_copy() -> None:
    registry = SenderRegistry()
    registry.add(_sender("a"))
    _, senders = registry.snapshot()
    senders.clear()
    assert len(registry) == 1


def test_replace_all_after_a_round_trip_reproduces_rank_zeros_registry() -> None:
    leader, follower = SenderRegistry(), SenderRegistry()
    for name in ("a", "b", "c"):
        leader.add(_sender(name))
    follower.add(_sender("old"))
    follower.replace_all(decode_senders(encode_senders(leader.snapshot()[1])))
    assert sorted(follower.snapshot()[1], key=lambda s: s.name) == sorted(leader.snapshot()[1], key=lambda s: s.name)
    assert follower.get("token-old") is None
