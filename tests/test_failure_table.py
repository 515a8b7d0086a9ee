"""The failure table, one test per row, with real learner and actor processes (tiny CartPole runs):

| failure                                   | what must happen                                                   |
| ----------------------------------------- | ------------------------------------------------------------------ |
| an env raises in step                     | the env group is rebuilt; the host keeps running; the learner logs |
|                                           | the error and counts env_restarts                                  |
| a worker process dies once                | it is respawned; the host and the learner keep running             |
| a worker process dies in a loop           | the host stops (exit 1) naming the worker and its exit cause; its  |
|                                           | BYE tells the learner, which logs it and counts a failed host      |
| SIGTERM to an actor host                  | clean exit 0, workers reaped, no /dev/shm segment left; the        |
|                                           | learner keeps running                                              |
| SIGTERM to the learner                    | tests/test_integration.py::test_sigterm_to_learner_stops_everything_cleanly |
|                                           | (exit 143 = 128 + SIGTERM, after the final checkpoint)             |
| the learner is killed (SIGKILL), resumed  | metrics.jsonl holds each update once (the killed run's records     |
|                                           | after its last checkpoint are dropped, then written again)         |
| a non-finite loss                         | the optimizer step is skipped and counted; the weights stay        |

Every process test ends with ``Run.assert_clean``: no process left, no orphan worker, no shared memory.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from configs.plan import make_plan
from configs.schema import ModelSection
from learner.update.batch import RowBatch
from learner.ppo.algorithm import PPO
from tests.processes import Run, alive, descendants, metrics, start, wait_for
from tests.test_ppo import SPEC, make_case, make_trainer

pytestmark = pytest.mark.integration

TINY = ["--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
        "--set", "trainer.target_episode_return=null"]


def faulty_env(entry_point: str, kwargs: str) -> list[str]:
    """Learner arguments that run the native env ``tests.faulty_envs:<entry_point>`` with ``kwargs`` (YAML)."""
    return ["--set", "env.name=native", "--set", f"env.entry_point=tests.faulty_envs:{entry_point}",
            "--set", f"env.kwargs={kwargs}"]


def env_workers(host_pid: int) -> set[int]:
    """The env worker processes of an actor host (its spawned children that run ``spawn_main``)."""
    def is_worker(pid: int) -> bool:
        try:
            return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
    return {pid for pid in descendants(host_pid) if is_worker(pid)}


def stop_learner(run: Run, learner) -> None:
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143, run.log("learner.log")  # 128 + SIGTERM: stopped, not finished


def test_an_env_that_raises_is_restarted_and_the_host_keeps_running(tmp_path):
    run = Run(tmp_path, *TINY, *faulty_env("FlakyCartPole", "{fail_every: 30}"))
    try:
        learner = run.learner()
        actors = run.actors(1)
        run.note_workers(actors)
        assert wait_for(lambda: sum(r["env_restarts"] for r in metrics(run.run_dir)) >= 2, 120), run.log("actors.log")
        assert actors.poll() is None, run.log("actors.log")
        # the learner logs the env error when the next heartbeat brings it (up to one heartbeat after the restart)
        assert wait_for(lambda: "flaky env: failing on step call 30" in run.log("learner.log"), 30), run.log("learner.log")
        stop_learner(run, learner)
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()


def test_a_worker_that_dies_once_is_respawned(tmp_path):
    run = Run(tmp_path, *TINY)
    try:
        learner = run.learner()
        actors = run.actors(2)
        first = run.note_workers(actors)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 1 and len(env_workers(actors.pid)) == 2, 120)
        victim = min(env_workers(actors.pid))
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: "respawned" in run.log("actors.log"), 30), run.log("actors.log")
        assert "died (killed by SIGKILL; 1 in a row); respawned" in run.log("actors.log")
        updates = len(metrics(run.run_dir))
        assert wait_for(lambda: len(metrics(run.run_dir)) >= updates + 2, 120), run.log("actors.log")
        assert actors.poll() is None and not alive(victim)
        run.workers[actors.pid] = first | descendants(actors.pid)  # the respawned one must be reaped too
        stop_learner(run, learner)
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()


def test_a_worker_that_dies_in_a_loop_stops_the_host_and_the_learner_hears_why(tmp_path):
    run = Run(tmp_path, *TINY, *faulty_env("DiesInStep", "{die_on: 1, kill_with: SIGKILL}"))
    try:
        learner = run.learner()
        actors = run.actors(1)
        assert actors.wait(timeout=120) == 1, run.log("actors.log")
        why = "env worker 0 died 3 times in a row without completing a step (last: killed by SIGKILL)"
        assert f"python -m actors: error: {why}" in run.log("actors.log")
        assert wait_for(lambda: f"left: env error worker process died: {why}" in run.log("learner.log"), 10), \
            run.log("learner.log")
        assert learner.poll() is None, "the learner keeps running when a host fails"
        stop_learner(run, learner)
        run.assert_clean()
    finally:
        run.close()


def test_sigterm_to_an_actor_host_exits_cleanly(tmp_path):
    run = Run(tmp_path, *TINY)
    try:
        learner = run.learner()
        actors = run.actors(2)
        run.note_workers(actors)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 1, 120), run.log("learner.log")
        actors.send_signal(signal.SIGTERM)
        assert actors.wait(timeout=30) == 143, run.log("actors.log")  # 128 + SIGTERM
        assert "stopped (SIGTERM received)" in run.log("actors.log")
        assert learner.poll() is None, "the learner keeps running when an actor host leaves"
        stop_learner(run, learner)
        run.assert_clean()
    finally:
        run.close()


def test_a_killed_and_resumed_learner_writes_each_update_once(tmp_path):
    run = Run(tmp_path, *TINY, "--set", "run.checkpoint_interval=3", "--set", "trainer.total_timesteps=1000000")
    try:
        learner = run.learner()
        actors = run.actors(2)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 4 and len(metrics(run.run_dir)) % 3, 120)
        learner.send_signal(signal.SIGKILL)  # records written after its last checkpoint (update 3, 6...) stay
        learner.wait(timeout=10)
        killed = metrics(run.run_dir)[-1]
        killed_at = killed["update"]
        resumed = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                        "--set", f"trainer.total_timesteps={killed['agent_steps'] + 4 * 2048}",
                        log=tmp_path / "resumed.log")
        run.procs.append(resumed)
        assert resumed.wait(timeout=120) == 0, run.log("resumed.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        updates = [r["update"] for r in metrics(run.run_dir)]
        assert updates == list(range(1, len(updates) + 1)), updates  # each update once, in order
        assert len(updates) >= killed_at and not list(run.run_dir.glob(".tmp-*"))  # the resumed run got past the kill
        if killed_at % 3:  # an update may finish between the check and the kill
            assert "records newer than update" in run.log("resumed.log")
        run.assert_clean()
    finally:
        run.close()


def test_a_non_finite_loss_skips_the_step_counts_it_and_leaves_the_weights():
    trainer = make_trainer(minibatch_size=32 // 2, update_epochs=2)
    plan = make_plan(trainer, num_agents=1)
    algorithm = PPO(spec=SPEC, model=ModelSection(hidden_size=8, num_layers=1), trainer=trainer, plan=plan,
                    device=torch.device("cpu"), minibatch_seed=0)
    _, batch, _ = make_case(7, 0.25)
    values = batch.values.clone()
    values[:, 1] = float("inf")  # every row, so every minibatch: a non-finite loss
    poisoned = RowBatch(**{**batch.__dict__, "values": values})
    weights = {k: v.clone() for k, v in algorithm.policy.state_dict().items()}
    result = algorithm.update(poisoned, update_index=0)
    assert (result["gradient_steps"], result["skipped_steps"]) == (0.0, 4.0)
    for name, value in algorithm.policy.state_dict().items():
        assert torch.equal(value, weights[name]), name
    for state in algorithm.optimizer.state.values():  # the fused Adam skipped every step: no moments carry poison
        assert float(state["step"]) == 0.0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    clean = algorithm.update(batch, update_index=1)  # the next finite batch trains as usual
    assert (clean["gradient_steps"], clean["skipped_steps"]) == (4.0, 0.0)
    assert any(not torch.equal(v, weights[k]) for k, v in algorithm.policy.state_dict().items())
