"""The ingest reading rows from a host's shared memory (protocol/shared_rows.py) over a real PUSH/PULL pair: the batch
holds the same rows, bit for bit, as when they come in the messages; every slot is handed back, also for rows it
drops; a reference it cannot read, another registration's segment or a learner that offers none is refused and
counted (``bad_shared``); segments of registrations that are gone are let go."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from learner.serve.ingest import Ingest
from learner.serve.senders import Sender, SenderRegistry
from learner.serve.shared_rows_reader import SharedRowsReader
from protocol import Limits, Message, PackedLayout, encode
from protocol.framing import dtype_name
from protocol.same_machine import data_ipc_path
from protocol.shared_rows import RowSlots, SharedRef
from tests.processes import wait_for
from tests.test_ingest import HORIZON, ROWS_PER_MESSAGE, SEGMENTS, SENDER, SPEC, TOKEN, full_slot, rows_message

OTHER = Sender(name="other", token="b" * 32, curve_key=None, num_envs=4, agent_slots=4)


@contextlib.contextmanager
def shared_ingest(*, shared_rows: bool = True):
    """An ingest bound over ipc (where hosts may leave rows in shared memory), started, and a PUSH socket to it."""
    context = zmq.Context()
    stop = threading.Event()
    registry = SenderRegistry()
    registry.add(SENDER)
    registry.add(OTHER)
    path = data_ipc_path(os.getpid(), 77)
    thread = Ingest(context=context, endpoint="tcp://127.0.0.1:0", segments=SEGMENTS, env=SPEC, horizon=HORIZON,
                    state_size=0, max_policy_lag=2, hwm=4, buffer_bytes=65536, limits=Limits(), stop=stop,
                    registry=registry, rows_per_message=ROWS_PER_MESSAGE, max_abs_value=1e6, ipc_path=path,
                    shared_rows=shared_rows)
    thread.set_policy_version(10)
    thread.start()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"ipc://{path}")
    try:
        yield thread, push, registry
    finally:
        stop.set()
        thread.join(timeout=5)
        push.close()
        context.term()
        path.unlink(missing_ok=True)


@pytest.fixture
def host_slots():
    segment = RowSlots.create(4, 1 << 16)
    try:
        yield segment
    finally:
        segment.close()


def through_memory(message: Message, segment: RowSlots) -> Message:
    """``message`` as a host on the learner's machine sends it: its arrays packed into a free slot of ``segment``,
    the message saying where."""
    layout = PackedLayout.of([(name, dtype_name(array.dtype), array.shape) for name, array in message.arrays.items()])
    slot, seq = segment.take()
    packed = layout.allocate(segment.payload_buffer(slot))
    for name, array in message.arrays.items():
        packed.arrays[name][...] = array
    ref = SharedRef(segment=segment.name, slot=slot, seq=seq, nbytes=layout.total, layout=layout.key)
    return dataclasses.replace(message, fields={**message.fields, "shared": ref.to_field()}, arrays={})


def test_rows_through_memory_fill_the_batch_as_rows_in_the_messages_do(host_slots: RowSlots) -> None:
    messages = [rows_message([10, 9, 7, 8], marker=100.0), rows_message([10, 10, 3, 10, 9], marker=200.0)]
    batches = []
    for shared in (False, True):
        with shared_ingest() as (thread, push, _):
            for message in messages:
                push.send_multipart(encode(through_memory(message, host_slots) if shared else message))
            batches.append({name: array.copy() for name, array in thread.slots.buffers[full_slot(thread)]
                            .arrays.items()})
            assert thread.counters.totals().rows_dropped["stale"] == 2
            assert wait_for(lambda: host_slots.free_slots() == 4, timeout=5), "every slot handed back"
    assert batches[0].keys() == batches[1].keys()
    for name in batches[0]:
        assert batches[0][name].tobytes() == batches[1][name].tobytes(), name


def test_a_slot_of_rows_all_dropped_is_handed_back_too(host_slots: RowSlots) -> None:
    with shared_ingest() as (thread, push, _):
        push.send_multipart(encode(through_memory(rows_message([1, 2], marker=0.0), host_slots)))
        assert wait_for(lambda: thread.counters.totals().rows_dropped.get("stale") == 2,
                        timeout=5), "stale rows counted"
        assert wait_for(lambda: host_slots.free_slots() == 4, timeout=5), "the slot handed back"


def refused(thread: Ingest, count: int) -> dict[str, int]:
    assert wait_for(lambda: sum(thread.counters.take_snapshot().messages_dropped_by_reason.values()) >= count,
                    timeout=5), f"{count} refusals"
    return thread.counters.take_snapshot().messages_dropped_by_reason


def bad_references(good: Message) -> dict[str, Message]:
    """Messages whose rows the ingest cannot read, by what its log line says."""
    ref = good.fields["shared"]
    return {"does not hold payload": dataclasses.replace(good, fields={**good.fields,
                                                                        "shared": {**ref, "seq": ref["seq"] + 5}}),
            "no array frame": dataclasses.replace(good, arrays={"versions": np.zeros(3, dtype=np.int64)}),
            "cannot open rows segment": dataclasses.replace(
                good, fields={**good.fields, "shared": {**ref, "segment": "sluice_1_rows_" + "0" * 16}}),
            "belongs to another registration": dataclasses.replace(good, fields={**good.fields,
                                                                                  "token": OTHER.token}),
            "its layout's arrays need": dataclasses.replace(
                good, fields={**good.fields, "shared": {**ref, "nbytes": ref["nbytes"] + 8}}),
            "is not name:dtype:shape": dataclasses.replace(
                good, fields={**good.fields, "shared": {**ref, "layout": "obs:float32"}})}


@pytest.mark.parametrize("line", ["does not hold payload", "no array frame", "cannot open rows segment",
                                  "belongs to another registration", "its layout's arrays need",
                                  "is not name:dtype:shape"])
def test_what_the_ingest_cannot_read_is_refused_and_counted(host_slots: RowSlots, caplog, line: str) -> None:
    with shared_ingest() as (thread, push, _):
        first = through_memory(rows_message([10] * 3, marker=1.0), host_slots)
        push.send_multipart(encode(first))  # maps the segment for TOKEN's registration
        bad = bad_references(through_memory(rows_message([10] * 3, marker=2.0), host_slots))[line]
        push.send_multipart(encode(bad))
        assert refused(thread, 1) == {"bad_shared": 1}
        push.send_multipart(encode(rows_message([10] * 3, marker=3.0)))
        batch = thread.slots.buffers[full_slot(thread)].arrays
        assert batch["obs"][:, 0, 0].tolist() == [1.0] * 3 + [3.0] * 3
    assert line in caplog.text


def test_a_learner_that_offers_no_shared_rows_refuses_them(host_slots: RowSlots, caplog) -> None:
    with shared_ingest(shared_rows=False) as (thread, push, _):
        push.send_multipart(encode(through_memory(rows_message([10] * 3, marker=1.0), host_slots)))
        assert refused(thread, 1) == {"bad_shared": 1}
    assert "this data socket reads them from the message" in caplog.text


def test_a_segment_goes_to_the_next_registration_once_its_own_is_gone(host_slots: RowSlots) -> None:
    with shared_ingest() as (thread, push, registry):
        push.send_multipart(encode(through_memory(rows_message([10] * 3, marker=1.0), host_slots)))
        assert wait_for(lambda: host_slots.name in thread.shared.segments, timeout=5), "the segment mapped"
        registry.remove(TOKEN)  # the host registered again: OTHER is its new registration
        again = through_memory(rows_message([10] * 3, marker=2.0), host_slots)
        push.send_multipart(encode(dataclasses.replace(again, fields={**again.fields, "token": OTHER.token})))
        batch = thread.slots.buffers[full_slot(thread)].arrays
        assert batch["obs"][:, 0, 0].tolist() == [1.0] * 3 + [2.0] * 3
        assert thread.shared.segments[host_slots.name][0] == OTHER.token


def test_the_segment_of_a_registration_that_is_gone_is_let_go(host_slots: RowSlots) -> None:
    with shared_ingest() as (thread, push, registry):
        push.send_multipart(encode(through_memory(rows_message([10] * 2, marker=1.0), host_slots)))
        assert wait_for(lambda: host_slots.name in thread.shared.segments, timeout=5), "the segment mapped"
        registry.remove(TOKEN)
        thread.shared.next_sweep = 0.0
        assert wait_for(lambda: host_slots.name not in thread.shared.segments, timeout=5), "the segment let go"
    assert Path("/dev/shm", host_slots.name).exists()  # the host's to unlink


def test_a_registration_keeps_two_segments_mapped_its_host_keeps_two(host_slots: RowSlots) -> None:
    """A host makes a new segment when its learner ranks change and keeps the one before: a learner maps at most two
    per registration, dropping the one mapped first, while another registration's stays."""
    registry = SenderRegistry()
    registry.add(SENDER)
    registry.add(OTHER)
    reader = SharedRowsReader(registry)
    made = [RowSlots.create(2, 1 << 16) for _ in range(3)]
    try:
        other = through_memory(rows_message([10], marker=9.0), host_slots)
        reader.arrays(other.fields["shared"], OTHER)
        reader.release()
        for k, segment in enumerate(made):
            message = through_memory(rows_message([10, 10], marker=float(k)), segment)
            arrays = reader.arrays(message.fields["shared"], SENDER)
            assert arrays["obs"][:, 0, 0].tolist() == [float(k)] * 2
            reader.release()
            assert segment.free_slots() == 2  # handed back
        assert list(reader.segments) == [host_slots.name, made[1].name, made[2].name]
    finally:
        reader.close()
        for segment in made:
            segment.close()
