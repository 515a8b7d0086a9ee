"""The actor host's main loop: one poll, then a short sequence of named steps, until told to stop.

``actors/wiring.py`` builds every part and hands them here connected: LearnerLink (sockets) -> WorkerPool
(processes over shared memory) -> GroupStepper (policy, RowAssembler) -> LearnerLink. The workers' answers come
through counters in shared memory (``actors/handoff.py``), so a turn that has work makes no system call to learn
them; it polls the sockets and the worker pipes (env errors, deaths) without waiting, at most every POLL_PERIOD_S.
A turn that found nothing to do waits in the poll on every worker pipe and socket, with the workers told to write
to their pipe when they answer, so the host never busy-waits. Back-pressure: when the learner stops taking
rows, the PUSH socket's high-water mark fills, full rows pile up in the assembler, and once it cannot accept
another batch the host stops handing out actions, so the env workers pause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from actors.alternation import OpponentAlternation
from actors.env_failures import EnvErrorReport
from actors.host_metrics import HostMetrics, HostView
from actors.learner_link import WAITING_NOTICE_S, LearnerLink, Registration, read_data_endpoints
from actors.rows_report import RowsReport
from actors.shared_rows_out import WAIT, SharedRowsOut, Slot
from actors.stepper import GroupStepper
from actors.stop_flag import StopFlag
from actors.worker_pool import WorkerPool
from configs.schema import NetworkSection
from envs.rows import MessageSizing
from protocol import Message, MessageType, PackedArrays

LOG = logging.getLogger("sluice.actors")
POLL_MS = 20
"""Longest wait in the poll of a turn after an idle one (a worker's answer, a socket's message end it sooner)."""
POLL_PERIOD_S = 0.001
"""While every turn has work, the sockets and worker pipes are polled (without waiting) at most this often."""
CONTROL_CHECK_S = 0.001
"""The control and weights sockets are read when the poll says they are readable, else at most this often: a loop
turn that only hands out actions makes no system call for them."""
FLUSH_AFTER_S = 0.05
"""Full rows older than this go out even when they do not fill a message."""
MAX_KEYS_SHOWN = 3
"""Differing config keys named when the learner's config changed."""


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Each dotted key whose value differs between two config dicts as ``key: old -> new``, in ``old``'s
    order, then ``new``'s (a missing key shows as ``-``)."""
    differences = []
    for key in [*old, *(k for k in new if k not in old)]:
        name = f"{prefix}{key}"
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            differences.extend(config_differences(before, after, prefix=f"{name}."))
        elif before != after or (key in old) != (key in new):
            shown = [repr(value) if key in side else "-" for value, side in ((before, old), (after, new))]
            differences.append(f"{name}: {shown[0]} -> {shown[1]}")
    return differences


def weight_shapes(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Name and shape of each weight array (weights of another model differ in one or the other)."""
    return {name: tuple(array.shape) for name, array in arrays.items()}


def describe_config_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first few differences between two config dicts, for one line of output."""
    differences = config_differences(old, new)
    more = len(differences) - MAX_KEYS_SHOWN
    return ", ".join(differences[:MAX_KEYS_SHOWN]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True, slots=True)
class UnsentRows:
    """A built ROWS message that waits for the data socket, and what it counts once sent."""

    message: Message
    """The message, rows and report fields in it."""
    report: RowsReport
    """The report its fields came from (the host metrics count it when it goes out)."""
    rows: int
    """Rows it carries."""
    packed: PackedArrays | None
    """The one buffer its arrays are views of, sent as one frame (None: one frame per array)."""


@dataclass(kw_only=True)
class LoopState:
    """What the host's loop carries from one iteration to the next."""

    run_id: str
    """Identity of the learner run the host registered with (another one means the learner restarted)."""
    last_heartbeat: float
    """Monotonic time the last heartbeat went out."""
    last_reply: float
    """Monotonic time the learner last answered on the control socket (0: register again now)."""
    last_flush: float
    """Monotonic time rows were last shipped."""
    report: RowsReport
    """What the next ROWS message reports besides its rows."""
    env_error_sent: EnvErrorReport | None = None
    """The env error the last heartbeat carried (each new one goes to the learner once)."""
    next_control_check: float = 0.0
    """Monotonic time the control and weights sockets are next read even if the poll did not mark them."""
    unsent: UnsentRows | None = None
    """A ROWS message the data socket refused (its learner rank went away after the socket said it had room)."""
    next_poll: float = 0.0
    """Monotonic time a turn with work next polls the sockets and worker pipes."""
    warm: bool = False
    """Rows went out once: every kernel the loop calls is loaded (compiled) by then."""


class ActorHost:
    """One host's actors for one learner, built by ``actors.wiring.build_host``."""

    def __init__(self, *, link: LearnerLink, registration: Registration, network: NetworkSection,
                 sizing: MessageSizing, workers: WorkerPool, stepper: GroupStepper,
                 alternation: OpponentAlternation | None, poller: zmq.Poller, stop: StopFlag,
                 metrics: HostMetrics, shared_rows: SharedRowsOut | None) -> None:
        self.link = link
        self.shared_rows = shared_rows
        """The slots ROWS payloads go through to a learner on this machine (when ``link.rows_through_memory``; None:
        this host's messages are smaller than network.shared_rows_min_bytes)."""
        self.metrics = metrics
        self.config = registration.config
        """The resolved run config (as registration sent it) that this host was built for."""
        self.weight_shapes = weight_shapes(registration.weights)
        """Name and shape of every weight array of the model this host was built for."""
        self.network = network
        self.sizing = sizing
        """Rows per ROWS message (the learner refuses more) and the data socket's high-water mark."""
        self.workers = workers
        self.stepper = stepper
        self.assembler = stepper.assembler
        self.inference = stepper.inference
        self.alternation = alternation
        self.poller = poller
        self.stop = stop
        self.groups_per_batch = stepper.layout.workers
        """Ready groups decided for in one forward pass, at most (one per worker: batch_size_envs envs)."""
        now = time.monotonic()
        self.state = LoopState(run_id=registration.run_id, last_heartbeat=now, last_reply=now, last_flush=now,
                               report=RowsReport.for_stats(stepper.env_spec.episode_stats))
        metrics.attach(self.view)

    def view(self) -> HostView:
        """What this host holds now (read by the metrics endpoint's thread at each scrape)."""
        return HostView(policy_version=self.inference.version, workers=self.workers.layout.workers,
                        worker_restarts=sum(worker.restarts for worker in self.workers.workers),
                        rows_waiting=self.assembler.full_rows(), ready_groups=len(self.workers.ready))

    def run(self) -> Registration | None:
        """Run until the learner says stop, a signal arrives, or the learner is gone and the host is stopped
        (None), or until it registered again with a learner that runs a different config: that registration
        is returned, and ``run_host`` builds a new host for it.

        An ``EnvFailure`` (an env that cannot run, a worker in a crash loop) propagates: ``run_host``'s BYE
        carries it to the learner as the reason the host left."""
        busy = True
        while not self.stop.is_set():
            events = self._poll(busy)
            with self._until_warm():
                self.workers.collect(events, self.state.report)
            now = time.monotonic()
            if self._control_due(now, events):
                self._send_heartbeat(now)
                self._read_control_replies(now)
                self._apply_broadcast()
                if now - self.state.last_reply > self.network.peer_timeout_s and not self.stop.is_set():
                    registration = self._register_again()
                    if registration is None:
                        return None
                    if registration.config != self.config:
                        print(f"actors: the learner at {self.link.learner.url} now runs a different config "
                              f"({describe_config_change(self.config, registration.config)}): rebuilding this "
                              f"host for it", flush=True)
                        return registration
                    self._reconnect(registration)
                    continue
                if self.alternation is not None:
                    self.alternation.maybe_next(self.stepper.env_steps)
            with self._until_warm():
                acted = self._act_on_ready_groups()
                shipped = self._ship_rows(now)
            self.state.warm = self.state.warm or shipped
            busy = shipped or acted

    def _until_warm(self) -> AbstractContextManager[None]:
        """Until the first rows went out: heartbeats from a thread while the loop's first turns take the answers,
        act and ship (numba loads, or on a cold cache compiles, the kernels they call for the first time: seconds
        without a heartbeat otherwise). No control-socket use happens inside."""
        if self.state.warm:
            return nullcontext()
        return self.link.heartbeats_meanwhile(self.network.heartbeat_interval_s)

    def _poll(self, busy: bool) -> dict:
        """What the poll marks readable (sockets, worker pipes). After a turn with work: a look without waiting, at
        most every POLL_PERIOD_S (nothing between: the workers' answers come through the handoff counters). After
        an idle turn, unless answers came in meanwhile: a wait of up to POLL_MS that a worker's answer ends
        (``WorkerPool.wait``)."""
        now = time.monotonic()
        if not busy and not self.workers.take_answers():
            self.state.next_poll = now + POLL_PERIOD_S
            return self.workers.wait(POLL_MS)
        if now < self.state.next_poll:
            return {}
        self.state.next_poll = now + POLL_PERIOD_S
        return dict(self.poller.poll(0))

    def _control_due(self, now: float, events: dict) -> bool:
        """Whether this turn reads the control and weights sockets (and sends a due heartbeat, checks the learner's
        silence and the self-play alternation): when the poll marked either socket, or ``CONTROL_CHECK_S`` after
        the last time."""
        if now < self.state.next_control_check and self.link.control not in events and self.link.weights not in events:
            return False
        self.state.next_control_check = now + CONTROL_CHECK_S
        return True

    def _send_heartbeat(self, now: float) -> None:
        """Every heartbeat interval; it carries the workers' latest env error if the learner has not had it."""
        if now - self.state.last_heartbeat < self.network.heartbeat_interval_s:
            return
        fields = {}
        error = self.workers.last_env_error
        if error is not None and error != self.state.env_error_sent:
            fields["env_error"] = error.fields()
            self.state.env_error_sent = error
        self.link.send_heartbeat(fields)
        self.state.last_heartbeat = now

    def _read_control_replies(self, now: float) -> None:
        """SHUTDOWN stops the host; a learner that forgot it or restarted makes it register again now."""
        while (reply := self.link.recv_control()) is not None:
            self.state.last_reply = now
            self.metrics.learner_answered()
            if reply.type is MessageType.SHUTDOWN:
                self.stop.request(f"learner: {reply.fields['reason']}")
            elif reply.type is MessageType.REGISTERED:  # answers a REGISTER queued while the learner was away
                if not self.link.adopt_late_registration(reply, self.state.run_id):
                    self.state.last_reply = 0.0
            elif reply.type is MessageType.ERROR and (reply.fields.get("refused") == MessageType.REGISTER.value
                                                      or self.link.refuses_an_earlier_registration(reply)):
                LOG.debug("learner refused a message sent before this registration: %s", reply.fields["message"])
            elif reply.type is MessageType.ERROR:
                LOG.warning("learner error: %s", reply.fields["message"])
                if reply.fields.get("reason") == "not_registered":  # forgotten, or a restarted learner: register now
                    self.state.last_reply = 0.0
            elif (reply.type is MessageType.HEARTBEAT_ACK
                  and reply.fields.get("run_id", self.state.run_id) != self.state.run_id):
                LOG.warning("learner restarted; registering again")
                self.state.last_reply = 0.0
            elif reply.type is MessageType.HEARTBEAT_ACK:
                self._follow_routes(read_data_endpoints(reply.fields.get("data_endpoints")))

    def _follow_routes(self, endpoints: tuple[str, ...] | None) -> None:
        """Several learner ranks: push rows to the ranks the learner now routes this host to."""
        if endpoints and self.link.data is not None and self.link.route_data(endpoints):
            if self.shared_rows is not None:
                self.shared_rows.renew()  # the rows queued for a rank left behind are lost, their slots with them
            print(f"actors: rows now go to learner ranks at {', '.join(self.link.resolve(url) for url in endpoints)}",
                  flush=True)

    def _apply_broadcast(self) -> None:
        """The newest weights the learner published, or its SHUTDOWN."""
        broadcast = self.link.latest_broadcast()
        if broadcast is not None and broadcast.type is MessageType.SHUTDOWN:
            self.stop.request(f"learner: {broadcast.fields['reason']}")
        elif broadcast is not None and weight_shapes(broadcast.arrays) != self.weight_shapes:
            LOG.warning("the learner published weights of another model; registering again")
            self.state.last_reply = 0.0  # a learner restarted with another config: register, then rebuild
        elif broadcast is not None and broadcast.version > self.inference.version:
            self.inference.load(broadcast.version, dict(broadcast.arrays))

    def _register_again(self) -> Registration | None:
        """The learner went silent or restarted: register again (None: told to stop first)."""
        silent_s = time.monotonic() - self.state.last_reply if self.state.last_reply else 0.0
        why = f"silent for {silent_s:.0f} s (paused, cut off or stopped)" if silent_s else "does not know this host"
        print(f"actors: the learner {why}; registering again", flush=True)
        registration = self.link.register(retry_s=1.0, should_stop=self.stop.is_set, first_notice_s=WAITING_NOTICE_S)
        if registration is not None:
            self.metrics.registered()
        elif self.link.shutdown_reason is not None:
            self.stop.request(f"learner: {self.link.shutdown_reason}")
        return registration

    def _reconnect(self, registration: Registration) -> None:
        """Registered again with the same config: reconnect the streams and take the learner's weights."""
        self.poller.unregister(self.link.weights)  # open_streams replaces the weights socket
        self.link.open_streams(registration, hwm=self.sizing.hwm,
                               buffer_bytes=self.network.socket_buffer_bytes)
        self.poller.register(self.link.weights, zmq.POLLIN)
        self.inference.load(registration.version, registration.weights)
        self.state.run_id, self.state.last_reply = registration.run_id, time.monotonic()
        print("actors: registered again", flush=True)

    def _act_on_ready_groups(self) -> bool:
        """Decide for the ready groups (one worker's worth per group at most) and wake their workers, which step
        while the stepper records; nothing is handed out once the assembler could not take the steps
        (back-pressure). Whether any group was handed out."""
        ready = self.workers.ready
        steps_per_group = self.stepper.steps_per_group
        acted = False
        while ready and not self.stop.is_set():
            take = min(len(ready), self.groups_per_batch)
            if not self.assembler.can_accept(take * steps_per_group):
                break
            batch = [ready.popleft() for _ in range(take)]
            self.stepper.act(batch, self.state.report, wake=self.workers.wake)
            acted = True
        return acted

    def _ship_rows(self, now: float) -> bool:
        """Send full rows in blocks while the data socket has room; a block it refused goes first next turn.
        Whether a block was built."""
        rows_per_message = self.sizing.rows
        built = False
        while self._send_unsent():
            full = self.assembler.full_rows()
            due = full >= rows_per_message or (full > 0 and now - self.state.last_flush > FLUSH_AFTER_S)
            if not due:
                return built
            if not self.link.can_send_rows():
                self.metrics.send_blocked.inc()
                return built
            slot = (self.shared_rows.take(self.link.token, now)
                    if self.shared_rows is not None and self.link.rows_through_memory else None)
            if slot is WAIT:
                self.metrics.send_blocked.inc()
                return built
            report = self.state.report
            wait_s, step_s = self.workers.read_clocks()
            report.worker_wait_s += wait_s
            report.worker_step_s += step_s
            rows = self.assembler.pop_full(rows_per_message)
            fields = report.fields(len(rows))
            if isinstance(slot, Slot):  # the payload stays in shared memory; the message says where
                packed = self.assembler.gather_packed(rows, into=slot.buffer)
                fields["shared"], arrays, packed = slot.ref(packed.layout), {}, None
            else:
                packed = self.assembler.gather_packed(rows) if self.link.packed_rows else None
                arrays = self.assembler.gather(rows) if packed is None else packed.arrays
            self.assembler.release(rows)
            message = Message(type=MessageType.ROWS, sender=self.link.name, version=self.inference.version,
                              fields=fields, arrays=arrays)
            self.state.unsent = UnsentRows(message=message, report=report.take(), rows=len(rows), packed=packed)
            self.state.last_flush = now
            built = True
        return built

    def _send_unsent(self) -> bool:
        """Send the block built last if it has not gone; whether the data socket took it (True: none waits)."""
        unsent = self.state.unsent
        if unsent is None:
            return True
        nbytes = self.link.send_rows(unsent.message, unsent.packed)
        if nbytes is None:
            self.metrics.send_blocked.inc()
            return False
        self.metrics.rows_shipped(unsent.report, rows=unsent.rows, nbytes=nbytes)
        self.state.unsent = None
        return True
