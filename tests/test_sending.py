"""protocol.sending.send_nonblocking over real in-process ZeroMQ sockets: one message, intact, its size counted; None
when the socket takes nothing; the refusal of a message that is not an encoded one."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from protocol import Message, MessageType, decode, encode
from protocol.sending import send_nonblocking


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def test_an_encoded_message_arrives_whole_and_its_size_is_returned(context) -> None:
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    try:
        pull.bind("inproc://sending")
        push.connect("inproc://sending")
        rng = np.random.default_rng(0)
        arrays = {"obs": rng.integers(0, 255, (4, 3, 5), dtype=np.uint8), "values": rng.standard_normal((4, 3)),
                  "actions": rng.integers(0, 7, (4, 3)), "empty": np.zeros((0, 2), np.float32)}
        message = Message(type=MessageType.HEARTBEAT, sender="host-1", fields={}, arrays=arrays)
        frames = encode(message)
        assert send_nonblocking(push, frames) == sum(memoryview(f).nbytes for f in frames)
        assert pull.poll(5000)
        received = pull.recv_multipart(copy=True)
        assert len(received) == len(frames) and not pull.poll(0)
        assert [bytes(memoryview(f)) for f in frames] == received
        decoded = decode(received)
        assert decoded.sender == "host-1" and decoded.arrays.keys() == arrays.keys()
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded.arrays[name], array)
    finally:
        push.close(linger=0)
        pull.close(linger=0)


def test_a_socket_with_no_peer_takes_nothing(context) -> None:
    push = context.socket(zmq.PUSH)
    try:
        push.bind("inproc://nobody")
        frames = encode(Message(type=MessageType.HEARTBEAT, sender="host-1", fields={}, arrays={}))
        assert send_nonblocking(push, frames) is None
    finally:
        push.close(linger=0)


def test_fewer_than_two_frames_is_not_an_encoded_message(context) -> None:
    push = context.socket(zmq.PUSH)
    try:
        with pytest.raises(ValueError, match="two frames at least, got 1"):
            send_nonblocking(push, [b"sluice/1"])
    finally:
        push.close(linger=0)
