"""A fake actor host that is genuine on the wire: it registers on the control socket, keeps its registration
alive with heartbeats, and sends valid ROWS blocks (the run's row layout, legal values, its token) on a PUSH
socket, only when the socket reports room.

The fuzz harness mutates its messages; the load benchmark runs many of them at full rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from configs.loader import config_from_dict
from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.registry import env_spec
from envs.rows import MessageSizing, message_sizing, run_row_layout
from policies.factory import make_policy
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode
from protocol.rows import RowLayout

HEARTBEAT_EVERY_S = 0.5
REGISTER_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """What a sender needs to know of the run to build valid rows."""

    config: RunConfig
    """The run's resolved config, as REGISTERED carries it."""
    spec: EnvSpec
    """The env's spec (spaces, agents, episode statistics)."""
    layout: RowLayout
    """The ROWS message's arrays."""
    sizing: MessageSizing
    """Rows per ROWS block the learner expects at most, and the data socket's high-water mark."""

    @classmethod
    def from_registration(cls, config: dict[str, Any]) -> RunShape:
        """The shape of the run whose REGISTERED reply carried ``config``."""
        run = config_from_dict(config)
        spec = env_spec(run.env)
        state_size = make_policy(spec, run.model).state_size
        layout = run_row_layout(run, spec, state_size=state_size)
        return cls(config=run, spec=spec, layout=layout, sizing=message_sizing(run, layout))


@dataclass(kw_only=True)
class SendCounts:
    """What one sender's PUSH socket took and refused."""

    messages: int = 0
    """Messages the socket took."""
    rows: int = 0
    """Rows in them."""
    polls: int = 0
    """Times the socket was asked whether it had room."""
    polls_full: int = 0
    """Times it had none (the learner's back-pressure)."""
    wait_s: float = 0.0
    """Seconds spent waiting for room."""


class RegisteredSender:
    """One registration (DEALER) and one data stream (PUSH) to a learner."""

    def __init__(self, context: zmq.Context, *, control_url: str, name: str, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.name = name
        self.control = context.socket(zmq.DEALER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.connect(control_url)
        registered = self._register()
        fields = registered.fields
        self.token: str | None = fields.get("token")
        self.run_id: str = fields["run_id"]
        self.version = registered.version
        self.shape = RunShape.from_registration(fields["config"])
        self.data = context.socket(zmq.PUSH)
        self.data.setsockopt(zmq.LINGER, 0)
        self.data.setsockopt(zmq.SNDHWM, self.shape.sizing.hwm)
        self.data.connect(fields["data_endpoint"])
        self.last_heartbeat = time.monotonic()
        self.counts = SendCounts()
        self.replies_refused: dict[str, int] = {}

    def _register(self) -> Message:
        self.control.send_multipart(encode(Message(type=MessageType.REGISTER, sender=self.name,
                                                   fields={"host": self.name, "num_workers": 1})))
        if not self.control.poll(int(REGISTER_TIMEOUT_S * 1000)):
            raise RuntimeError(f"sender {self.name}: no REGISTERED within {REGISTER_TIMEOUT_S:g} s")
        reply = decode(self.control.recv_multipart(), self.limits)
        if reply.type is not MessageType.REGISTERED:
            raise RuntimeError(f"sender {self.name}: registration answered with {reply.type.value} {reply.fields}")
        return reply

    def keep_alive(self) -> None:
        """Heartbeat when due and read the answers (their version is the learner's current policy version)."""
        now = time.monotonic()
        if now - self.last_heartbeat >= HEARTBEAT_EVERY_S:
            self.control.send_multipart(encode(Message(type=MessageType.HEARTBEAT, sender=self.name)))
            self.last_heartbeat = now
        while self.control.poll(0):
            try:
                reply = decode(self.control.recv_multipart(copy=False), self.limits)
            except ProtocolError as err:
                self.replies_refused[err.reason] = self.replies_refused.get(err.reason, 0) + 1
                continue
            if reply.type is MessageType.HEARTBEAT_ACK:
                self.version = max(self.version, reply.version)
            elif reply.type is MessageType.ERROR:
                reason = reply.fields["reason"]
                self.replies_refused[reason] = self.replies_refused.get(reason, 0) + 1

    def rows_message(self, rows: int, rng: np.random.Generator, *, seq: int = 0) -> Message:
        """A valid ROWS block of ``rows`` rows acted at the learner's current version, with this sender's token."""
        arrays = valid_rows(self.shape, rows, self.version, rng)
        agent_steps = rows * (self.shape.layout.horizon - 1)
        fields: dict[str, Any] = {"num_rows": rows, "episode_returns": [], "episode_lengths": [],
                                  "env_steps": max(1, agent_steps // self.shape.spec.num_agents),
                                  "agent_steps": agent_steps, "env_restarts": 0,
                                  "episode_stats": {name: [] for name in self.shape.spec.episode_stats}}
        if self.token is not None:
            fields["token"] = self.token
        return Message(type=MessageType.ROWS, sender=self.name, seq=seq, version=self.version, fields=fields,
                       arrays=arrays)

    def send(self, frames: list, *, timeout_s: float) -> bool:
        """Send ``frames`` once the PUSH socket has room; False when it had none for ``timeout_s``."""
        counts = self.counts
        started = time.monotonic()
        counts.polls += 1
        if not self.data.poll(0, zmq.POLLOUT):
            counts.polls_full += 1
            ready = self.data.poll(int(timeout_s * 1000), zmq.POLLOUT)
            counts.wait_s += time.monotonic() - started
            if not ready:
                return False
        try:  # never blocking: the learner may go away after the poll (a blocking send would wait for it forever)
            self.data.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        counts.messages += 1
        return True

    def close(self) -> None:
        """Say BYE and close both sockets."""
        try:
            self.control.send_multipart(encode(Message(type=MessageType.BYE, sender=self.name)), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        self.control.close(linger=100)
        self.data.close(linger=0)


def valid_rows(shape: RunShape, rows: int, version: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``rows`` rows of legal values for the run's layout: in-range actions, all actions legal, zero rewards and
    values, no episode ends, the log-probability of a uniform policy, observations of 0s and 1s."""
    layout, spec = shape.layout, shape.spec
    arrays = layout.allocate(rows)
    arrays["obs"][...] = rng.integers(0, 2, size=arrays["obs"].shape).astype(arrays["obs"].dtype)
    if spec.action.kind == "box":
        arrays["actions"][...] = 0.0
        logprob = 0.0
    else:
        nvec = np.asarray(spec.action.nvec).reshape(spec.action.shape or ())
        arrays["actions"][...] = (rng.random(arrays["actions"].shape) * nvec).astype(arrays["actions"].dtype)
        logprob = -float(np.sum(np.log(nvec)))
    arrays["action_masks"][...] = 1
    arrays["logprobs"][...] = logprob if math.isfinite(logprob) else 0.0
    for name in ("values", "rewards", "bootstrap", "states"):
        arrays[name][...] = 0.0
    arrays["dones"][...] = 0
    arrays["versions"][...] = version
    return arrays
