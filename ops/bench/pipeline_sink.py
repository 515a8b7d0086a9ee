"""The stand-in for the learner's ingest in ``ops.bench.pipeline``: receive every ROWS message, decode it, read its
payload from the host's shared memory when it lies there (``--transport shm``), copy its rows out once into a reused
buffer as the ingest copies them into its batch, and count it. Nothing is validated or trained on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from learner.serve.senders import SenderRegistry
from learner.serve.shared_rows_reader import SharedRowsReader, message_arrays
from protocol import Limits, MessageType, ProtocolError, decode


@dataclass
class SinkCounters:
    """What the sink has received (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    messages: int = 0
    shared: int = 0
    rejected: int = 0
    rows: int = 0
    bytes: int = 0
    agent_steps: int = 0
    env_steps: int = 0
    host_stats: dict[str, float] = field(default_factory=dict)

    def snapshot(self) -> dict:
        with self.lock:
            return {"messages": self.messages, "shared": self.shared, "rejected": self.rejected, "rows": self.rows,
                    "bytes": self.bytes, "agent_steps": self.agent_steps, "env_steps": self.env_steps,
                    "host_stats": dict(self.host_stats)}


class Sink:
    """The drain thread's work: ``run`` until ``stop`` is set."""

    def __init__(self, socket: zmq.Socket, limits: Limits, *, registry: SenderRegistry, shared_rows: bool) -> None:
        self.socket, self.limits, self.registry = socket, limits, registry
        self.reader = SharedRowsReader(registry) if shared_rows else None
        self.counters = SinkCounters()
        self.scratch = np.empty(limits.max_message_bytes, dtype=np.uint8)  # pages are touched as used
        """Where every message's rows are copied once, as the ingest copies them into its batch buffer."""

    def run(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        try:
            while not stop.is_set():
                if not poller.poll(100):
                    continue
                frames = self.socket.recv_multipart(copy=False)
                try:
                    self._take(frames)
                finally:
                    if self.reader is not None:
                        self.reader.release()
        finally:
            if self.reader is not None:
                self.reader.close()

    def _take(self, frames: list) -> None:
        nbytes = sum(len(f.buffer) for f in frames)
        try:
            message = decode(frames, self.limits)
            if message.type is not MessageType.ROWS:
                return
            sender = self.registry.get(message.fields.get("token"))
            arrays = message_arrays(message, sender, self.reader)
        except ProtocolError:
            with self.counters.lock:
                self.counters.rejected += 1
            return
        offset = 0
        for array in arrays.values():
            flat = array.reshape(-1).view(np.uint8)
            self.scratch[offset:offset + len(flat)] = flat
            offset += len(flat)
        counters, fields = self.counters, message.fields
        with counters.lock:
            counters.messages += 1
            counters.shared += "shared" in fields
            counters.bytes += nbytes
            counters.rows += fields["num_rows"]
            counters.agent_steps += fields["agent_steps"]
            counters.env_steps += fields["env_steps"]
            for name, value in fields.get("host_stats", {}).items():
                counters.host_stats[name] = counters.host_stats.get(name, 0.0) + value


def accepted_transports(monitor: zmq.Socket) -> set[str]:
    """The schemes (tcp, ipc) of the sink's endpoints that accepted a connection, from its monitor's events."""
    schemes: set[str] = set()
    while monitor.poll(0):
        event = recv_monitor_message(monitor)
        if event["event"] == zmq.EVENT_ACCEPTED:
            schemes.add(event["endpoint"].decode().partition("://")[0])
    return schemes
