"""The actor host's client of the opponent-pool server: its own DEALER socket, one blocking request at a time.

Requests happen once per alternation (which snapshot each env plays) and once per snapshot the host has not
cached, never per step, so a blocking call with a timeout keeps the host loop simple.
"""

from __future__ import annotations

import zmq

from actors.opponents import OpponentAssignment
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode
from protocol.curve import ClientCurve
from protocol.endpoints import Endpoint


class PoolError(RuntimeError):
    """The pool server refused a request, or did not answer in time."""


class PoolClient:
    """GET_OPPONENTS and GET_SNAPSHOT against the pool server at ``endpoint``."""

    def __init__(self, endpoint: Endpoint, *, limits: Limits, timeout_s: float, sender: str,
                 curve: ClientCurve | None = None) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.limits = limits
        self.timeout_ms = int(timeout_s * 1000)
        self.sender = sender
        self.context = zmq.Context.instance()
        self.socket = self._connect()
        self.downloaded_bytes = 0

    def _connect(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        sock.connect(self.endpoint.url)
        return sock

    def opponents(self, num_envs: int) -> OpponentAssignment:
        """Draw this host's envs' opponents for a new alternation."""
        reply = self._request(MessageType.GET_OPPONENTS, {"num_envs": num_envs}, MessageType.OPPONENTS)
        digests, indices = reply.fields["digests"], reply.fields["indices"]
        env_opponent = reply.arrays.get("env_opponent")
        if (env_opponent is None or env_opponent.shape != (num_envs,) or env_opponent.dtype.kind != "u"
                or len(indices) != len(digests) or not all(isinstance(d, str) for d in digests)
                or not all(isinstance(i, int) for i in indices)):
            raise PoolError(f"pool server answered GET_OPPONENTS for {num_envs} envs with a malformed assignment "
                            f"({len(digests)} digests, {len(indices)} indices, env_opponent "
                            f"{None if env_opponent is None else (env_opponent.dtype.name, env_opponent.shape)}); "
                            f"expected uint env_opponent of shape ({num_envs},) into equally long digests and indices")
        if num_envs and int(env_opponent.max()) >= len(digests):
            raise PoolError(f"pool server answered GET_OPPONENTS with env_opponent up to {int(env_opponent.max())}, "
                            f"beyond its {len(digests)} digests")
        positions = env_opponent.tolist()
        return OpponentAssignment(alternation=reply.fields["alternation"],
                                  digests=tuple(digests[p] for p in positions),
                                  indices=tuple(indices[p] for p in positions))

    def snapshot(self, digest: str) -> bytes:
        """The snapshot file's bytes (the caller checks them against ``digest``)."""
        reply = self._request(MessageType.GET_SNAPSHOT, {"digest": digest}, MessageType.SNAPSHOT)
        data = reply.arrays.get("file")
        if data is None or reply.fields["digest"] != digest:
            raise PoolError(f"pool server answered GET_SNAPSHOT {digest[:12]} with another snapshot")
        self.downloaded_bytes += data.nbytes
        return data.tobytes()

    def _request(self, kind: MessageType, fields: dict, expected: MessageType) -> Message:
        self.socket.send_multipart(encode(Message(type=kind, sender=self.sender, fields=fields)))
        if not self.socket.poll(self.timeout_ms):
            self.socket.close(linger=0)  # a late answer must not be taken for the next request's
            self.socket = self._connect()
            raise PoolError(f"pool server {self.endpoint.url} did not answer {kind.value} within "
                            f"{self.timeout_ms / 1000:g} s")
        try:
            reply = decode(self.socket.recv_multipart(copy=False), self.limits)
        except ProtocolError as err:
            raise PoolError(f"bad answer from pool server {self.endpoint.url}: {err}") from err
        if reply.type is MessageType.ERROR:
            raise PoolError(f"pool server refused {kind.value}: {reply.fields['message']}")
        if reply.type is MessageType.SHUTDOWN:
            raise PoolError(f"pool server is shutting down: {reply.fields['reason']}")
        if reply.type is not expected:
            raise PoolError(f"pool server answered {kind.value} with {reply.type.value}")
        return reply

    def close(self) -> None:
        """Close the socket."""
        self.socket.close(linger=0)
