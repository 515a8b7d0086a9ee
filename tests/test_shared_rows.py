"""Rows through shared memory (protocol/shared_rows.py, actors/shared_rows_out.py): the segment's slots pass between
host and learner by sequence numbers, a learner opens only a real rows segment of this user's, a reference the slot
does not hold is refused, and a host that finds no free slot waits, or after ``reclaim_s`` sends the payload itself."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.shared_rows_out import WAIT, SharedRowsOut, Slot
from configs.schema import NetworkSection
from protocol import ALLOWED_DTYPES, PackedLayout, ProtocolError
from protocol.shared_rows import MAGIC, RowSlots, SharedRef, SlotsGeometry, payload_arrays, read_layout_key, read_ref

LAYOUT = PackedLayout.of([("obs", "float32", (3, 4)), ("done", "bool", (3,)), ("versions", "int64", (3,))])


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    """A directory standing in for /dev/shm (segments are plain files there)."""
    return tmp_path


def filled(segment: RowSlots, seed: int) -> tuple[SharedRef, dict[str, np.ndarray]]:
    """Take a slot, lay a random payload of LAYOUT out in it; its reference and the arrays written."""
    slot, seq = segment.take()
    packed = LAYOUT.allocate(segment.payload_buffer(slot))
    rng = np.random.default_rng(seed)
    packed.arrays["obs"][:] = rng.normal(size=(3, 4))
    packed.arrays["done"][:] = rng.random(3) < 0.5
    packed.arrays["versions"][:] = rng.integers(0, 100, 3)
    ref = SharedRef(segment=segment.name, slot=slot, seq=seq, nbytes=LAYOUT.total, layout=LAYOUT.key)
    return ref, {name: array.copy() for name, array in packed.arrays.items()}


def test_a_payload_goes_to_the_learner_and_its_slot_comes_back(shm_dir: Path) -> None:
    host = RowSlots.create(2, 4096, directory=shm_dir)
    learner = RowSlots.open(host.name, directory=shm_dir)
    first, written = filled(host, seed=1)
    second, _ = filled(host, seed=2)
    assert host.take() is None and host.free_slots() == 0  # both slots wait for the learner
    arrays = payload_arrays(read_layout_key(first.layout), learner.payload(first))
    for name, array in written.items():
        np.testing.assert_array_equal(arrays[name], array)
    assert not arrays["obs"].flags.writeable
    learner.release(first)
    assert host.free_slots() == 1
    with pytest.raises(ProtocolError, match="does not hold payload"):
        learner.payload(first)  # read already: handed back
    third, written = filled(host, seed=3)
    assert third.slot == first.slot and third.seq > second.seq
    with pytest.raises(ProtocolError, match="does not hold payload"):
        learner.payload(first)  # the slot holds another payload now
    np.testing.assert_array_equal(payload_arrays(LAYOUT, learner.payload(third))["obs"], written["obs"])
    host.close()
    assert not (shm_dir / host.name).exists()
    assert host.take() is None


def test_the_learner_refuses_what_the_slot_does_not_hold(shm_dir: Path) -> None:
    host = RowSlots.create(2, 4096, directory=shm_dir)
    learner = RowSlots.open(host.name, directory=shm_dir)
    ref, _ = filled(host, seed=0)
    cases = {"outside rows segment": [{"slot": 2}, {"nbytes": 4097}],
             "does not hold payload": [{"seq": ref.seq + 1}, {"slot": 1 - ref.slot}]}
    for message, changes in cases.items():
        for change in changes:
            with pytest.raises(ProtocolError, match=message) as caught:
                learner.payload(SharedRef(**{**ref.to_field(), **change}))
            assert caught.value.reason == "bad_shared"
    learner.release(SharedRef(**{**ref.to_field(), "seq": ref.seq + 1}))  # a wrong seq hands nothing back
    assert host.free_slots() == 1
    host.close()


def test_a_learner_opens_only_a_rows_segment_of_this_users(shm_dir: Path) -> None:
    host = RowSlots.create(1, 100, directory=shm_dir)
    cases: dict[str, str] = {}
    for suffix, damage in (("a" * 16, b"notmagic"), ("b" * 16, None), ("c" * 16, "short")):
        name = f"sluice_{os.getpid()}_rows_{suffix}"
        data = (shm_dir / host.name).read_bytes()
        if damage == "short":
            data = data[:-1]
        elif damage is not None:
            data = damage + data[len(MAGIC):]
        else:
            data = data[:8] + np.array([2000, 100, 0], dtype="<u8").tobytes() + data[32:]
        (shm_dir / name).write_bytes(data)
        cases[name] = {b"notmagic": "does not start as one", None: "declares 2000 slots", "short": "has"}[damage]
    link = f"sluice_{os.getpid()}_rows_{'d' * 16}"
    (shm_dir / link).symlink_to(shm_dir / host.name)
    cases[link] = "cannot open rows segment"
    cases[f"sluice_{os.getpid()}_rows_{'e' * 16}"] = "cannot open rows segment"
    cases["sluice_1_slots"] = "is not a rows segment's name"
    cases["../sluice_1_rows_" + "f" * 16] = "is not a rows segment's name"
    for name, message in cases.items():
        with pytest.raises(ProtocolError, match=message) as caught:
            RowSlots.open(name, directory=shm_dir)
        assert caught.value.reason == "bad_shared"
    if os.geteuid() == 0:  # as root (CI) the file can be given away
        os.chown(shm_dir / host.name, 65534, 65534)
        with pytest.raises(ProtocolError, match="not a file of this user's"):
            RowSlots.open(host.name, directory=shm_dir)
    host.close()


def test_a_reference_of_the_wrong_form_is_refused() -> None:
    good = {"segment": "sluice_12_rows_" + "0" * 16, "slot": 0, "seq": 1, "nbytes": 8, "layout": ""}
    assert read_ref(good) == SharedRef(**good)
    bad = [None, [], {**good, "extra": 1}, {k: v for k, v in good.items() if k != "seq"}, {**good, "slot": True},
           {**good, "slot": -1}, {**good, "seq": 0}, {**good, "nbytes": "8"}, {**good, "segment": "sluice_12_slots"},
           {**good, "layout": []}]
    for value in bad:
        with pytest.raises(ProtocolError) as caught:
            read_ref(value)
        assert caught.value.reason == "bad_shared"


def test_geometry_keeps_the_two_sides_words_and_the_slots_apart() -> None:
    for slots, slot_bytes in ((1, 1), (7, 5000), (1024, 1 << 20)):
        geometry = SlotsGeometry(slots, slot_bytes)
        assert geometry.done_offset % 64 == 0 and geometry.done_offset >= 64 + 8 * slots
        assert geometry.data_offset % os.sysconf("SC_PAGE_SIZE") == 0
        assert geometry.data_offset >= geometry.done_offset + 8 * slots
        assert geometry.slot_stride >= slot_bytes
        assert geometry.total == geometry.data_offset + slots * geometry.slot_stride


def test_a_full_disk_leaves_no_file_and_the_host_sends_the_rows_itself(shm_dir: Path, monkeypatch,
                                                                       capsys) -> None:
    def full(_fd: int, _offset: int, _length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError):
        RowSlots.create(2, 4096, directory=shm_dir)
    assert list(shm_dir.iterdir()) == []
    out = SharedRowsOut(slots=2, slot_bytes=4096, reclaim_s=10.0)
    assert out.take("token", now=0.0) is None and out.take("token", now=1.0) is None
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    assert "cannot make a shared-memory rows segment of 2 x 4096 bytes" in line and "No space left" in line


def test_no_free_slot_is_back_pressure_until_the_oldest_is_lost(capsys) -> None:
    out = SharedRowsOut(slots=2, slot_bytes=256, reclaim_s=10.0)
    try:
        first, second = out.take("t1", now=100.0), out.take("t1", now=105.0)
        assert isinstance(first, Slot) and isinstance(second, Slot) and first.slots is second.slots
        assert out.take("t1", now=109.9) is WAIT
        assert capsys.readouterr().out == ""
        assert out.take("t1", now=110.1) is None  # the first slot was out for 10 s: the payload goes in the message
        assert out.take("t1", now=110.2) is None
        assert capsys.readouterr().out == ("actors: no shared-memory rows slot came back from the learner for 10 s "
                                           "(it read no rows, or messages were lost on the way): rows go to it inside "
                                           "the messages until slots come back\n")
        learner = RowSlots.open(first.slots.name)
        learner.release(SharedRef(segment=first.slots.name, slot=first.index, seq=first.seq, nbytes=0, layout=""))
        again = out.take("t1", now=111.0)
        assert isinstance(again, Slot) and again.index == first.index and again.seq > second.seq
        name = first.slots.name
        renewed = out.take("t2", now=112.0)  # a new registration: a new segment, the old one kept one more
        assert isinstance(renewed, Slot) and renewed.slots.name != name
        assert Path("/dev/shm", name).exists() and Path("/dev/shm", renewed.slots.name).exists()
        third = out.take("t3", now=113.0)
        assert isinstance(third, Slot)
        assert not Path("/dev/shm", name).exists() and Path("/dev/shm", renewed.slots.name).exists()
    finally:
        out.close()
    assert not any(p.name.startswith(f"sluice_{os.getpid()}_rows_") for p in Path("/dev/shm").iterdir())


def test_a_packed_payload_is_laid_out_in_a_given_buffer() -> None:
    buffer = np.full(LAYOUT.total + 10, 7, dtype=np.uint8)
    packed = LAYOUT.allocate(buffer)
    assert packed.buffer.base is buffer or np.shares_memory(packed.buffer, buffer)
    packed.arrays["versions"][:] = [1, 2, 3]
    arrays = payload_arrays(LAYOUT, memoryview(buffer[:LAYOUT.total]).toreadonly())
    assert arrays["versions"].tolist() == [1, 2, 3] and not arrays["versions"].flags.writeable
    for bad in (np.zeros(LAYOUT.total - 1, dtype=np.uint8), np.zeros(LAYOUT.total, dtype=np.int16)):
        with pytest.raises(ValueError, match="needs a uint8 buffer"):
            LAYOUT.allocate(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ALLOWED_DTYPES)), st.lists(st.integers(0, 40), max_size=4)),
                max_size=16))
def test_a_layout_key_reads_back_as_the_layout_it_was_written_from(arrays) -> None:
    layout = PackedLayout.of([(f"a{i}", dtype, tuple(shape)) for i, (dtype, shape) in enumerate(arrays)])
    again = read_layout_key(layout.key)
    assert (again.names, again.dtypes, again.shapes, again.offsets, again.total, again.key) == (
        layout.names, layout.dtypes, layout.shapes, layout.offsets, layout.total, layout.key)


@pytest.mark.parametrize(("key", "says"), [
    ("obs:float32", "is not name:dtype:shape"),
    ("obs:float32:3:4", "is not name:dtype:shape"),
    ("obs:float32:3,x", "is not integers"),
    ("obs:complex64:3", "dtype 'complex64' is not allowed"),
    ("obs:float32:3,-1", "must be non-negative ints"),
    (":float32:3", "has an empty name"),
    ("obs:float32:3;obs:int8:2", "appears more than once"),
    ("obs:float32:" + ",".join(["1"] * 33), "33 dimensions, limit is 32"),
    (";".join(f"a{i}:bool:" for i in range(65)), "lists 65 arrays, at most 64"),
    ("obs:float32:" + "9" * 5000, "is not integers"),
])
def test_a_layout_key_that_is_not_one_is_refused(key: str, says: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(says)) as caught:
        read_layout_key(key)
    assert caught.value.reason == "bad_shared"


def test_a_learner_busy_training_past_the_peer_timeout_is_waited_for(capsys) -> None:
    """A learner whose update keeps its ingest from reading (and its slots out) for longer than the peer timeout is
    not taken for one that lost them: the host built from the config waits, and falls back only after 6 timeouts."""
    network = NetworkSection()
    assert SharedRowsOut.for_messages(NetworkSection(shared_rows_min_bytes=4096), hwm=2, message_bytes=4095) is None
    out = SharedRowsOut.for_messages(network, hwm=1, message_bytes=1 << 20)
    assert out is not None and len(out.taken_at) == 2
    try:
        assert isinstance(out.take("t1", now=0.0), Slot) and isinstance(out.take("t1", now=0.0), Slot)
        for now in (1.0, network.peer_timeout_s + 1, 3 * network.peer_timeout_s, 6 * network.peer_timeout_s - 0.1):
            assert out.take("t1", now=now) is WAIT
        assert capsys.readouterr().out == ""
        assert out.take("t1", now=6 * network.peer_timeout_s + 0.1) is None
        assert f"came back from the learner for {6 * network.peer_timeout_s:g} s" in capsys.readouterr().out
    finally:
        out.close()


def test_other_learner_ranks_get_a_new_segment_and_the_one_before_is_kept_one_more() -> None:
    out = SharedRowsOut(slots=2, slot_bytes=256, reclaim_s=10.0)
    try:
        names = []
        for now in (1.0, 2.0, 3.0):
            slot = out.take("t1", now=now)
            assert isinstance(slot, Slot)
            names.append(slot.slots.name)
            out.renew()  # routed to other learner ranks: the messages queued for the one left are lost
        assert len(set(names)) == 3
        assert [Path("/dev/shm", name).exists() for name in names] == [False, True, True]
        assert isinstance(out.take("t1", now=4.0), Slot) and out.segment.free_slots() == 1  # a fresh segment
    finally:
        out.close()
    assert not any(Path("/dev/shm", name).exists() for name in names)
