"""The actor host's env worker processes: spawn, pipes, ready groups, restarts, clocks, stop.

The pool creates the host's shared memory (``SlotSegment``: every agent slot of the host, each worker stepping its
own groups' slot ranges) and gives each worker a duplex pipe, spoken in bytes (``actors/worker_channel.py``). The
hot path does not use the pipes: ``wake`` counts each group's wake in the segment's handoff counters and
``take_answers`` collects the groups whose workers answered there (``actors/handoff.py``); a pipe carries a byte only
to wake a side that sleeps, and the cold path (the first answers after the envs are built, env errors, QUIT, EOF).
The pool registers every pipe in the host's poller; ``collect`` takes the answers from the counters, reads the
records of the pipes the poller marked, and queues the groups that are ready for actions in ``ready``. A worker
whose pipe breaks is buried at once (its pipe leaves the poller, its counters stop counting until its respawn zeroes
them, its ready groups are dropped, and so are its agents' partial rows and states, through ``on_restart``) and
respawned over the same segment after a backoff (RESPAWN_BACKOFF_S, doubling, at most RESPAWN_BACKOFF_MAX_S): the
respawn is scheduled, and ``collect`` starts it once due, so the host's loop keeps serving the other workers and
the learner meanwhile. Respawns happen only in ``collect``, never between a
``collect`` and the ``wake`` after it, so a wake never reaches a worker that did not write the step it answers. A
worker that dies MAX_DEATHS_IN_A_ROW times without completing a single step in between stops the host
(``EnvFailure`` naming the worker and its last exit cause: exit code, or the signal that killed it), like an env
that cannot be built. Every send on a pipe tolerates a worker that died a moment ago: its EOF at the next poll
buries it.

Watchdog: ``wake`` stamps each group it hands actions to, and its answer clears the stamp. Every WATCH_PERIOD_S
(at most a quarter of the deadline) ``collect`` looks for a worker whose oldest stamped group has waited longer
than ``env.step_timeout_s`` with no answer in the counters and nothing left to read on its pipe: stuck in an env
step, or stopped (SIGSTOP, read from /proc). It logs one line naming the worker, the env and the group, reports
it as an env error (``STEP_TIMEOUT``, for the learner's log), kills the process and buries it like a dead one, so
the respawn's backoff and the crash-loop rule apply. A worker's spawn stamps it too, until the replies that follow its groups'
first reset: one that has not built and reset its envs within ``env.build_timeout_s`` is killed the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import multiprocess as mp
import numpy as np
import zmq

from actors.env_failures import BUILD_TIMEOUT, NON_FINITE, STEP_TIMEOUT, EnvErrorReport, EnvFailure
from actors.handoff import publish_commands, set_flag, take_answers
from actors.rows_report import RowsReport
from actors.shm import segment_name
from actors.slot_layout import GroupView, SlotLayout
from actors.stop_flag import StopFlag
from actors.worker import WorkerPriority, WorkerSpec, worker_main
from actors.worker_channel import MAX_GROUPS, QUIT, STATUS_ENV_RESTARTED, STATUS_FATAL, STATUS_NUDGE, WAKE, HostEnd
from actors.slot_segment import SlotSegment
from configs.env_config import EnvConfig
from envs.base import EnvSpec
from envs.registry import env_label

LOG = logging.getLogger("sluice.actors")
JOIN_TIMEOUT_S = 5.0
MAX_DEATHS_IN_A_ROW = 3
"""A worker that dies this many times in a row without completing a step in between is fatal (a crash loop)."""
RESPAWN_BACKOFF_S = 0.25
"""Delay before respawning a worker after its first death in a row; doubled for each further one."""
RESPAWN_BACKOFF_MAX_S = 8.0
"""Longest delay before a respawn."""
EXIT_GRACE_S = 2.0
"""How long a worker whose pipe broke may take to exit before it is killed (its exit cause is read then)."""
WATCH_PERIOD_S = 0.5
"""Longest time between two watchdog checks of the workers' step deadlines (shorter for deadlines under 2 s)."""


@dataclass(kw_only=True)
class WorkerProcess:
    """One env worker as the host sees it."""

    spec: WorkerSpec
    """What it was spawned with."""
    groups: tuple[GroupView, ...]
    """Its groups, as the stepper acts on them."""
    process: mp.Process
    """The running process (after a death: the dead one, until its respawn)."""
    channel: HostEnd | None
    """The host's end of its pipe, its descriptor registered in the poller (None: dead, waiting for its respawn)."""
    restarts: int = 0
    """Times it died and was respawned."""
    deaths_in_a_row: int = 0
    """Deaths since it last completed a step."""
    replies: int = 0
    """Replies read from this process (the first ``groups`` follow its reset; later ones answer steps)."""
    respawn_at: float | None = None
    """Monotonic time its respawn is due (None: alive)."""
    killed_because: str = ""
    """Why the watchdog killed it ('' if it did not): its exit cause in the crash-loop message."""


def process_state(pid: int | None, busy: str = "busy in env step") -> str:
    """What a worker that does not answer is doing, from /proc/<pid>/stat: 'stopped (SIGSTOP)', 'stopped by a
    tracer' or ``busy`` (also where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return busy
    return {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer"}.get(state, busy)


def exit_cause(exitcode: int | None) -> str:
    """How a worker process ended, for messages: 'exit code 3', 'killed by SIGKILL', ..."""
    if exitcode is None:
        return "exit cause unknown (still running)"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class WorkerPool:
    """``layout.workers`` env workers of ``env_config``, their pipes registered in ``poller``."""

    def __init__(self, *, env_config: EnvConfig, env_spec: EnvSpec, layout: SlotLayout, seed: int,
                 poller: zmq.Poller, stop: StopFlag, on_restart: Callable[[int], None],
                 priority: WorkerPriority = WorkerPriority()) -> None:
        self.layout = layout
        self.poller = poller
        self.stop_flag = stop
        self.on_restart = on_restart
        self.context = mp.get_context("spawn")
        self.ready: deque[GroupView] = deque()
        """Groups whose worker wrote a step and waits for actions, oldest first."""
        self.env_restarts = 0
        """Env groups that raised and were rebuilt on this host since the start."""
        self.last_env_error: EnvErrorReport | None = None
        """The latest env error a worker reported."""
        self.clocks_seen = np.zeros((layout.workers, 2))
        self.step_timeout_s = env_config.step_timeout_s
        """A group woken longer ago than this without an answer gets its worker killed and respawned."""
        self.watch_period_s = min(WATCH_PERIOD_S, self.step_timeout_s / 4)
        self.next_watch = time.monotonic() + self.watch_period_s
        self.woken_at = np.full((layout.workers, layout.groups), np.inf)
        """Monotonic time each group was handed actions and has not answered since (inf: not waited for)."""
        self.build_timeout_s = env_config.build_timeout_s
        """A worker that has not built and reset its envs this long after its spawn is killed and respawned."""
        self.building_since = np.full(layout.workers, np.inf)
        """Monotonic time each worker was spawned, until its envs are built and reset (inf: they are)."""
        if layout.groups > MAX_GROUPS:
            raise ValueError(f"at most {MAX_GROUPS} env groups per worker (trainer.async_factor), got {layout.groups}")
        self.workers: list[WorkerProcess] = []
        self.by_fd: dict[int, int] = {}
        self.segment: SlotSegment | None = SlotSegment.create(segment_name(os.getpid(), "slots"), env_spec, layout)
        """The host's shared memory (kept across worker restarts; released by ``stop``)."""
        self.slots = self.segment.slots
        """Every slot of the host in shared memory (``SlotSegment.slots``)."""
        self.views = layout.group_views(self.slots)
        """Every group, worker by worker (``views[w * layout.groups + g]``)."""
        groups = layout.workers * layout.groups
        self.seen = np.zeros((layout.workers, layout.groups), dtype=np.int64)
        """The wake of each group whose answer the host took last (``actors/handoff.py``)."""
        self.alive = np.zeros(layout.workers, dtype=np.uint8)
        """Whether each worker's answers count (0 from its burial until its respawn)."""
        self._answered = np.empty(groups, dtype=np.int64)
        self._woken = np.empty((2, groups), dtype=np.int64)
        self._nudge = np.zeros(groups, dtype=np.bool_)
        try:
            for w in range(layout.workers):
                self.workers.append(self._spawn(WorkerSpec(worker_id=w, env=env_config, env_spec=env_spec,
                                                           layout=layout, shm_name=self.segment.name, seed=seed,
                                                           priority=priority)))
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def collect(self, events: dict, report: RowsReport) -> None:
        """Respawn the dead workers whose backoff is over (EnvFailure for a crash loop), take the answers from the
        handoff counters, then read the records on every worker pipe ``events`` (a poll's result) marks readable."""
        self._respawn_due()
        self.take_answers()
        for fd in events:
            w = self.by_fd.get(fd)
            if w is not None:
                self._read_replies(w, report)
        now = time.monotonic()
        if now >= self.next_watch:
            self.next_watch = now + self.watch_period_s
            self._watch(now, report)

    def take_answers(self) -> int:
        """Queue in ``ready`` the groups whose workers answered through the handoff counters since the last look;
        how many."""
        n = take_answers(self.segment.commands, self.segment.answers, self.seen, self.alive, self._answered)
        groups = self.layout.groups
        for flat in self._answered[:n].tolist():
            w = flat // groups
            worker = self.workers[w]
            worker.replies += 1
            if worker.replies > groups:  # it answered a step: it lives
                worker.deaths_in_a_row = 0
            self.woken_at[w, flat - w * groups] = np.inf
            self.ready.append(self.views[flat])
        return n

    def wait(self, timeout_ms: int) -> dict:
        """The host has nothing to do: wait in the poll (every worker pipe, the host's sockets) up to ``timeout_ms``,
        unless answers came in meanwhile (then ``{}``: they are in ``ready``). Meanwhile the host's sleeping flag is
        set, so a worker that answers writes to its pipe and ends the wait. What the poll marked readable."""
        sleeping = self.segment.sleeping
        set_flag(sleeping, self.layout.workers, 1)
        try:
            return {} if self.take_answers() else dict(self.poller.poll(timeout_ms))
        finally:
            set_flag(sleeping, self.layout.workers, 0)

    def wake(self, groups: Sequence[GroupView]) -> None:
        """Tell the groups' workers their actions are in shared memory (the watchdog's clock starts)."""
        now = time.monotonic()
        n = len(groups)
        woken = self._woken[:, :n]
        for k, view in enumerate(groups):
            woken[0, k] = view.worker
            woken[1, k] = view.group
            self.woken_at[view.worker, view.group] = now
        nudge = self._nudge[:n]
        if not publish_commands(self.segment.commands, self.segment.sleeping, woken[0], woken[1], nudge):
            return
        for w in set(woken[0, nudge].tolist()):
            channel = self.workers[w].channel
            if channel is None:  # buried since its step was collected: its respawn starts from fresh counters
                continue
            try:
                channel.send(WAKE)
            except OSError:
                continue  # it died after its step was collected (BrokenPipeError): its pipe's EOF is seen next poll

    def read_clocks(self) -> tuple[float, float]:
        """Seconds all workers together waited for actions and stepped envs since the last call."""
        clocks = self.segment.clocks.copy()
        wait_s, step_s = (clocks - self.clocks_seen).sum(axis=0)
        self.clocks_seen = clocks
        return float(wait_s), float(step_s)

    def stop(self) -> None:
        """Ask every worker to quit, end those that don't, release the shared memory (idempotent)."""
        workers, self.workers, self.by_fd = self.workers, [], {}
        self.ready.clear()
        for worker in workers:
            if worker.channel is None:
                continue
            try:
                worker.channel.send(QUIT)
            except OSError:
                pass  # already dead
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for worker in workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(timeout=1)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=1)
        for worker in workers:
            if worker.channel is not None:
                self.poller.unregister(worker.channel.fd)
                worker.channel.close()
            worker.groups = ()
        self.views, self.slots = (), None
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    def _spawn(self, spec: WorkerSpec) -> WorkerProcess:
        w = spec.worker_id
        for counters in (self.segment.commands, self.segment.answers, self.seen):
            counters[w] = 0
        self.segment.sleeping[w] = 0
        parent, child = self.context.Pipe(duplex=True)
        process = self.context.Process(target=worker_main, args=(spec, child), daemon=True,
                                       name=f"sluice-env-worker-{spec.worker_id}")
        process.start()
        child.close()
        groups = self.views[spec.worker_id * self.layout.groups:(spec.worker_id + 1) * self.layout.groups]
        worker = WorkerProcess(spec=spec, groups=groups, process=process, channel=HostEnd(parent))
        self.alive[spec.worker_id] = 1
        self.building_since[spec.worker_id] = time.monotonic()
        self.by_fd[worker.channel.fd] = spec.worker_id
        self.poller.register(worker.channel.fd, zmq.POLLIN)
        return worker

    def _read_replies(self, w: int, report: RowsReport) -> None:
        """Every reply waiting on worker ``w``'s pipe (the poller said it is readable: replies, or its EOF)."""
        worker = self.workers[w]
        try:
            replies = worker.channel.read_replies()
        except (EOFError, OSError):
            self._bury(w)
            return
        for reply in replies:
            if reply.status == STATUS_NUDGE:
                continue
            worker.replies += 1
            group, status = reply.group, reply.status
            self.woken_at[w, group] = np.inf
            if status == STATUS_FATAL:
                raise EnvFailure(EnvErrorReport.from_bytes(reply.report))
            if worker.replies > self.layout.groups:  # it answered a step: it lives
                worker.deaths_in_a_row = 0
            elif worker.replies == self.layout.groups:  # every group built and reset
                self.building_since[w] = np.inf
            if status == STATUS_ENV_RESTARTED:
                self.last_env_error = EnvErrorReport.from_bytes(reply.report)
                report.env_restarts += 1
                self.env_restarts += 1
                failed = "wrote a non-finite value" if self.last_env_error.error_type == NON_FINITE else "raised"
                LOG.warning("worker %d: env group %d %s and was restarted (%d env restarts on this host): %s",
                            w, group, failed, self.env_restarts, self.last_env_error.text())
            self.ready.append(worker.groups[group])

    def _bury(self, w: int) -> None:
        """Worker ``w``'s pipe broke: forget its pipe, ready groups and agents now, respawn it after a backoff
        (not while the host is stopping; ``stop`` reaps it)."""
        if self.stop_flag.is_set():
            return
        worker = self.workers[w]
        self.poller.unregister(worker.channel.fd)
        del self.by_fd[worker.channel.fd]
        worker.channel.close()
        worker.channel = None
        self.alive[w] = 0
        self.woken_at[w] = np.inf
        self.building_since[w] = np.inf
        self.on_restart(w)
        kept = [view for view in self.ready if view.worker != w]
        self.ready.clear()
        self.ready.extend(kept)
        worker.deaths_in_a_row += 1
        delay = (0.0 if worker.deaths_in_a_row >= MAX_DEATHS_IN_A_ROW
                 else min(RESPAWN_BACKOFF_S * 2 ** (worker.deaths_in_a_row - 1), RESPAWN_BACKOFF_MAX_S))
        worker.respawn_at = time.monotonic() + delay

    def _respawn_due(self) -> None:
        """Respawn every buried worker whose backoff is over and whose process has exited (one that lingers
        EXIT_GRACE_S past its due time is killed); the MAX_DEATHS_IN_A_ROW-th death in a row raises instead."""
        if self.stop_flag.is_set():
            return
        now = time.monotonic()
        for w, worker in enumerate(self.workers):
            if worker.respawn_at is None or now < worker.respawn_at:
                continue
            if worker.process.is_alive():
                if now < worker.respawn_at + EXIT_GRACE_S:
                    continue
                LOG.warning("env worker %d closed its pipe but did not exit in %g s; killing it", w, EXIT_GRACE_S)
                worker.process.kill()
                worker.process.join(timeout=1)
            cause = worker.killed_because or exit_cause(worker.process.exitcode)
            deaths = worker.deaths_in_a_row
            if deaths >= MAX_DEATHS_IN_A_ROW:  # stop() releases the segment
                raise EnvFailure(EnvErrorReport(
                    message=f"env worker {w} died {deaths} times in a row without completing a step (last: {cause})",
                    error_type="worker process died", location=""))
            if not worker.killed_because:  # the watchdog's line already said it restarts the worker
                LOG.warning("env worker %d died (%s; %d in a row); respawned", w, cause, deaths)
            self.workers[w] = self._spawn(worker.spec)
            self.workers[w].restarts = worker.restarts + 1
            self.workers[w].deaths_in_a_row = deaths

    def _watch(self, now: float, report: RowsReport) -> None:
        """Kill and bury every live worker whose oldest woken group has waited past the step deadline, or that has
        not built and reset its envs by the build deadline, with no answer waiting on its pipe; each is one line,
        and an env error for the learner."""
        if self.stop_flag.is_set():
            return
        waited = now - self.woken_at.min(axis=1)
        for w in np.flatnonzero(waited > self.step_timeout_s).tolist():
            group = int(np.argmin(self.woken_at[w]))
            self._kill_stuck(w, report, busy="busy in env step", waited_s=float(waited[w]), watchdog="step watchdog",
                             error_type=STEP_TIMEOUT,
                             what=f"env worker {w} (env '{env_label(self.workers[w].spec.env)}', group {group}) "
                                  f"stuck: no answer for {waited[w]:.1f} s (env.step_timeout_s "
                                  f"{self.step_timeout_s:g})")
        building = now - self.building_since
        for w in np.flatnonzero(building > self.build_timeout_s).tolist():
            self._kill_stuck(w, report, busy="busy building its envs", waited_s=float(building[w]),
                             watchdog="build watchdog", error_type=BUILD_TIMEOUT,
                             what=f"env worker {w} (env '{env_label(self.workers[w].spec.env)}') did not build and "
                                  f"reset its envs in {building[w]:.1f} s (env.build_timeout_s "
                                  f"{self.build_timeout_s:g})")

    def _kill_stuck(self, w: int, report: RowsReport, *, busy: str, waited_s: float, watchdog: str, error_type: str,
                    what: str) -> None:
        """Worker ``w`` is past a deadline (``what`` says which): unless its answer just came in, one line naming
        its state (``busy`` when it is neither stopped nor traced), an env error of ``error_type``, SIGKILL, and a
        burial."""
        worker = self.workers[w]
        if worker.channel is None or worker.channel.answer_waiting():  # buried already, or its answer just came in
            return
        state = process_state(worker.process.pid, busy=busy)
        line = f"{what}, {state}; killing and respawning it"
        LOG.warning("%s", line)
        self.last_env_error = EnvErrorReport(message=line, error_type=error_type, location="")
        report.env_restarts += 1
        self.env_restarts += 1
        worker.process.kill()  # SIGKILL ends a stopped process too
        self._bury(w)
        worker.killed_because = f"{state} for {waited_s:.1f} s, killed by the {watchdog}"
