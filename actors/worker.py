"""Env worker process: steps its env groups straight into its shared-memory slot.

The worker owns ``async_factor`` groups of envs. Hot path: the host writes actions for group g into
shared memory and sends the one byte ``g`` on the worker's pipe; the worker steps that group in place and
answers ``[g, status]`` (plus UTF-8 text for the error statuses). Nothing is pickled per step. An env that
raises in ``step`` is rebuilt and reset (status ENV_RESTARTED, the error text attached), never taking the
worker down; one that cannot be built or reset, or raises again right after each of MAX_RESTARTS_IN_A_ROW
restarts, is reported as STATUS_FATAL with the reason and the worker exits. The worker exits on b"q", on
EOF (host gone) or on the host's death (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import signal
import time
import traceback
from dataclasses import dataclass

from envs.base import EnvSpec, StepBuffers, step_buffer_fields
from envs.registry import env_label, make_vec_env
from actors.shm import FieldLayout, ShmSegment, plan_layout
from configs.env_config import EnvConfig

QUIT = b"q"
STATUS_OK = 0
STATUS_ENV_RESTARTED = 1
STATUS_FATAL = 2
"""The worker cannot go on (its env fails to build or reset); the reply's remaining bytes say why (UTF-8)."""
MAX_RESTARTS_IN_A_ROW = 3
"""An env group that raises again this many times right after being restarted is fatal."""


class EnvFailure(RuntimeError):
    """A worker's env cannot run at all (fails to build or reset, or keeps raising); the host stops with it."""


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs, passed once at spawn."""

    worker_id: int
    """Index of this worker on its host."""
    env: EnvConfig
    """Which env to build."""
    spec: EnvSpec
    """The env's declared spaces."""
    groups: int
    """Env groups (async_factor)."""
    envs_per_group: int
    """Envs in each group."""
    shm_name: str
    """Shared-memory segment holding this worker's buffers."""
    seed: int
    """Base seed for this worker's envs."""


CLOCK = "worker_clock"
"""Shared-memory field [seconds waiting for actions, seconds stepping envs], written by the worker only."""


def worker_layout(spec: EnvSpec, slots: int) -> tuple[list[FieldLayout], int]:
    """The shared-memory layout of one worker: StepBuffers fields over all its agent slots, and its clock."""
    return plan_layout(step_buffer_fields(spec, slots) + [(CLOCK, (2,), "float64")])


def group_buffers(views: dict, group: int, slots_per_group: int) -> StepBuffers:
    """StepBuffers of one group: slices of the worker's arrays."""
    part = slice(group * slots_per_group, (group + 1) * slots_per_group)
    return StepBuffers(**{name: views[name][part] for name in views if name != CLOCK})


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: EOF on the pipe still ends the worker


def worker_main(spec: WorkerSpec, conn) -> None:  # conn: multiprocess Connection
    """Process entry point."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the host's to handle
    slots_per_group = spec.envs_per_group * spec.spec.num_agents
    layout, size = worker_layout(spec.spec, slots_per_group * spec.groups)
    segment = ShmSegment.attach(spec.shm_name, size)
    views = segment.views(layout)
    buffers = [group_buffers(views, g, slots_per_group) for g in range(spec.groups)]
    envs: list = []
    try:
        try:
            for g in range(spec.groups):
                envs.append(make_vec_env(spec.env, spec.envs_per_group))
                _call(envs[g], "reset", buffers[g], _seed(spec, g, 0), label=env_label(spec.env))
        except Exception as exc:  # a broken env: tell the host why, instead of dying into a restart loop
            _send_fatal(conn, f"env worker {spec.worker_id} could not start its env: {exc}")
            return
        for g in range(spec.groups):
            conn.send_bytes(bytes([g, STATUS_OK]))
        _serve(spec, conn, envs, buffers, views[CLOCK])
    finally:
        for env in envs:
            _close_quietly(env)
        del views, buffers
        segment.close()


def _serve(spec: WorkerSpec, conn, envs: list, buffers: list[StepBuffers], clock) -> None:
    """The hot loop: step the group the host names, answer with its status, until told to quit.

    ``clock`` [2] accumulates seconds blocked waiting for the host (no group to step) and seconds stepping.
    """
    generations = [0] * spec.groups
    failures_in_a_row = [0] * spec.groups
    label = env_label(spec.env)
    now = time.perf_counter
    while True:
        waited = now()
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if message == QUIT:
            return
        g = message[0]
        stepped = now()
        clock[0] += stepped - waited
        try:
            _call(envs[g], "step", buffers[g], label=label)
            failures_in_a_row[g] = 0
            clock[1] += now() - stepped
            conn.send_bytes(bytes([g, STATUS_OK]))
            continue
        except Exception as exc:  # an env's own bug: restart that env group, keep the worker alive
            error = str(exc)
        failures_in_a_row[g] += 1
        traceback.print_exc()
        while True:
            generations[g] += 1
            try:
                envs[g] = _restart(envs[g], spec, buffers[g], _seed(spec, g, generations[g]))
                break
            except Exception as exc:
                failures_in_a_row[g] += 1
                error = str(exc)
                if failures_in_a_row[g] >= MAX_RESTARTS_IN_A_ROW:
                    break
        if failures_in_a_row[g] >= MAX_RESTARTS_IN_A_ROW:
            _send_fatal(conn, f"env worker {spec.worker_id}: env group {g} failed {failures_in_a_row[g]} "
                              f"times in a row; last error: {error}", group=g)
            return
        conn.send_bytes(bytes([g, STATUS_ENV_RESTARTED]) + error.encode("utf-8", "replace")[:4000])


def _call(env, call: str, buffers: StepBuffers, *args, label: str) -> None:
    """``env.reset``/``env.step``; an exception becomes a RuntimeError naming the env and the call."""
    try:
        getattr(env, call)(buffers, *args)
    except Exception as exc:
        if "raised in " in str(exc) or "() returned" in str(exc):
            raise  # an adapter already named the env and the call
        raise RuntimeError(f"env '{label}' raised in {call}(): {exc!r}") from exc


def _send_fatal(conn, text: str, group: int = 0) -> None:
    try:
        conn.send_bytes(bytes([group, STATUS_FATAL]) + text.encode("utf-8", "replace")[:4000])
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
    fresh = make_vec_env(spec.env, spec.envs_per_group)
    _call(fresh, "reset", buffers, seed, label=env_label(spec.env))
    buffers.terminated[:] = True  # the aborted episodes end here; the learner must not bootstrap across
    buffers.episode_done[:] = False
    return fresh
