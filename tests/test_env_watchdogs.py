"""Env watchdogs on an actor host, over real worker processes: a step that hangs past env.step_timeout_s (one
line naming the worker, env and group; the worker is killed and respawned and stepping goes on; stuck in every
life: fatal), a stopped
(SIGSTOPped) worker (reported as stopped, restarted within the deadline plus a bound), an env that writes NaN
(reported as NonFiniteOutput naming the field, env and agent, the env group restarted, nothing non-finite in the
rows; again and again: fatal), and the option's config check."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import time

import numpy as np
import pytest
import zmq

from actors.assembler import RowAssembler
from actors.env_failures import BUILD_TIMEOUT, NON_FINITE, STEP_TIMEOUT, EnvFailure, NonFiniteOutput, check_finite
from actors.null_policy import NullInference
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import SlotLayout
from actors.stepper import GroupStepper
from actors.stop_flag import StopFlag
from actors.worker import MAX_RESTARTS_IN_A_ROW
from actors.worker_pool import MAX_DEATHS_IN_A_ROW, WorkerPool
from configs.env_config import EnvConfig
from configs.loader import ConfigError, load_config
from envs.base import EnvSpec, StepBuffers
from envs.builtin.cartpole import CartPoleVec
from envs.rows import row_layout
from envs.spaces import ActionSpace
from tests.processes import shm_segments

pytestmark = pytest.mark.integration

DEADLINE_S = 2.0
BUILD_DEADLINE_S = 2.0
"""The build deadline where a respawned worker must make it: its Python start, imports and first compiled calls take
0.7-1.2 s on a loaded 2-core VM."""
WAIT_BOUND_S = 60.0
"""Longest any test waits for the workers (a loaded machine is slow to spawn; a pass is much faster)."""


def native(entry_point: str, *, deadline_s: float = DEADLINE_S, **kwargs) -> EnvConfig:
    return EnvConfig(name="native", entry_point=f"tests.faulty_envs:{entry_point}", kwargs=kwargs,
                     step_timeout_s=deadline_s)


class Host:
    """A WorkerPool, a GroupStepper (random policy) and a RowAssembler, pumped like the host's loop; full rows are
    popped as they fill and kept."""

    def __init__(self, env: EnvConfig, *, groups: int = 1) -> None:
        self.poller = zmq.Poller()
        self.report = RowsReport()
        self.layout = SlotLayout(workers=1, groups=groups, envs_per_group=2, agents_per_env=1)
        spec = CartPoleVec.SPEC
        self.assembler = RowAssembler.for_layout(row_layout(spec, horizon=5, state_size=0),
                                                 num_agents=self.layout.total_slots,
                                                 num_rows=4 * self.layout.total_slots)
        self.stepper = GroupStepper(env_spec=spec, layout=self.layout, inference=NullInference(spec, seed=0),
                                    assembler=self.assembler, states=AgentStates(self.layout.total_slots, 0))
        self.rows: list[dict[str, np.ndarray]] = []
        self.pool = WorkerPool(env_config=env, env_spec=spec, layout=self.layout, seed=0, poller=self.poller,
                               stop=StopFlag(), on_restart=self.stepper.forget_worker)

    def pump(self, until, *, timeout: float = WAIT_BOUND_S) -> None:
        """Collect, act on every ready group, wake it, keep the full rows, until ``until()``."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "the workers did not get there in time"
            self.pool.collect(self.pool.wait(50), self.report)
            if self.pool.ready:
                batch = list(self.pool.ready)
                self.pool.ready.clear()
                self.stepper.act(batch, self.report)
                self.pool.wake(batch)
            full = self.assembler.pop_full(1 << 20)
            if len(full):
                self.rows.append(self.assembler.gather(full))
                self.assembler.release(full)

    def steps(self) -> int:
        """Replies to steps (not resets) from the current worker process."""
        return self.pool.workers[0].replies - self.layout.groups

    def stop(self) -> None:
        self.pool.stop()


def watchdog_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stuck: no answer" in r.getMessage()]


def test_a_step_that_hangs_is_reported_once_and_its_worker_restarted(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sluice.actors")
    host = Host(native("HangsInStep", hang_on=20, flag=str(tmp_path / "hung")))
    try:
        host.pump(lambda: host.pool.workers[0].restarts == 1)
        first = host.pool.workers[0].process
        host.pump(lambda: host.pool.workers[0].replies > host.layout.groups + 30)  # it steps again
        assert host.pool.workers[0].process is first and host.pool.workers[0].restarts == 1
        error, restarts = host.pool.last_env_error, host.pool.env_restarts
    finally:
        host.stop()
    lines = watchdog_lines(caplog)
    assert len(lines) == 1, lines
    pattern = (r"env worker 0 \(env 'native:tests\.faulty_envs:HangsInStep', group 0\) stuck: no answer for "
               r"(\d+\.\d) s \(env\.step_timeout_s 2\), busy in env step; killing and respawning it")
    assert (match := re.fullmatch(pattern, lines[0])), lines[0]
    assert float(match.group(1)) >= DEADLINE_S
    assert error.error_type == STEP_TIMEOUT and error.message == lines[0] and restarts == 1
    assert not any("died" in r.getMessage() for r in caplog.records)  # one line, not one more at the respawn
    assert shm_segments(os.getpid()) == []


@pytest.mark.parametrize("where", ["init", "reset"])
def test_a_worker_that_hangs_building_its_envs_is_killed_and_respawned_by_the_build_deadline(tmp_path, caplog, where):
    """The first life hangs in the env's constructor or first reset; past env.build_timeout_s it is one line, an
    env error and a respawn, whose envs build and step."""
    caplog.set_level(logging.WARNING, logger="sluice.actors")
    env = dataclasses.replace(native("HangsInBuild", where=where, flag=str(tmp_path / "hung")),
                              build_timeout_s=BUILD_DEADLINE_S)
    host = Host(env)
    try:
        host.pump(lambda: host.pool.workers[0].restarts == 1)
        host.pump(lambda: host.steps() > 20)  # the new life built, reset and steps
        error = host.pool.last_env_error
    finally:
        host.stop()
    lines = [r.getMessage() for r in caplog.records if "did not build" in r.getMessage()]
    assert len(lines) == 1, lines
    assert re.fullmatch(r"env worker 0 \(env 'native:tests\.faulty_envs:HangsInBuild'\) did not build and reset its "
                        r"envs in \d+\.\d s \(env\.build_timeout_s 2\), busy building its envs; killing and "
                        r"respawning it", lines[0]), lines[0]
    assert error.error_type == BUILD_TIMEOUT and error.message == lines[0]
    assert shm_segments(os.getpid()) == []


@pytest.mark.parametrize(("stuck", "state", "watchdog", "said"), [
    ("step", "busy in env step", "step", "stuck: no answer"),
    ("build", "busy building its envs", "build", "did not build"),
])
def test_a_worker_stuck_in_every_life_is_fatal_naming_it(caplog, stuck, state, watchdog, said):
    """Stuck in its first step, or while building its envs, in every life: one line per life, then fatal."""
    caplog.set_level(logging.WARNING, logger="sluice.actors")
    env = (native("HangsInStep", hang_on=1, deadline_s=0.5) if stuck == "step" else
           dataclasses.replace(native("HangsInBuild", where="init"), build_timeout_s=1.0))
    host = Host(env)
    try:
        with pytest.raises(EnvFailure, match=f"^env worker 0 died {MAX_DEATHS_IN_A_ROW} times in a row without "
                                             rf"completing a step \(last: {state} for \d+\.\d s, killed by the "
                                             rf"{watchdog} watchdog\)"):
            host.pump(lambda: False)
    finally:
        host.stop()
    assert len([r for r in caplog.records if said in r.getMessage()]) == MAX_DEATHS_IN_A_ROW
    assert shm_segments(os.getpid()) == []


def test_a_stopped_worker_is_reported_as_stopped_and_restarted(caplog):
    caplog.set_level(logging.WARNING, logger="sluice.actors")
    host = Host(EnvConfig(step_timeout_s=DEADLINE_S), groups=2)
    try:
        host.pump(lambda: host.steps() >= 10)
        stopped = host.pool.workers[0].process
        os.kill(stopped.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        host.pump(lambda: host.pool.workers[0].restarts == 1)
        restarted_after = time.monotonic() - stopped_at
        stopped.join(timeout=10)
        assert stopped.exitcode == -signal.SIGKILL
        host.pump(lambda: host.steps() >= 10)  # the new worker steps
    finally:
        host.stop()
    assert restarted_after < DEADLINE_S + 10
    lines = watchdog_lines(caplog)
    assert len(lines) == 1, lines
    assert re.fullmatch(r"env worker 0 \(env 'cartpole', group [01]\) stuck: no answer for \d+\.\d s "
                        r"\(env\.step_timeout_s 2\), stopped \(SIGSTOP\); killing and respawning it", lines[0]), lines[0]
    assert shm_segments(os.getpid()) == []


def test_a_nan_reward_is_reported_and_never_reaches_a_row(caplog):
    caplog.set_level(logging.WARNING, logger="sluice.actors")
    host = Host(native("WritesNaN", nan_every=5, env=1))
    try:
        host.pump(lambda: host.report.env_restarts >= 3 and len(host.rows) >= 3)
        error = host.pool.last_env_error
    finally:
        host.stop()
    assert error.error_type == NON_FINITE and error.location == ""
    assert error.message == ("env 'native:tests.faulty_envs:WritesNaN' wrote a non-finite reward (nan) in step() for "
                             "env 1, agent 0")
    assert ("worker 0: env group 0 wrote a non-finite value and was restarted (1 env restarts on this host): "
            f"{error.message} (NonFiniteOutput)") in caplog.text
    for rows in host.rows:
        for name, array in rows.items():
            if array.dtype.kind == "f":
                assert np.isfinite(array).all(), name


def test_an_env_that_writes_nan_every_step_is_fatal():
    host = Host(native("WritesNaN", nan_every=1, env=0))
    try:
        with pytest.raises(EnvFailure, match=f"env worker 0: env group 0 failed {MAX_RESTARTS_IN_A_ROW} times in a "
                                             "row; last error: env 'native:tests.faulty_envs:WritesNaN' wrote a "
                                             r"non-finite reward \(nan\) in step\(\) for env 0, agent 0"):
            host.pump(lambda: False)
    finally:
        host.stop()
    assert shm_segments(os.getpid()) == []


def test_the_finite_check_names_the_field_env_and_agent_and_skips_what_nothing_reads():
    spec = EnvSpec(num_agents=2, obs_shape=(3,), obs_dtype="float32", action=ActionSpace.discrete(2))
    buffers = StepBuffers.allocate(spec, 3)

    def check() -> None:
        check_finite(buffers, agents_per_env=2, call="step", label="mine")

    check()
    buffers.obs[3, 1] = np.inf
    with pytest.raises(NonFiniteOutput, match=r"^env 'mine' wrote a non-finite obs \(inf\) in step\(\) for env 1, "
                                              r"agent 1$"):
        check()
    buffers.active[3] = False  # an inactive slot's obs is never read
    check()
    buffers.final_obs[4, 0] = np.nan  # nor a final obs where no episode was truncated
    check()
    buffers.truncated[4] = True
    with pytest.raises(NonFiniteOutput, match=r"non-finite final obs \(nan\) in step\(\) for env 2, agent 0$"):
        check()
    grid = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="uint8", action=ActionSpace.discrete(2))
    ints = StepBuffers.allocate(grid, 2)
    ints.rewards[1] = -np.inf
    with pytest.raises(NonFiniteOutput, match=r"non-finite reward \(-inf\) in reset\(\) for env 1, agent 0$"):
        check_finite(ints, agents_per_env=1, call="reset", label="grid")


@pytest.mark.parametrize("value, expected", [
    ("0", "env.step_timeout_s: 0.0 is out of range; allowed: >= 0.1"),
    ("-5", "env.step_timeout_s: -5.0 is out of range; allowed: >= 0.1"),
    ("soon", "env.step_timeout_s: expected a finite number, got 'soon'"),
    ("null", "env.step_timeout_s: a value is required (a number), got null"),
])
def test_the_step_deadline_is_checked(value, expected):
    assert load_config().env.step_timeout_s == 60.0
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[f"env.step_timeout_s={value}"])
    assert str(caught.value) == expected
