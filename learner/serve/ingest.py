"""Ingest: receive ROWS blocks over ZeroMQ, validate, drop stale rows, fill a double-buffered batch.

Two host-side batch buffers of ``segments`` rows each. The ingest thread fills one while the trainer
trains on the other; ownership passes as a buffer index through two queues (free -> filling -> ready ->
training -> free). When both buffers are taken the thread stops reading, the socket's high-water mark
fills, and actor hosts stop sending: back-pressure, never an unbounded queue.

Every message is checked before anything in it is counted or kept: it must come from a registered host (its
token in the ``SenderRegistry``, under the CURVE key that host registered with), carry at most
rows_per_message rows, match the row table's specs, and hold only values a real host produces
(``learner/serve/row_checks.py``). A refused message is counted under exactly one reason and logged at most once per
reason per 10 s (``protocol/reject_log.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import zmq

from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.rows import row_layout
from learner.update.batch import BatchBuffers
from learner.serve.control import curve_key_of
from learner.serve.row_checks import HostReport, RowRules, check_rows, read_report
from learner.serve.senders import Sender, SenderRegistry
from protocol.curve import ServerCurve
from protocol import Limits, Message, MessageType, ProtocolError, check_arrays, decode
from protocol.reject_log import RejectLog, peer_text

LOG = logging.getLogger("sluice.learner")
POLL_MS = 100


@dataclass(kw_only=True)
class IngestStats:
    """The ingest thread's counters, guarded by ``lock``. Only ``Ingest`` methods write them; the update loop
    gets them as an ``IngestSnapshot`` from ``Ingest.take_snapshot``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards every field below."""
    env_steps: int = 0
    """Env steps reported by actor hosts (one step of one environment, all its agents)."""
    agent_steps: int = 0
    """Agent steps reported by actor hosts (steps of active agents; what total_timesteps counts)."""
    env_restarts: int = 0
    """Env groups that raised and were rebuilt on actor hosts."""
    episodes: int = 0
    """Episodes finished."""
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=100))
    """Returns of the last 100 episodes."""
    recent_lengths: deque = field(default_factory=lambda: deque(maxlen=100))
    """Lengths of the last 100 episodes."""
    recent_stats: dict[str, deque] = field(default_factory=dict)
    """The env's named episode statistics, the last 100 values of each."""
    host_stats: Counter = field(default_factory=Counter)
    """Actor hosts' inference and worker timing counters (protocol.rows.HOST_STATS), since the last take."""
    rows_received: int = 0
    """Rows accepted into a batch."""
    rows_dropped: Counter = field(default_factory=Counter)
    """Rows dropped, by reason: stale (older than max_policy_lag) or future (newer than the learner's weights)."""
    messages_dropped: Counter = field(default_factory=Counter)
    """Messages rejected, by reason (each message under exactly one): the protocol's and row_checks' reasons,
    not_registered, identity_mismatch, too_large."""
    bytes_received: int = 0
    """Bytes of accepted and rejected data messages."""
    lag_sum: int = 0
    """Sum of policy lag over accepted rows (since last take)."""
    lag_max: int = 0
    """Max policy lag over accepted rows (since last take)."""
    lag_rows: int = 0
    """Rows behind lag_sum."""


@dataclass(frozen=True, kw_only=True)
class IngestSnapshot:
    """What the ingest has counted, as ``Ingest.take_snapshot`` hands it to the update loop."""

    env_steps: int
    """Env steps reported by actor hosts over the run (a resumed run's totals included)."""
    agent_steps: int
    """Agent steps reported by actor hosts over the run (what total_timesteps counts)."""
    episodes: int
    """Episodes finished over the run."""
    env_restarts: int
    """Env groups that raised and were rebuilt on actor hosts, since this learner started."""
    recent_returns: tuple[float, ...]
    """Returns of the last 100 episodes."""
    recent_lengths: tuple[int, ...]
    """Lengths of the last 100 episodes."""
    episode_stat_means: dict[str, float | None]
    """Mean of each of the env's named episode statistics over its last 100 values (None while there are none)."""
    rows_received: int
    """Rows accepted into a batch, since this learner started."""
    rows_dropped_stale: int
    """Rows dropped as older than max_policy_lag, since this learner started."""
    rows_dropped_future: int
    """Rows dropped as newer than the learner's weights, since this learner started."""
    messages_dropped: int
    """Messages rejected, all reasons together, since this learner started."""
    messages_dropped_by_reason: dict[str, int]
    """Messages rejected since this learner started, by reason (they add up to messages_dropped)."""
    policy_lag_mean: float
    """Mean policy lag of the rows accepted since the last take (0.0 when none were)."""
    policy_lag_max: int
    """Largest policy lag of the rows accepted since the last take (0 when none were)."""
    host_timing: dict[str, float | None]
    """Actor hosts' inference and worker figures since the last take (``host_timing`` of their host_stats)."""


@dataclass(frozen=True, kw_only=True)
class IngestTotals:
    """The ingest's cumulative counts, as ``Ingest.totals`` reads them."""

    env_steps: int
    """Env steps reported by actor hosts over the run (a resumed run's totals included)."""
    agent_steps: int
    """Agent steps reported by actor hosts over the run."""
    episodes: int
    """Episodes finished over the run."""
    env_restarts: int
    """Env groups rebuilt on actor hosts, since this learner started."""
    rows_received: int
    """Rows accepted into a batch, since this learner started."""
    rows_dropped: dict[str, int]
    """Rows dropped by reason (stale, future), since this learner started."""
    messages_dropped: dict[str, int]
    """Messages rejected by reason, since this learner started."""
    bytes_received: int
    """Bytes of data messages received (accepted or not), since this learner started."""


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
                 team_rows: bool = False, pinned: bool = False) -> None:
        """``team_rows``: rows hold one env's agents together (COMA, ``protocol.rows``); ``pinned``: the batch
        buffers in page-locked host memory (needs CUDA), for a learner that trains on a GPU."""
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
        self.segments = segments
        self.max_policy_lag = max_policy_lag
        self.limits = limits
        self.stop = stop
        self.stats = IngestStats()
        self.policy_version = 0
        self.buffers = [BatchBuffers.allocate(self.layout, segments, pinned=pinned) for _ in range(2)]
        self.free: queue.Queue[int] = queue.Queue()
        self.ready: queue.Queue[int] = queue.Queue()
        self.filled_rows = 0
        """Rows in the batch buffer being filled (written by the ingest thread only)."""
        for index in range(2):
            self.free.put(index)
        self.socket = context.socket(zmq.PULL)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.setsockopt(zmq.RCVHWM, hwm)
        self.socket.setsockopt(zmq.RCVBUF, buffer_bytes)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        self.socket.bind(endpoint)
        self.error: BaseException | None = None

    def resume_totals(self, *, env_steps: int, agent_steps: int, episodes: int,
                      recent_returns: Sequence[float]) -> None:
        """Continue counting from a checkpoint's totals; only before ``start()``."""
        if self.ident is not None:
            raise RuntimeError("Ingest.resume_totals() after start(): rows may already have been counted")
        with self.stats.lock:
            self.stats.env_steps = env_steps
            self.stats.agent_steps = agent_steps
            self.stats.episodes = episodes
            self.stats.recent_returns.extend(recent_returns)

    def totals(self) -> IngestTotals:
        """The cumulative counts as they are now, without starting the since-last-take figures again (safe from
        any thread; the metrics endpoint reads them at every scrape)."""
        stats = self.stats
        with stats.lock:
            return IngestTotals(env_steps=stats.env_steps, agent_steps=stats.agent_steps, episodes=stats.episodes,
                                env_restarts=stats.env_restarts, rows_received=stats.rows_received,
                                rows_dropped=dict(stats.rows_dropped), messages_dropped=dict(stats.messages_dropped),
                                bytes_received=stats.bytes_received)

    def take_snapshot(self) -> IngestSnapshot:
        """The counters as they are now; the since-last-take figures (policy lag, host timing) start again at
        zero, under the same lock. The update loop takes one per update."""
        stats = self.stats
        with stats.lock:
            snapshot = IngestSnapshot(
                env_steps=stats.env_steps,
                agent_steps=stats.agent_steps,
                episodes=stats.episodes,
                env_restarts=stats.env_restarts,
                recent_returns=tuple(stats.recent_returns),
                recent_lengths=tuple(stats.recent_lengths),
                episode_stat_means={name: float(np.mean(values)) if values else None
                                    for name, values in stats.recent_stats.items()},
                rows_received=stats.rows_received,
                rows_dropped_stale=stats.rows_dropped["stale"],
                rows_dropped_future=stats.rows_dropped["future"],
                messages_dropped=sum(stats.messages_dropped.values()),
                messages_dropped_by_reason=dict(stats.messages_dropped),
                policy_lag_mean=stats.lag_sum / max(1, stats.lag_rows),
                policy_lag_max=stats.lag_max,
                host_timing=host_timing(stats.host_stats),
            )
            stats.lag_sum = stats.lag_max = stats.lag_rows = 0
            stats.host_stats.clear()
        return snapshot

    def occupancy(self) -> dict[str, float]:
        """The batch buffers now: the fraction of the one being filled, and how many filled ones wait for the
        trainer (safe from any thread)."""
        return {"filling": self.filled_rows / self.segments, "ready": float(self.ready.qsize())}

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # surfaced to the trainer, which stops the run with it
            self.error = err
        finally:
            self.socket.close(linger=0)

    def _loop(self) -> None:
        index, filled = None, 0
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.stop.is_set():
            if index is None:
                try:
                    index, filled = self.free.get(timeout=POLL_MS / 1000), 0
                except queue.Empty:
                    continue
            if not poller.poll(POLL_MS):
                continue
            frames = self.socket.recv_multipart(copy=False)
            rows = self._accept(frames)
            if rows is None:
                continue
            buffer = self.buffers[index].arrays
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
                    self.ready.put(index)
                    # Rows left over from this block go to the next buffer when one is free.
                    index, filled = self._next_buffer()
                    self.filled_rows = filled
                    if index is None:
                        return
                    buffer = self.buffers[index].arrays  # the leftover rows go there, not into the ready one

    def _next_buffer(self) -> tuple[int | None, int]:
        while not self.stop.is_set():
            try:
                return self.free.get(timeout=POLL_MS / 1000), 0
            except queue.Empty:
                continue
        return None, 0

    def _accept(self, frames: list) -> dict[str, np.ndarray] | None:
        """Validate one message; returns its fresh rows, or None after counting why it was dropped."""
        nbytes = sum(len(f.buffer) for f in frames)
        if self.observer is not None:
            self.observer.message_received(nbytes)
        sender: object = None
        try:
            message = decode(frames, self.limits)
            sender = message.sender
            report = self._check(message, frames)
        except ProtocolError as err:
            with self.stats.lock:
                self.stats.messages_dropped[err.reason] += 1
                self.stats.bytes_received += nbytes
            self.rejects.reject(err.reason, err.message, sender=sender)
            return None
        lag = self.policy_version - message.arrays["versions"]
        future = lag < 0  # acted by weights this learner never had (a host still on a crashed run's policy)
        fresh = (lag <= self.max_policy_lag) & ~future
        with self.stats.lock:
            stats = self.stats
            stats.bytes_received += nbytes
            stats.env_steps += report.env_steps
            stats.agent_steps += report.agent_steps
            stats.env_restarts += report.env_restarts
            stats.host_stats.update(report.host_stats)
            for name, values in report.named_stats.items():
                stats.recent_stats.setdefault(name, deque(maxlen=100)).extend(values)
            stats.episodes += len(report.returns)
            stats.recent_returns.extend(report.returns)
            stats.recent_lengths.extend(report.lengths)
            stats.rows_dropped["stale"] += int((~fresh & ~future).sum())
            stats.rows_dropped["future"] += int(future.sum())
            stats.rows_received += int(fresh.sum())
            if fresh.any():
                stats.lag_sum += int(lag[fresh].sum())
                stats.lag_max = max(stats.lag_max, int(lag[fresh].max()))
                stats.lag_rows += int(fresh.sum())
        if not fresh.any():
            return None
        if self.observer is not None:
            self.observer.rows_accepted(lag[fresh])
        if fresh.all():
            return dict(message.arrays)
        return {name: array[fresh] for name, array in message.arrays.items()}

    def _check(self, message: Message, frames: list) -> HostReport:
        """What a decoded message reports, once it proved to be ROWS from a registered host with valid content;
        ProtocolError naming the first thing wrong otherwise (cheap checks first)."""
        if message.type is not MessageType.ROWS:
            raise ProtocolError("unexpected_type", f"data socket accepts rows, got {message.type.value}")
        sender = self._sender(message, frames)
        num_rows = message.fields["num_rows"]
        if num_rows > self.rules.rows_per_message:
            raise ProtocolError("too_large", f"num_rows {num_rows} is more than network.rows_per_message "
                                             f"({self.rules.rows_per_message})")
        if num_rows < 1:
            raise ProtocolError("bad_field", f"num_rows must be 1..{self.rules.rows_per_message}, got {num_rows}")
        check_arrays(message, self.specs)
        if num_rows != len(message.arrays["versions"]):
            raise ProtocolError("bad_field", f"num_rows {num_rows} but {len(message.arrays['versions'])} rows sent")
        check_rows(message.arrays, self.rules)
        return read_report(message, sender=sender, rules=self.rules, stat_names=self.stat_names)

    def _sender(self, message: Message, frames: list) -> Sender:
        """The registered host whose token the message carries, arriving under the CURVE key it registered with."""
        sender = self.registry.get(message.fields.get("token"))
        if sender is None:
            raise ProtocolError("not_registered", "the message carries no token of a registered actor host (a "
                                                  "host gets one when it registers, and loses it with BYE or silence)")
        if sender.curve_key is not None and curve_key_of(frames[0]) != sender.curve_key:
            raise ProtocolError("identity_mismatch", f"ROWS with the token of host {peer_text(sender.name)} arrived "
                                                     f"under another CURVE key than its registration")
        return sender


def host_timing(stats: dict[str, float]) -> dict[str, float | None]:
    """Inference and worker figures from summed ``host_stats``: batch size reached, ms per forward pass and
    per inference step, and the fraction of time env workers waited for actions (None where nothing came)."""
    batches = stats.get("inference_batches", 0.0)
    worker_s = stats.get("worker_wait_s", 0.0) + stats.get("worker_step_s", 0.0)
    return {
        "inference_batch_agents_mean": stats.get("inference_agents", 0.0) / batches if batches else None,
        "inference_ms_per_batch": 1000 * stats.get("inference_s", 0.0) / batches if batches else None,
        "act_ms_per_batch": 1000 * stats.get("act_s", 0.0) / batches if batches else None,
        "worker_wait_fraction": stats.get("worker_wait_s", 0.0) / worker_s if worker_s else None,
    }


def open_ingest(config: RunConfig, spec: EnvSpec, *, context: zmq.Context, endpoint: str, segments: int,
                state_size: int, stop: threading.Event, registry: SenderRegistry, curve: ServerCurve | None,
                observer: IngestObserver | None = None, pinned: bool = False) -> Ingest:
    """The ingest of a run's config: ``segments`` rows per batch (a learner rank's share under torchrun), bound at
    ``endpoint`` with the config's network limits; ``pinned`` host buffers when the learner trains on a GPU."""
    net = config.network
    return Ingest(context=context, endpoint=endpoint, segments=segments, env=spec,
                  horizon=config.trainer.bptt_horizon + 1, state_size=state_size,
                  max_policy_lag=config.trainer.max_policy_lag, hwm=net.send_queue_messages,
                  buffer_bytes=net.socket_buffer_bytes, limits=Limits(max_message_bytes=net.max_message_bytes),
                  stop=stop, registry=registry, rows_per_message=net.rows_per_message,
                  max_abs_value=net.max_abs_value, curve=curve, observer=observer,
                  team_rows=config.trainer.algorithm == "coma", pinned=pinned)
