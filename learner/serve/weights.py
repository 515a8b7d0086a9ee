"""Weights publisher: versioned raw tensor frames plus a msgpack header on a PUB socket."""

from __future__ import annotations

import numpy as np
import zmq

from protocol import Message, MessageType, encode
from protocol.curve import ServerCurve


class WeightsPublisher:
    """PUB bound at ``endpoint``; used only by the update loop (the main thread)."""

    def __init__(self, *, context: zmq.Context, endpoint: str, curve: ServerCurve | None = None) -> None:
        self.socket = context.socket(zmq.PUB)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.setsockopt(zmq.SNDHWM, 4)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)

    def publish(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Send weights of ``version`` to every subscriber (slow ones skip versions, never block us)."""
        message = Message(type=MessageType.WEIGHTS, sender="learner", version=version,
                          fields={"names": list(arrays)}, arrays=arrays)
        self.socket.send_multipart(encode(message), copy=False)

    def publish_shutdown(self, reason: str) -> None:
        """Tell subscribers the run is over."""
        message = Message(type=MessageType.SHUTDOWN, sender="learner", fields={"reason": reason})
        self.socket.send_multipart(encode(message), copy=False)

    def close(self) -> None:
        """Close the socket."""
        self.socket.close(linger=0)
