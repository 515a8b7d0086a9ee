"""The actor host's shipping step (``ActorHost._ship_rows``) against a data socket that refuses a block: the block
waits in the loop state, goes out first on a later turn, and the host metrics count it once, when it goes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from actors.assembler import VERSIONS, RowAssembler
from actors.host import ActorHost, LoopState
from actors.host_metrics import HostMetrics
from actors.rows_report import RowsReport
from protocol import MessageType
from telemetry.registry import new_registry
from tests.test_telemetry import samples


class RefusingLink:
    """A LearnerLink whose data socket says it has room but refuses the next ``refusals`` sends (a learner rank that
    stopped between the room check and the send)."""

    name = "host-1"

    def __init__(self, refusals: int, packed_rows: bool = False) -> None:
        self.refusals = refusals
        self.packed_rows = packed_rows
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
    values = {buffer.name: np.zeros((2, *buffer.value_shape), dtype=buffer.dtype)
              for buffer in assembler._buffers if buffer.name != VERSIONS and buffer.width}
    while assembler.full_rows() < full_rows:
        assembler.add(np.arange(2), 0, **values)
    metrics = HostMetrics(new_registry("actor_host"))
    host = ActorHost.__new__(ActorHost)
    host.link, host.metrics, host.assembler = link, metrics, assembler
    host.sizing = SimpleNamespace(rows=2)
    host.workers = SimpleNamespace(read_clocks=lambda: (0.0, 0.0))
    host.inference = SimpleNamespace(version=7)
    host.state = LoopState(run_id="r", last_heartbeat=0.0, last_reply=0.0, last_flush=0.0,
                           report=RowsReport(env_steps=5, agent_steps=10))
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
