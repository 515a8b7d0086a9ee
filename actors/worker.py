"""Env worker process: steps its env groups straight into their slots of the host's shared memory.

The worker owns ``layout.groups`` groups of envs. Hot path: the host writes actions for group g into
shared memory and counts the wake in the segment's handoff counters; the worker steps that group in place and
counts its answer there (``actors/handoff.py``: a worker with nothing to step spins a few microseconds, then sleeps
on its pipe until the host's ``WAKE``). The error statuses go over the pipe as ``[g, status]`` plus an encoded
``EnvErrorReport`` (``actors/worker_channel.py``), and so do the first answers after the envs are built and reset.
Nothing is pickled per step. An env that raises in ``step``, or writes NaN or inf where the host would read it
(``check_finite``: ``NonFiniteOutput``), is rebuilt and reset (status ENV_RESTARTED; the reset's outputs replace
the bad ones, so they never reach a row), never taking the worker down; one that cannot be built or reset, or
fails again right after each of MAX_RESTARTS_IN_A_ROW restarts, is reported as STATUS_FATAL and the worker exits. Every
env exception's traceback is printed to the worker's stderr (the host's console) where it is caught (a
non-finite output has no traceback: the host logs its report). The worker exits on QUIT, on EOF (host gone)
or on the host's death (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np
import threadpoolctl

from actors.env_failures import EnvErrorReport, NonFiniteOutput, check_finite
from actors.handoff import WorkerHandoff
from actors.slot_layout import SlotLayout
from actors.slot_segment import SlotSegment
from actors.worker_channel import STATUS_ENV_RESTARTED, STATUS_FATAL, STATUS_OK, WorkerEnd
from configs.env_config import EnvConfig
from envs.base import EnvSpec, StepBuffers
from envs.errors import EnvError, EnvRaised
from envs.registry import env_label, make_vec_env

MAX_RESTARTS_IN_A_ROW = 3
"""An env group that raises again this many times right after being restarted is fatal."""


@dataclass(frozen=True, kw_only=True)
class WorkerPriority:
    """How an env worker shares the CPU with the host that feeds it (``python -m actors --worker-nice``,
    ``--worker-scheduler``, ``--worker-threads``); applied at the worker's start, so respawned workers keep it."""

    nice: int = 0
    """Niceness the worker adds to its own: above 0 the host, and a learner on the same machine, get the CPU first
    when the cores are all busy (a smaller share of the CPU for the workers)."""
    batch: bool = True
    """Linux's SCHED_BATCH policy: a worker the host's wake makes runnable does not preempt the process running on
    that core (the host finishing its turn); its share of the CPU stays the same."""
    threads: int = 1
    """Threads of the numeric libraries in the worker (every BLAS and OpenMP library loaded, and torch's pool when
    its env loaded torch), set once its envs are built: 1 keeps each worker to the one core the design gives it (left
    alone, NumPy's OpenBLAS runs a thread per core of the machine for a large product in an env's step, in every
    worker); more for an env whose own step runs large parallel products."""

    def apply(self) -> None:
        """Set both on the calling process (SCHED_BATCH only where the OS has it)."""
        if self.nice:
            os.nice(self.nice)
        if self.batch and hasattr(os, "SCHED_BATCH"):
            try:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            except OSError:  # a sandbox that filters the call: the worker runs as before, only a little slower
                pass

    def limit_threads(self) -> None:
        """Size the numeric libraries loaded so far (``threadpoolctl``) and torch's pool (when loaded) to ``threads``;
        call after the envs are built (they may load such libraries)."""
        threadpoolctl.threadpool_limits(limits=self.threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(self.threads)


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs, passed once at spawn."""

    worker_id: int
    """Index of this worker on its host."""
    env: EnvConfig
    """Which env to build."""
    env_spec: EnvSpec
    """The env's declared spaces."""
    layout: SlotLayout
    """The host's slot layout (this worker's groups, envs per group, agents per env)."""
    shm_name: str
    """The host's shared-memory segment (``SlotSegment``), which holds this worker's groups."""
    seed: int
    """Base seed for this worker's envs."""
    priority: WorkerPriority = WorkerPriority()
    """How it gives the CPU to the host (set at its start)."""


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: EOF on the pipe still ends the worker


def worker_main(spec: WorkerSpec, conn) -> None:  # conn: multiprocess Connection
    """Process entry point."""
    _die_with_parent()
    spec.priority.apply()
    channel = WorkerEnd(conn)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the host's to handle
    segment = SlotSegment.attach(spec.shm_name, spec.env_spec, spec.layout)
    groups = segment.worker_groups(spec.worker_id)
    envs: list = []
    try:
        try:
            for g in range(spec.layout.groups):
                envs.append(make_vec_env(spec.env, spec.layout.envs_per_group))
                _reset(envs[g], spec, groups[g], _seed(spec, g, 0))
        except Exception as exc:  # a broken env: tell the host why, instead of dying into a restart loop
            _print_failure(exc)
            report = EnvErrorReport.from_exception(exc)
            _send_fatal(channel, report.within(f"env worker {spec.worker_id} could not start its env"))
            return
        handoff = WorkerHandoff(commands=segment.commands, answers=segment.answers, sleeping=segment.sleeping,
                                worker=spec.worker_id, channel=channel)
        spec.priority.limit_threads()  # after the handoff's compiled code, which loads a BLAS too
        for g in range(spec.layout.groups):
            channel.reply(g, STATUS_OK)
        _serve(spec, handoff, envs, groups, segment.clocks[spec.worker_id])
    finally:
        for env in envs:
            _close_quietly(env)
        segment.close()


def _serve(spec: WorkerSpec, handoff: WorkerHandoff, envs: list, buffers: tuple[StepBuffers, ...],
           clock: np.ndarray) -> None:
    """The hot loop: step the group the host hands over, answer, until told to quit.

    ``clock`` (the worker's row of the segment's clocks) accumulates seconds blocked waiting for the host (no group to
    step) and seconds stepping.
    """
    generations = [0] * spec.layout.groups
    failures_in_a_row = [0] * spec.layout.groups
    label = env_label(spec.env)
    agents_per_env = spec.layout.agents_per_env
    now = time.perf_counter
    channel = handoff.channel
    while True:
        waited = now()
        g = handoff.next_group()
        if g is None:
            return
        stepped = now()
        clock[0] += stepped - waited
        try:
            _call(envs[g], "step", buffers[g], label=label)
            check_finite(buffers[g], agents_per_env=agents_per_env, call="step", label=label)
        except Exception as exc:  # an env's own bug: restart that env group, keep the worker alive
            _print_failure(exc)
            report = EnvErrorReport.from_exception(exc)
        else:
            failures_in_a_row[g] = 0
            clock[1] += now() - stepped
            handoff.answer(g)
            continue
        failures_in_a_row[g] += 1
        while True:
            generations[g] += 1
            try:
                envs[g] = _restart(envs[g], spec, buffers[g], _seed(spec, g, generations[g]))
                spec.priority.limit_threads()  # the fresh envs may have loaded a library
                break
            except Exception as exc:
                _print_failure(exc)
                report = EnvErrorReport.from_exception(exc)
                failures_in_a_row[g] += 1
                if failures_in_a_row[g] >= MAX_RESTARTS_IN_A_ROW:
                    break
        if failures_in_a_row[g] >= MAX_RESTARTS_IN_A_ROW:
            _send_fatal(channel, report.within(f"env worker {spec.worker_id}: env group {g} failed "
                                            f"{failures_in_a_row[g]} times in a row; last error"), group=g)
            return
        channel.reply(g, STATUS_ENV_RESTARTED, report.to_bytes())


def _call(env, call: str, buffers: StepBuffers, *args, label: str) -> None:
    """``env.reset``/``env.step``; an ``EnvError`` passes as it is, any other exception becomes an
    ``EnvRaised`` naming the env and the call, the original chained as its cause."""
    try:
        getattr(env, call)(buffers, *args)
    except EnvError:
        raise
    except Exception as exc:
        raise EnvRaised(f"env '{label}' raised in {call}(): {exc!r}") from exc


def _reset(env, spec: WorkerSpec, buffers: StepBuffers, seed: int) -> None:
    """``env.reset`` through ``_call``, its outputs checked like a step's (``NonFiniteOutput``)."""
    label = env_label(spec.env)
    _call(env, "reset", buffers, seed, label=label)
    check_finite(buffers, agents_per_env=spec.layout.agents_per_env, call="reset", label=label)


def _print_failure(exc: Exception) -> None:
    """The traceback of an env's exception on the worker's stderr (a non-finite output has none worth showing:
    the host logs its report)."""
    if not isinstance(exc, NonFiniteOutput):
        traceback.print_exc()


def _send_fatal(channel: WorkerEnd, report: EnvErrorReport, group: int = 0) -> None:
    try:
        channel.reply(group, STATUS_FATAL, report.to_bytes())
    except (OSError, ValueError):
        pass  # the host is gone; nothing to tell


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # the broken env may fail to close too; it is being replaced or the worker is ending
        traceback.print_exc()


def _seed(spec: WorkerSpec, group: int, generation: int) -> int:
    return spec.seed + 1_000_003 * spec.worker_id + 10_007 * group + 101 * generation


def _restart(env, spec: WorkerSpec, buffers: StepBuffers, seed: int):
    """Close the broken env group, build and reset a fresh one; the aborted episodes end as terminated."""
    _close_quietly(env)
    fresh = make_vec_env(spec.env, spec.layout.envs_per_group)
    _reset(fresh, spec, buffers, seed)
    buffers.terminated[:] = True  # the aborted episodes end here; the learner must not bootstrap across
    buffers.episode_done[:] = False
    return fresh
