"""Env worker process: steps its env groups straight into its shared-memory slot.

The worker owns ``async_factor`` groups of envs. Hot path: the host writes actions for group g into
shared memory and sends the one byte ``g`` on the worker's pipe; the worker steps that group in place and
answers ``[g, status]``. Nothing is pickled per step. An env that raises is rebuilt and reset (status
ENV_RESTARTED), never taking the worker down. The worker exits on b"q", on EOF (host gone) or on the
host's death (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import signal
import traceback
from dataclasses import dataclass

from actors.envs.base import EnvSpec, StepBuffers
from actors.envs.registry import make_vec_env
from actors.shm import FieldLayout, ShmSegment, plan_layout
from configs.env_config import EnvConfig

QUIT = b"q"
STATUS_OK = 0
STATUS_ENV_RESTARTED = 1
STEP_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "final_obs", "episode_done",
               "episode_return", "episode_length")


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


def worker_layout(spec: EnvSpec, slots: int) -> tuple[list[FieldLayout], int]:
    """The shared-memory layout of one worker: StepBuffers fields over all its agent slots."""
    obs = (slots, *spec.obs_shape)
    return plan_layout([
        ("obs", obs, spec.obs_dtype), ("actions", (slots,), "int32"), ("rewards", (slots,), "float32"),
        ("terminated", (slots,), "bool"), ("truncated", (slots,), "bool"), ("final_obs", obs, spec.obs_dtype),
        ("episode_done", (slots,), "bool"), ("episode_return", (slots,), "float32"),
        ("episode_length", (slots,), "int32"),
    ])


def group_buffers(views: dict, group: int, slots_per_group: int) -> StepBuffers:
    """StepBuffers of one group: slices of the worker's arrays."""
    part = slice(group * slots_per_group, (group + 1) * slots_per_group)
    return StepBuffers(**{name: views[name][part] for name in STEP_FIELDS})


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
    envs = [make_vec_env(spec.env, spec.envs_per_group) for _ in range(spec.groups)]
    resets = [0] * spec.groups
    try:
        for g, env in enumerate(envs):
            env.reset(buffers[g], _seed(spec, g, 0))
            conn.send_bytes(bytes([g, STATUS_OK]))
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return
            if message == QUIT:
                return
            g = message[0]
            status = STATUS_OK
            try:
                envs[g].step(buffers[g])
            except Exception:  # an env's own bug: restart that env group, keep the worker alive
                traceback.print_exc()
                resets[g] += 1
                envs[g] = _restart(envs[g], spec, buffers[g], _seed(spec, g, resets[g]))
                status = STATUS_ENV_RESTARTED
            conn.send_bytes(bytes([g, status]))
    finally:
        for env in envs:
            env.close()
        del views, buffers
        segment.close()


def _seed(spec: WorkerSpec, group: int, generation: int) -> int:
    return spec.seed + 1_000_003 * spec.worker_id + 10_007 * group + 101 * generation


def _restart(env, spec: WorkerSpec, buffers: StepBuffers, seed: int):
    try:
        env.close()
    except Exception:  # the broken env may fail to close too; it is being replaced anyway
        traceback.print_exc()
    fresh = make_vec_env(spec.env, spec.envs_per_group)
    fresh.reset(buffers, seed)
    buffers.terminated[:] = True  # the aborted episodes end here; the learner must not bootstrap across
    buffers.episode_done[:] = False
    return fresh
