"""The actor host: registers with the learner, runs N env workers, infers, assembles rows, ships them.

Wired in one place (``ActorHost.run``): LearnerLink (sockets) -> workers (processes over shared memory)
-> Inference (policy) -> RowAssembler (numba) -> LearnerLink. One poller waits on every worker pipe and
socket, so the host never busy-waits. Back-pressure: when the learner stops taking rows, the PUSH socket's
high-water mark fills, full rows pile up in the assembler, and once it cannot accept another batch the
host stops handing out actions, so the env workers pause.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

import multiprocess as mp
import numpy as np
import torch
import zmq

from actors.assembler import RowAssembler
from envs.registry import env_spec
from actors.inference import Inference, NullInference
from actors.learner_link import LearnerLink, Registration
from actors.opponents import OpponentCache, Opponents
from actors.pool_client import PoolClient, PoolError
from actors.recurrent_state import AgentStates
from actors.stepper import GroupStepper, Pending
from actors.shm import ShmSegment, remove_stale_segments, segment_name
from actors.worker import (CLOCK, QUIT, STATUS_ENV_RESTARTED, STATUS_FATAL, EnvFailure, WorkerSpec, worker_layout,
                           worker_main)
from configs.loader import config_from_dict
from configs.plan import make_plan
from configs.schema import RunConfig
from protocol import Limits, Message, MessageType
from protocol.endpoints import Endpoint

LOG = logging.getLogger("sluice.actors")
JOIN_TIMEOUT_S = 5.0
FLUSH_AFTER_S = 0.05


@dataclass
class WorkerSlot:
    """One env worker process and its shared memory, as the host sees it."""

    spec: WorkerSpec
    segment: ShmSegment
    views: dict[str, np.ndarray]
    process: mp.Process | None = None
    conn: object = None
    restarts: int = 0


class ActorHost:
    """One host's actors for one learner."""

    def __init__(self, learner: Endpoint, *, num_workers: int | None, null_policy: bool = False,
                 pool: Endpoint | None = None) -> None:
        self.learner = learner
        self.pool = pool
        self.pool_client: PoolClient | None = None
        self.opponents: Opponents | None = None
        self.requested_workers = num_workers
        self.null_policy = null_policy
        self.stopping = False
        self.stop_reason = ""
        self.env_restarts = 0

    def request_stop(self, reason: str) -> None:
        """Signal handlers call this; the loop finishes its iteration and cleans up."""
        self.stopping = True
        self.stop_reason = self.stop_reason or reason

    def run(self) -> int:
        """Register, run until the learner says stop or a signal arrives; returns the exit code."""
        for name in remove_stale_segments():
            LOG.info("removed stale shared memory %s", name)
        link = LearnerLink(self.learner, num_workers=self.requested_workers or 0, limits=Limits())
        workers: list[WorkerSlot] = []
        try:
            registration = link.register(retry_s=1.0, should_stop=lambda: self.stopping)
            if registration is None:
                return 0
            config = config_from_dict(registration.config)
            torch.set_num_threads(config.run.torch_threads)
            workers = self._start(config, registration, link)
            self._loop(config, registration, link, workers)
            return 0
        finally:
            self._stop_workers(workers)
            if self.pool_client is not None:
                self.pool_client.close()
            link.close()
            print(f"actors: stopped ({self.stop_reason or 'done'})", flush=True)

    def _start(self, config: RunConfig, registration: Registration, link: LearnerLink) -> list[WorkerSlot]:
        trainer = config.trainer
        n = self.requested_workers or trainer.num_workers
        self.plan = make_plan(trainer, num_agents=config.env.num_agents, num_workers=n)
        if self.plan.envs_per_worker % trainer.async_factor:
            raise ValueError(f"envs_per_worker ({self.plan.envs_per_worker}) must be divisible by "
                             f"async_factor ({trainer.async_factor})")
        self.spec = env_spec(config.env)
        self.groups = trainer.async_factor
        self.envs_per_group = self.plan.envs_per_worker // self.groups
        self.slots_per_group = self.envs_per_group * self.spec.num_agents
        self.slots_per_worker = self.slots_per_group * self.groups
        total_agents = n * self.slots_per_worker
        rows_per_message = config.network.rows_per_message
        seed = config.run.seed + os.getpid()
        self.inference = (NullInference(self.spec, seed=seed) if self.null_policy
                          else Inference(self.spec, config.model, seed=seed))
        self.assembler = RowAssembler(num_agents=total_agents,
                                      num_rows=2 * total_agents + 2 * rows_per_message,
                                      horizon=trainer.bptt_horizon + 1, obs_shape=self.spec.obs_shape,
                                      obs_dtype=self.spec.obs_dtype, state_size=self.inference.state_size,
                                      action_shape=self.spec.action.shape, action_dtype=self.spec.action.dtype,
                                      mask_size=self.spec.mask_size)
        self.states = AgentStates(total_agents, self.inference.state_size)
        if config.selfplay.enabled:
            self._start_selfplay(config, n * self.plan.envs_per_worker, link.name, seed)
        self.stepper = GroupStepper(spec=self.spec, inference=self.inference, assembler=self.assembler,
                                    states=self.states, envs_per_group=self.envs_per_group,
                                    groups_per_worker=self.groups, opponents=self.opponents)
        self.inference.load(registration.version, registration.weights)
        link.open_streams(registration, hwm=config.network.send_queue_messages,
                          buffer_bytes=config.network.socket_buffer_bytes)
        self.context = mp.get_context("spawn")
        layout, size = worker_layout(self.spec, self.slots_per_worker)
        workers = []
        for w in range(n):
            name = segment_name(os.getpid(), f"w{w}")
            segment = ShmSegment.create(name, size)
            spec = WorkerSpec(worker_id=w, env=config.env, spec=self.spec, groups=self.groups,
                              envs_per_group=self.envs_per_group, shm_name=name,
                              seed=config.run.seed * 7919 + os.getpid() * 31)
            slot = WorkerSlot(spec=spec, segment=segment, views=segment.views(layout))
            workers.append(slot)
            self._spawn(slot)
        self.clocks_seen = np.zeros((n, 2))
        policy = ", null policy (uniform random actions)" if self.null_policy else ""
        print(f"actors: {n} workers x {self.plan.envs_per_worker} envs ({self.groups} groups) of "
              f"{config.env.name}{policy}, learner {self.learner.url}", flush=True)
        return workers

    def _start_selfplay(self, config: RunConfig, num_envs: int, name: str, seed: int) -> None:
        """Seats, the snapshot cache and the first opponent assignment (blocking: nothing plays without one)."""
        endpoint = self.pool or self.learner
        self.pool_client = PoolClient(endpoint, limits=Limits(max_message_bytes=config.network.max_message_bytes),
                                      timeout_s=3 * config.network.heartbeat_interval_s, sender=name)
        cache = OpponentCache(self.spec, config.model, capacity=config.selfplay.cache_size,
                              fetch=self.pool_client.snapshot, seed=seed)
        self.opponents = Opponents(num_envs=num_envs, num_agents=self.spec.num_agents, cache=cache)
        self.alternation_steps = config.selfplay.alternation_steps * num_envs
        self.alternation_started = 0
        self._next_alternation(num_envs)

    def _next_alternation(self, num_envs: int) -> None:
        assignment = self.pool_client.opponents(num_envs)
        self.opponents.assign(assignment)
        LOG.info("alternation %d: %d envs play %d unique opponents (%d snapshots downloaded so far)",
                 assignment.alternation, num_envs, len(set(assignment.digests)), self.opponents.cache.downloads)

    def _maybe_alternate(self) -> None:
        """Every alternation_steps env steps per env: draw the envs' next opponents."""
        if self.opponents is None or self.stepper.env_steps - self.alternation_started < self.alternation_steps:
            return
        self.alternation_started = self.stepper.env_steps
        try:
            self._next_alternation(len(self.opponents.env_digests))
        except PoolError as err:  # keep playing the current opponents; try again next alternation
            LOG.warning("no new opponents this alternation: %s", err)

    def _spawn(self, slot: WorkerSlot) -> None:
        parent, child = self.context.Pipe(duplex=True)
        slot.process = self.context.Process(target=worker_main, args=(slot.spec, child), daemon=True,
                                            name=f"sluice-env-worker-{slot.spec.worker_id}")
        slot.process.start()
        child.close()
        slot.conn = parent

    def _loop(self, config: RunConfig, registration: Registration, link: LearnerLink,
              workers: list[WorkerSlot]) -> None:
        net = config.network
        ready: deque[tuple[int, int]] = deque()
        pending = Pending(stats={name: [] for name in self.spec.episode_stats})
        run_id = registration.run_id
        last_heartbeat = last_reply = last_flush = time.monotonic()
        by_fd = {}
        poller = zmq.Poller()
        for w, slot in enumerate(workers):
            by_fd[slot.conn.fileno()] = w
            poller.register(slot.conn.fileno(), zmq.POLLIN)
        poller.register(link.control, zmq.POLLIN)
        poller.register(link.weights, zmq.POLLIN)
        batch_groups = len(workers)
        while not self.stopping:
            events = dict(poller.poll(20))
            for fd in [fd for fd in events if fd in by_fd]:
                self._collect(workers, by_fd, fd, ready, poller, pending)
            now = time.monotonic()
            if now - last_heartbeat >= net.heartbeat_interval_s:
                link.send_control(MessageType.HEARTBEAT)
                last_heartbeat = now
            while (reply := link.recv_control()) is not None:
                last_reply = now
                if reply.type is MessageType.SHUTDOWN:
                    self.request_stop(f"learner: {reply.fields['reason']}")
                elif reply.type is MessageType.ERROR:
                    LOG.warning("learner error: %s", reply.fields["message"])
                    if reply.fields.get("reason") == "not_registered":  # a restarted learner: register now
                        last_reply = 0.0
                elif reply.type is MessageType.HEARTBEAT_ACK and reply.fields.get("run_id", run_id) != run_id:
                    LOG.warning("learner restarted; registering again")
                    last_reply = 0.0
            broadcast = link.latest_broadcast()
            if broadcast is not None and broadcast.type is MessageType.SHUTDOWN:
                self.request_stop(f"learner: {broadcast.fields['reason']}")
            elif broadcast is not None and broadcast.version > self.inference.version:
                self.inference.load(broadcast.version, dict(broadcast.arrays))
            if now - last_reply > net.peer_timeout_s and not self.stopping:
                registration = self._reregister(link, config)
                if registration is None:
                    break
                run_id, last_reply = registration.run_id, time.monotonic()
                poller.unregister(link.control)
                poller.register(link.control, zmq.POLLIN)
                continue
            while ready and not self.stopping:
                take = min(len(ready), batch_groups)
                if not self.assembler.can_accept(take * self.slots_per_group):
                    break
                self._act(workers, [ready.popleft() for _ in range(take)], pending)
            self._maybe_alternate()
            last_flush = self._ship(link, net.rows_per_message, pending, last_flush, workers)

    def _collect(self, workers, by_fd, fd, ready, poller, pending: Pending) -> None:
        w = by_fd[fd]
        slot = workers[w]
        try:
            while slot.conn.poll():
                reply = slot.conn.recv_bytes()
                group, status, text = reply[0], reply[1], reply[2:].decode("utf-8", "replace")
                if status == STATUS_FATAL:
                    raise EnvFailure(text)
                if status == STATUS_ENV_RESTARTED:
                    pending.env_restarts += 1
                    self.env_restarts += 1
                    LOG.warning("worker %d: env group %d raised and was restarted (%d env restarts on this "
                                "host): %s", w, group, self.env_restarts, text)
                ready.append((w, group))
        except (EOFError, OSError):
            self._restart_worker(workers, w, by_fd, fd, ready, poller)

    def _restart_worker(self, workers, w, by_fd, fd, ready, poller) -> None:
        slot = workers[w]
        if self.stopping:
            return
        LOG.warning("env worker %d died (exit code %s); restarting it", w,
                    slot.process.exitcode if slot.process else None)
        poller.unregister(fd)
        del by_fd[fd]
        slot.process.join(timeout=1)
        slot.restarts += 1
        self.stepper.forget_worker(w)
        for item in [item for item in ready if item[0] == w]:
            ready.remove(item)
        self._spawn(slot)
        by_fd[slot.conn.fileno()] = w
        poller.register(slot.conn.fileno(), zmq.POLLIN)

    def _act(self, workers: list[WorkerSlot], batch: list[tuple[int, int]], pending: Pending) -> None:
        """Decide for the ready groups, then wake their workers (actions are in shared memory by then)."""
        self.stepper.act([(workers[w].views, w, g) for w, g in batch], pending)
        for w, g in batch:
            workers[w].conn.send_bytes(bytes([g]))

    def _ship(self, link: LearnerLink, rows_per_message: int, pending: Pending, last_flush: float,
              workers: list[WorkerSlot]) -> float:
        """Send full rows in blocks while the data socket has room; returns the last flush time."""
        now = time.monotonic()
        while True:
            full = self.assembler.full_rows()
            due = full >= rows_per_message or (full > 0 and now - last_flush > FLUSH_AFTER_S)
            if not due or not link.can_send_rows():
                return last_flush
            self._read_worker_clocks(workers, pending)
            rows = self.assembler.pop_full(rows_per_message)
            arrays = self.assembler.gather(rows)
            self.assembler.release(rows)
            message = Message(type=MessageType.ROWS, sender=link.name, version=self.inference.version,
                              fields={"num_rows": len(rows), "episode_returns": pending.returns,
                                      "episode_lengths": pending.lengths, "env_steps": pending.env_steps,
                                      "agent_steps": pending.agent_steps, "env_restarts": pending.env_restarts,
                                      "episode_stats": pending.stats, "host_stats": pending.host_stats()},
                              arrays=arrays)
            link.send_rows(message)
            pending.clear()
            last_flush = now

    def _read_worker_clocks(self, workers: list[WorkerSlot], pending: Pending) -> None:
        """Add the workers' waiting and stepping seconds since the last read to ``pending``."""
        clocks = np.stack([slot.views[CLOCK] for slot in workers])
        wait_s, step_s = (clocks - self.clocks_seen).sum(axis=0)
        self.clocks_seen = clocks
        pending.worker_wait_s += float(wait_s)
        pending.worker_step_s += float(step_s)

    def _reregister(self, link: LearnerLink, config: RunConfig) -> Registration | None:
        print("actors: learner silent; waiting to register again", flush=True)
        registration = link.register(retry_s=1.0, should_stop=lambda: self.stopping)
        if registration is None:
            return None
        link.open_streams(registration, hwm=config.network.send_queue_messages,
                          buffer_bytes=config.network.socket_buffer_bytes)
        self.inference.load(registration.version, registration.weights)
        print("actors: registered again", flush=True)
        return registration

    def _stop_workers(self, workers: list[WorkerSlot]) -> None:
        for slot in workers:
            try:
                slot.conn.send_bytes(QUIT)
            except (OSError, ValueError, AttributeError):
                pass
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for slot in workers:
            if slot.process is None:
                continue
            slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if slot.process.is_alive():
                slot.process.terminate()
                slot.process.join(timeout=1)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(timeout=1)
        for slot in workers:
            slot.views = {}
            slot.segment.close()
