"""An actor host that dies without a word (SIGKILL, as a machine that loses power) is forgotten after
peer_timeout_s and counted as lost; the learner keeps training on the other host."""

from __future__ import annotations

import signal

import pytest

from actors.shm import unlink
from tests.processes import Run, alive, kill_tree, metrics, shm_segments, wait_for

pytestmark = pytest.mark.integration

PEER_TIMEOUT_S = 3


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    r.close()


def test_a_killed_host_is_counted_lost_and_training_goes_on(run):
    learner = run.learner("--set", "trainer.target_episode_return=null",
                          "--set", f"network.peer_timeout_s={PEER_TIMEOUT_S}")
    survivor, doomed = run.actors(1, log="a1.log"), run.actors(1, log="a2.log")
    run.note_workers(survivor)
    doomed_workers = run.note_workers(doomed)
    assert wait_for(lambda: any(r["actor_hosts"] == 2 for r in metrics(run.run_dir)), 120), run.log("learner.log")
    assert metrics(run.run_dir)[-1]["actor_hosts_lost"] == 0

    kill_tree(doomed)  # SIGKILL to the host and its workers: no BYE, no cleanup
    assert wait_for(lambda: not any(alive(pid) for pid in doomed_workers), 10)
    for name in shm_segments(doomed.pid):  # what a host's next start would remove (remove_stale_segments)
        unlink(name)
    killed_at = metrics(run.run_dir)[-1]["update"]

    def lost() -> list[dict]:
        return [r for r in metrics(run.run_dir) if r["actor_hosts_lost"] == 1]

    assert wait_for(lambda: bool(lost()), 60 + PEER_TIMEOUT_S), run.log("learner.log")
    first_lost = lost()[0]
    assert first_lost["actor_hosts"] == 1 and first_lost["actor_hosts_failed"] == 0
    assert wait_for(lambda: metrics(run.run_dir)[-1]["update"] >= max(killed_at, first_lost["update"]) + 2, 120), \
        "the learner must keep training on the remaining host"
    assert learner.poll() is None and survivor.poll() is None
    learner_log = run.log("learner.log")
    assert "silent for 3 s: forgotten" in learner_log  # lost 1, failed 0: first_lost above, from metrics.jsonl

    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143, run.log("learner.log")  # 128 + SIGTERM: stopped, not finished
    assert survivor.wait(timeout=30) == 0, run.log("a1.log")
    run.assert_clean()
