"""Sending an encoded message on a ZeroMQ socket without blocking, at the cost of one ``send`` per frame.

pyzmq's ``Socket.send_multipart`` checks every frame's buffer interface and ORs its enum flags again for each frame
in Python; for a ROWS message of 16 frames, most of them small, that is more work than the sends themselves
(``python -m ops.bench.message_cost``: ``per_array``). Here the flags are plain ints computed once.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
"""Every frame but the last."""
_LAST = int(zmq.NOBLOCK)
"""The last frame."""


def send_nonblocking(socket: zmq.Socket, frames: Sequence[bytes | memoryview]) -> int | None:
    """Queue ``frames`` (``protocol.encode``'s, two at least) as one message without copying them (keep them alive
    and unmodified until ZeroMQ sent them); their total size in bytes, or None when the socket took nothing (no peer,
    or its queue full). Only the first frame can be refused: ZeroMQ takes the rest of a message it started."""
    if len(frames) < 2:
        raise ValueError(f"an encoded message has two frames at least, got {len(frames)}")
    try:
        socket.send(frames[0], _MORE, copy=False)
    except zmq.Again:
        return None
    nbytes = memoryview(frames[0]).nbytes
    for frame in frames[1:-1]:
        socket.send(frame, _MORE, copy=False)
        nbytes += memoryview(frame).nbytes
    socket.send(frames[-1], _LAST, copy=False)
    return nbytes + memoryview(frames[-1]).nbytes
