"""Ingest: receive ROWS blocks over ZeroMQ, validate, drop stale rows, fill a double-buffered batch.

The rows go into ``BatchSlots`` (learner/serve/batch_slots.py: two buffers, one filling while the update loop
trains on the other, ownership passed as an index; back-pressure when both are taken). What the hosts report and
what became of each message is counted by ``IngestCounters`` (learner/serve/ingest_counters.py), the counters'
only writer; the update loop reads them through ``counters``.

Every message is checked before anything in it is counted or kept: it must come from a registered host (its
token in the ``SenderRegistry``, under the CURVE key that host registered with), carry at most
rows_per_message rows, match the row table's specs, and hold only values a real host produces
(``learner/serve/row_checks.py``). A refused message is counted under exactly one reason and logged at most once per
reason per 10 s (``protocol/reject_log.py``). Rows carrying the token of a registration that is gone (the host
said BYE, was forgotten or registered anew: rows already on their way) are counted under their own reason,
``host_left`` (HOST_LEFT), which the console's drop summary and the dropped-messages alert leave out, and logged as the
normal event they are, at INFO ("late rows from actor host 'x', which left (N messages dropped)"); a token never
registered stays a refusal (not_registered).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import numpy as np
import zmq

from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.rows import message_sizing, row_layout, run_row_layout
from learner.serve.batch_slots import BatchSlots
from learner.serve.control import curve_key_of
from learner.serve.ingest_counters import HOST_LEFT, IngestCounters
from learner.serve.row_checks import HostReport, RowRules, check_rows, read_report
from learner.serve.senders import Sender, SenderRegistry
from learner.serve.shared_rows_reader import SharedRowsReader, message_arrays
from protocol.curve import ServerCurve
from protocol import Limits, Message, MessageType, ProtocolError, check_arrays, decode
from protocol.reject_log import RejectLog, peer_text
from protocol.same_machine import IpcRoute, bind_ipc, data_ipc_path, remove_ipc_file

LOG = logging.getLogger("sluice.learner")
POLL_MS = 100
TOKENS_REMEMBERED = 4096
"""Tokens rows were accepted with, remembered (the newest) to tell late rows of a host that left from a refusal."""


class IngestObserver(Protocol):
    """What the ingest thread reports as it goes (the learner's Prometheus metrics implement it)."""

    def message_received(self, nbytes: int) -> None:
        """A data message of ``nbytes`` arrived (accepted or not)."""

    def rows_accepted(self, lags: np.ndarray) -> None:
        """Rows with these policy lags were accepted."""


class Ingest(threading.Thread):
    """The data socket's only user: PULL bound at ``endpoint``; fills batches of ``segments`` rows."""

    def __init__(self, *, context: zmq.Context, endpoint: str, segments: int, env: EnvSpec, horizon: int,
                 state_size: int, max_policy_lag: int, hwm: int, buffer_bytes: int, limits: Limits,
                 stop: threading.Event, registry: SenderRegistry, rows_per_message: int, max_abs_value: float,
                 curve: ServerCurve | None = None, observer: IngestObserver | None = None,
                 team_rows: bool = False, pinned: bool = False, ipc_path: Path | None = None,
                 shared_rows: bool = False) -> None:
        """``team_rows``: rows hold one env's agents together (COMA, ``protocol.rows``); ``pinned``: the batch
        buffers in page-locked host memory (needs CUDA), for a learner that trains on a GPU; ``ipc_path``: the same
        socket also bound at ``ipc://ipc_path``, for actor hosts on this machine (protocol/same_machine.py);
        ``shared_rows``: with ``ipc_path``, hosts there may leave their rows in shared memory
        (protocol/shared_rows.py)."""
        super().__init__(name="ingest", daemon=True)
        self.observer = observer
        self.layout = row_layout(env, horizon=horizon, state_size=state_size, team=team_rows)
        self.specs = self.layout.specs()
        self.stat_names = env.episode_stats
        self.registry = registry
        self.rules = RowRules(action=env.action, mask_size=env.mask_size, bptt_horizon=horizon - 1,
                              rows_per_message=rows_per_message, max_abs_value=max_abs_value,
                              agents_per_row=env.num_agents if team_rows else 1, team_rows=team_rows)
        self.rejects = RejectLog(LOG, what="ROWS message")
        self.tokens_seen: OrderedDict[str, Sender] = OrderedDict()
        """The registrations rows were accepted from (TOKENS_REMEMBERED newest; the ingest thread's)."""
        self.segments = segments
        self.max_policy_lag = max_policy_lag
        self.limits = limits
        self.stop = stop
        self.counters = IngestCounters()
        """What the hosts reported and what became of each message; the update loop reads it."""
        self.slots = BatchSlots(self.layout, segments, pinned=pinned)
        """The batch buffers: the update loop takes full ones with ``slots.next_full`` and gives them back."""
        self._policy_version = 0
        self.filled_rows = 0
        """Rows in the batch buffer being filled (written by the ingest thread only)."""
        self.socket = context.socket(zmq.PULL)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.setsockopt(zmq.RCVHWM, hwm)
        self.socket.setsockopt(zmq.RCVBUF, buffer_bytes)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        self.socket.bind(endpoint)
        self.ipc: IpcRoute | None = None if ipc_path is None else bind_ipc(self.socket, ipc_path)
        """Where the socket also listens for hosts on this machine, announced in REGISTERED (None: TCP only)."""
        self.shared = SharedRowsReader(registry) if shared_rows and self.ipc is not None else None
        """The hosts' shared-memory rows segments (None: rows come in the messages only)."""
        self.error: BaseException | None = None

    def resume_totals(self, *, env_steps: int, agent_steps: int, episodes: int,
                      recent_returns: list[float]) -> None:
        """Continue counting from a checkpoint's totals; only before ``start()``."""
        if self.ident is not None:
            raise RuntimeError("Ingest.resume_totals() after start(): rows may already have been counted")
        self.counters.resume(env_steps=env_steps, agent_steps=agent_steps, episodes=episodes,
                             recent_returns=recent_returns)

    @property
    def policy_version(self) -> int:
        """The learner's current policy version: rows acted by an older one are lagging, by a newer one "future"."""
        return self._policy_version

    def set_policy_version(self, version: int) -> None:
        """The update loop published (or resumed) weights of ``version``; rows are aged against it from now on."""
        self._policy_version = version

    def occupancy(self) -> dict[str, float]:
        """The batch buffers now: the fraction of the one being filled, and how many filled ones wait for the
        trainer (safe from any thread)."""
        return {"filling": self.filled_rows / self.segments, "ready": float(self.slots.full_count())}

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # surfaced to the trainer, which stops the run with it
            self.error = err
        finally:
            self.socket.close(linger=0)
            if self.ipc is not None:
                remove_ipc_file(self.ipc)
            if self.shared is not None:
                self.shared.close()

    def _loop(self) -> None:
        index, filled = None, 0
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.stop.is_set():
            if index is None:
                index, filled = self.slots.next_free(POLL_MS / 1000), 0
                continue
            if self.shared is not None:
                self.shared.sweep(time.monotonic())
            if not poller.poll(POLL_MS):
                continue
            frames = self.socket.recv_multipart(copy=False)
            try:
                index, filled = self._take(frames, index, filled)
            finally:
                if self.shared is not None:
                    self.shared.release()  # the rows are copied out (or dropped): the host may fill the slot again
            if index is None:
                return

    def _take(self, frames: list, index: int, filled: int) -> tuple[int | None, int]:
        """Accept one message's rows into the batch buffer ``index`` holding ``filled`` rows, and into the next one
        when it fills; the buffer being filled then, and its rows (None: stopped while waiting for a free one)."""
        rows = self._accept(frames)
        if rows is not None:
            buffer = self.slots.buffers[index].arrays
            start = 0
            total = len(rows["versions"])
            while start < total:
                take = min(total - start, self.segments - filled)
                for name, array in rows.items():
                    buffer[name][filled:filled + take] = array[start:start + take]
                filled += take
                start += take
                self.filled_rows = filled
                if filled == self.segments:
                    self.slots.mark_full(index)
                    # Rows left over from this block go to the next buffer when one is free.
                    next_index, filled = self._next_buffer(), 0
                    self.filled_rows = filled
                    if next_index is None:
                        return None, 0
                    index = next_index
                    buffer = self.slots.buffers[index].arrays  # the leftover rows go there, not into the full one
        return index, filled

    def _next_buffer(self) -> int | None:
        while not self.stop.is_set():
            index = self.slots.next_free(POLL_MS / 1000)
            if index is not None:
                return index
        return None

    def _accept(self, frames: list) -> dict[str, np.ndarray] | None:
        """Validate one message; returns its fresh rows, or None after counting why it was dropped."""
        nbytes = sum(len(f.buffer) for f in frames)
        if self.observer is not None:
            self.observer.message_received(nbytes)
        sender: object = None
        message: Message | None = None
        try:
            message = decode(frames, self.limits)
            sender = message.sender
            message, report = self._check(message, frames)
        except ProtocolError as err:
            gone = self._gone(err, message, frames)
            if gone is not None:
                self.counters.refused(HOST_LEFT, nbytes)
                self.rejects.expected(gone.token, f"late rows from actor host {peer_text(gone.name)}, which left")
            else:
                self.counters.refused(err.reason, nbytes)
                self.rejects.reject(err.reason, err.message, sender=sender)
            return None
        lag = self._policy_version - message.arrays["versions"]
        future = lag < 0  # acted by weights this learner never had (a host still on a crashed run's policy)
        fresh = (lag <= self.max_policy_lag) & ~future
        self.counters.accepted(report, nbytes=nbytes, fresh_lags=lag[fresh], stale=int((~fresh & ~future).sum()),
                               future=int(future.sum()))
        if not fresh.any():
            return None
        if self.observer is not None:
            self.observer.rows_accepted(lag[fresh])
        if fresh.all():
            return dict(message.arrays)
        return {name: array[fresh] for name, array in message.arrays.items()}

    def _check(self, message: Message, frames: list) -> tuple[Message, HostReport]:
        """The message with its arrays (read from shared memory when its ``shared`` field names them there), and
        what it reports, once it proved to be ROWS from a registered host with valid content; ProtocolError naming
        the first thing wrong otherwise (cheap checks first)."""
        if message.type is not MessageType.ROWS:
            raise ProtocolError("unexpected_type", f"data socket accepts rows, got {message.type.value}")
        sender = self._sender(message, frames)
        if "shared" in message.fields:
            message = dataclasses.replace(message, arrays=message_arrays(message, sender, self.shared))
        num_rows = message.fields["num_rows"]
        if num_rows > self.rules.rows_per_message:
            raise ProtocolError("too_large", f"num_rows {num_rows} is more than the {self.rules.rows_per_message} "
                                             f"rows a message may carry (network.rows_per_message, message_bytes)")
        if num_rows < 1:
            raise ProtocolError("bad_field", f"num_rows must be 1..{self.rules.rows_per_message}, got {num_rows}")
        check_arrays(message, self.specs)
        if num_rows != len(message.arrays["versions"]):
            raise ProtocolError("bad_field", f"num_rows {num_rows} but {len(message.arrays['versions'])} rows sent")
        check_rows(message.arrays, self.rules)
        return message, read_report(message, sender=sender, rules=self.rules, stat_names=self.stat_names)

    def _gone(self, err: ProtocolError, message: Message | None, frames: list) -> Sender | None:
        """The registration, now gone, whose token a not_registered message carries (under the CURVE key it
        registered with); None for any other refusal."""
        if err.reason != "not_registered" or message is None:
            return None
        token = message.fields.get("token")
        gone = self.tokens_seen.get(token) if isinstance(token, str) else None
        if gone is None or gone.curve_key is not None and curve_key_of(frames[0]) != gone.curve_key:
            return None
        return gone

    def _sender(self, message: Message, frames: list) -> Sender:
        """The registered host whose token the message carries, arriving under the CURVE key it registered with."""
        sender = self.registry.get(message.fields.get("token"))
        if sender is not None and sender.token not in self.tokens_seen:
            self.tokens_seen[sender.token] = sender
            while len(self.tokens_seen) > TOKENS_REMEMBERED:
                self.tokens_seen.popitem(last=False)
        if sender is None:
            raise ProtocolError("not_registered", "the message carries no token of a registered actor host (a "
                                                  "host gets one when it registers, and loses it with BYE or silence)")
        if sender.curve_key is not None and curve_key_of(frames[0]) != sender.curve_key:
            raise ProtocolError("identity_mismatch", f"ROWS with the token of host {peer_text(sender.name)} arrived "
                                                     f"under another CURVE key than its registration")
        return sender


def open_ingest(config: RunConfig, spec: EnvSpec, *, context: zmq.Context, endpoint: str, segments: int,
                state_size: int, stop: threading.Event, registry: SenderRegistry, curve: ServerCurve | None,
                observer: IngestObserver | None = None, pinned: bool = False, rank: int | None = None) -> Ingest:
    """The ingest of a run's config: ``segments`` rows per batch (a learner rank's share under torchrun), bound at
    ``endpoint`` with the config's network limits; ``pinned`` host buffers when the learner trains on a GPU; with
    ``rank`` and network.same_machine_ipc, also bound at ipc:///tmp/sluice_<pid>_data<rank>, where hosts leave their
    rows in shared memory with network.shared_memory_rows."""
    net = config.network
    ipc_path = data_ipc_path(os.getpid(), rank) if rank is not None and net.same_machine_ipc else None
    sizing = message_sizing(config, run_row_layout(config, spec, state_size=state_size))
    return Ingest(context=context, endpoint=endpoint, segments=segments, env=spec,
                  horizon=config.trainer.bptt_horizon + 1, state_size=state_size,
                  max_policy_lag=config.trainer.max_policy_lag, hwm=sizing.hwm,
                  buffer_bytes=net.socket_buffer_bytes, limits=Limits(max_message_bytes=net.max_message_bytes),
                  stop=stop, registry=registry, rows_per_message=sizing.rows,
                  max_abs_value=net.max_abs_value, curve=curve, observer=observer,
                  team_rows=config.trainer.algorithm == "coma", pinned=pinned, ipc_path=ipc_path,
                  shared_rows=net.shared_memory_rows)
