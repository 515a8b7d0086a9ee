"""The actor host's shipping step (``ActorHost._ship_rows``) against a data socket that refuses a block: the block
waits in the loop state, goes out first on a later turn, and the host metrics count it once, when it goes. Rows left
in shared memory for a learner on this machine are, bit for bit, the rows a packed message carries."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from actors.assembler import VERSIONS, RowAssembler
from actors.host import ActorHost, LoopState
from actors.host_metrics import HostMetrics
from actors.rows_report import RowsReport
from actors.shared_rows_out import SharedRowsOut
from protocol import MessageType
from protocol.shared_rows import RowSlots, payload_arrays, read_layout_key, read_ref
from telemetry.registry import new_registry
from tests.test_telemetry import samples


class RefusingLink:
    """A LearnerLink whose data socket says it has room but refuses the next ``refusals`` sends (a learner rank that
    stopped between the room check and the send)."""

    name = "host-1"

    def __init__(self, refusals: int, packed_rows: bool = False, through_memory: bool = False) -> None:
        self.refusals = refusals
        self.packed_rows = packed_rows
        self.rows_through_memory = through_memory
        self.token = "t" * 32
        self.sent: list = []
        self.packed: list = []

    def can_send_rows(self) -> bool:
        return True

    def send_rows(self, message, packed=None) -> int | None:
        if self.refusals:
            self.refusals -= 1
            return None
        self.sent.append(message)
        self.packed.append(packed)
        return 1000


def host_with_full_rows(link: RefusingLink, full_rows: int) -> tuple[ActorHost, HostMetrics]:
    assembler = RowAssembler(num_agents=2, num_rows=16, horizon=2, obs_shape=(3,), obs_dtype="float32")
    rng = np.random.default_rng(5)
    while assembler.full_rows() < full_rows:
        values = {buffer.name: (rng.normal(size=(2, *buffer.value_shape)) * 10).astype(buffer.dtype)
                  for buffer in assembler._buffers if buffer.name != VERSIONS and buffer.width}
        assembler.add(np.arange(2), 0, **values)
    metrics = HostMetrics(new_registry("actor_host"))
    host = ActorHost.__new__(ActorHost)
    host.link, host.metrics, host.assembler = link, metrics, assembler
    host.sizing = SimpleNamespace(rows=2)
    host.workers = SimpleNamespace(read_clocks=lambda: (0.0, 0.0))
    host.inference = SimpleNamespace(version=7)
    host.state = LoopState(run_id="r", last_heartbeat=0.0, last_reply=0.0, last_flush=0.0,
                           report=RowsReport(env_steps=5, agent_steps=10))
    host.shared_rows = SharedRowsOut(slots=4, slot_bytes=assembler.packed_bytes(2), reclaim_s=10.0)
    return host, metrics


@pytest.mark.parametrize("packed_rows", [False, True])
def test_a_refused_block_waits_then_goes_out_first_and_is_counted_once(packed_rows: bool) -> None:
    link = RefusingLink(refusals=2, packed_rows=packed_rows)
    host, metrics = host_with_full_rows(link, full_rows=4)
    host._ship_rows(now=1.0)  # built, refused: nothing more is built behind it
    assert link.sent == [] and host.state.unsent is not None and host.assembler.full_rows() == 2
    host.state.report.env_steps += 3  # the host goes on counting while the block waits
    host._ship_rows(now=1.01)  # refused again
    assert link.sent == [] and host.assembler.full_rows() == 2
    got = samples(metrics.registry)
    assert got[("sluice_actor_rows_sent_total", ())] == 0 and got[("sluice_actor_env_steps_total", ())] == 0
    assert got[("sluice_actor_send_blocked_total", ())] == 2
    host._ship_rows(now=1.02)  # taken: the waiting block first, then the next from the assembler
    assert [message.type for message in link.sent] == [MessageType.ROWS, MessageType.ROWS]
    assert [message.fields["env_steps"] for message in link.sent] == [5, 3]
    assert [message.fields["num_rows"] for message in link.sent] == [2, 2]
    for message, packed in zip(link.sent, link.packed):  # a learner that reads packed rows gets them packed
        assert (packed is not None) == packed_rows
        assert packed is None or all(packed.arrays[name] is array for name, array in message.arrays.items())
    assert host.state.unsent is None and host.assembler.full_rows() == 0
    got = samples(metrics.registry)
    assert got[("sluice_actor_rows_sent_total", ())] == 4 and got[("sluice_actor_env_steps_total", ())] == 8


def test_rows_left_in_shared_memory_are_the_rows_a_packed_message_carries() -> None:
    sent = []
    for through_memory in (False, True):
        link = RefusingLink(refusals=0, packed_rows=True, through_memory=through_memory)
        host, _ = host_with_full_rows(link, full_rows=6)
        try:
            host._ship_rows(now=1.0)
            messages = []
            for message in link.sent:
                if through_memory:
                    assert message.arrays == {}
                    ref = read_ref(message.fields.pop("shared"))
                    arrays = payload_arrays(read_layout_key(ref.layout), RowSlots.open(ref.segment).payload(ref))
                    message = dataclasses.replace(message, arrays=arrays)
                messages.append(message)
            sent.append(messages)
        finally:
            host.shared_rows.close()
    assert len(sent[0]) == len(sent[1]) == 3
    for inline, shared in zip(*sent):
        assert inline.fields == shared.fields and list(inline.arrays) == list(shared.arrays)
        for name, array in inline.arrays.items():
            assert array.dtype == shared.arrays[name].dtype and array.shape == shared.arrays[name].shape
            assert array.tobytes() == shared.arrays[name].tobytes(), name


def test_with_every_slot_out_the_host_waits_as_for_a_full_socket() -> None:
    link = RefusingLink(refusals=0, packed_rows=True, through_memory=True)
    host, metrics = host_with_full_rows(link, full_rows=6)
    host.shared_rows = SharedRowsOut(slots=2, slot_bytes=host.assembler.packed_bytes(2), reclaim_s=10.0)
    try:
        host._ship_rows(now=1.0)
        assert len(link.sent) == 2 and host.assembler.full_rows() == 2  # two slots: two messages, the rest waits
        assert samples(metrics.registry)[("sluice_actor_send_blocked_total", ())] == 1
        host._ship_rows(now=11.5)  # no slot came back for 10 s: the rows go in the message
        assert len(link.sent) == 3 and "shared" not in link.sent[2].fields and link.sent[2].arrays
    finally:
        host.shared_rows.close()


def test_rows_routed_to_other_learner_ranks_go_through_a_new_segment(capsys) -> None:
    """Moving to other ranks drops the messages queued for the rank left (their slots never come back): the next
    message takes a slot of a new segment; the same routes again change nothing."""
    link = RefusingLink(refusals=0, packed_rows=True, through_memory=True)
    link.data, link.data_routes = object(), ("ipc:///a",)
    link.route_data = lambda endpoints: endpoints != link.data_routes
    link.resolve = str
    host, _ = host_with_full_rows(link, full_rows=2)
    try:
        for now, routes in ((1.0, ("ipc:///a",)), (2.0, ("ipc:///b",)), (3.0, None)):
            host._ship_rows(now=now)
            assert host.assembler.full_rows() == 0
            if routes is not None:
                host._follow_routes(routes)
                while host.assembler.full_rows() < 2:
                    host.assembler.add(np.arange(2), 0, **{
                        buffer.name: np.zeros((2, *buffer.value_shape), buffer.dtype)
                        for buffer in host.assembler._buffers if buffer.name != VERSIONS and buffer.width})
        assert "rows now go to learner ranks at ipc:///b" in capsys.readouterr().out
        segments = [read_ref(message.fields["shared"]).segment for message in link.sent]
        assert len(segments) == 3 and segments[0] == segments[1] != segments[2]
    finally:
        host.shared_rows.close()
