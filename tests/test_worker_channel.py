"""actors.worker_channel: the host-worker byte protocol over a real socket pair, records split anywhere."""

from __future__ import annotations

import os

import multiprocess as mp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.worker_channel import (QUIT, STATUS_ENV_RESTARTED, STATUS_FATAL, STATUS_NUDGE, STATUS_OK, WAKE, HostEnd,
                                   Reply, WorkerEnd)


def channel_pair() -> tuple[HostEnd, WorkerEnd]:
    host, worker = mp.get_context("spawn").Pipe(duplex=True)
    return HostEnd(host), WorkerEnd(worker)


def test_commands_reach_the_worker_in_order_and_eof_ends_them() -> None:
    host, worker = channel_pair()
    for command in (WAKE, WAKE, QUIT):
        host.send(command)
    assert [worker.next_command() for _ in range(3)] == [WAKE, WAKE, QUIT]
    host.close()
    assert worker.next_command() is None


def test_a_closed_worker_end_reads_as_eof_and_a_send_to_it_fails() -> None:
    host, worker = channel_pair()
    worker.reply(0, STATUS_OK)
    worker.conn.close()
    assert host.read_replies() == [Reply(0, STATUS_OK, b"")]
    with pytest.raises(EOFError):
        host.read_replies()
    with pytest.raises(BrokenPipeError):
        host.send(0)


@settings(max_examples=60, deadline=None)
@given(replies=st.lists(st.tuples(st.integers(0, 253),
                                  st.sampled_from([STATUS_OK, STATUS_NUDGE, STATUS_ENV_RESTARTED, STATUS_FATAL]),
                                  st.binary(max_size=300)), min_size=1, max_size=12),
       cuts=st.lists(st.integers(1, 40), max_size=30))
def test_replies_split_anywhere_come_out_whole_and_in_order(replies, cuts) -> None:
    """What the worker writes, delivered in arbitrary pieces, reads back as the same replies."""
    host, worker = channel_pair()
    expected = [Reply(group, status, b"" if status in (STATUS_OK, STATUS_NUDGE) else report)
                for group, status, report in replies]
    sink, source = mp.get_context("spawn").Pipe(duplex=True)  # capture the bytes one reply() writes
    capture = WorkerEnd(source)
    for reply in expected:
        capture.reply(reply.group, reply.status, reply.report)
    source.close()
    stream = b""
    while chunk := os.read(sink.fileno(), 1 << 16):
        stream += chunk
    got, at = [], 0
    for cut in [*cuts, len(stream)]:
        piece = stream[at:at + cut]
        if not piece:
            break
        os.write(worker.fd, piece)
        got.extend(host.read_replies())
        at += len(piece)
    assert got == expected and not host.pending
