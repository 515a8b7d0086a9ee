"""Sessions survive pauses: a learner or a host frozen longer than peer_timeout_s comes back and training goes on.

The promise (docs/OPERATIONS.md, "Faults and hostile input"): after the pause ends, updates resume within RESUME_BOUND_S, every time. The cause
of the old permanent stall: REGISTERs queued while the learner was frozen each minted a new token, the host kept
the first reply's, and every ROWS message after was refused as not_registered while heartbeats were still accepted.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.processes import Run, metrics, wait_for

pytestmark = pytest.mark.integration

PEER_TIMEOUT = ("--set", "network.peer_timeout_s=2", "--set", "network.heartbeat_interval_s=0.25")
UNBOUNDED = ("--set", "trainer.target_episode_return=null")
RESUME_BOUND_S = 20.0
"""Seconds from the end of a pause to the next update (the README's bound)."""


def _updates(run: Run) -> int:
    return len(metrics(run.run_dir))


def _pause(pid: int, seconds: float) -> float:
    """SIGSTOP ``pid`` for ``seconds``; returns the monotonic time it was continued."""
    import os
    os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)
    return time.monotonic()


def _assert_updates_resume(run: Run, before: int, what: str) -> None:
    assert wait_for(lambda: _updates(run) >= before + 3, RESUME_BOUND_S), (
        f"no updates within {RESUME_BOUND_S} s after {what}\n" + run.log("learner.log")[-3000:]
        + run.log("actors.log")[-3000:])


def test_training_resumes_after_the_learner_is_paused_past_the_peer_timeout(tmp_path):
    run = Run(tmp_path, *UNBOUNDED, *PEER_TIMEOUT)
    try:
        learner = run.learner()
        host = run.actors(1)
        assert wait_for(lambda: _updates(run) >= 5, 120), run.log("learner.log") + run.log("actors.log")
        for pause_s in (4.0, 4.0):  # twice: the session must survive repeated pauses, not just the first
            _pause(learner.pid, pause_s)
            _assert_updates_resume(run, _updates(run), f"a {pause_s:.0f} s learner SIGSTOP")
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 143, run.log("learner.log")
        assert host.wait(timeout=30) == 0, run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()


def test_training_resumes_after_a_host_is_paused_past_the_peer_timeout(tmp_path):
    run = Run(tmp_path, *UNBOUNDED, *PEER_TIMEOUT)
    try:
        learner = run.learner()
        host = run.actors(1)
        assert wait_for(lambda: _updates(run) >= 5, 120), run.log("learner.log") + run.log("actors.log")
        _pause(host.pid, 4.0)
        _assert_updates_resume(run, _updates(run), "a 4 s host SIGSTOP")
        assert "forgotten" in run.log("learner.log")
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 143, run.log("learner.log")
        assert host.wait(timeout=30) == 0, run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()
