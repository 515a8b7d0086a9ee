"""COMA through the real pipeline: learner and actor host processes, shared memory, team rows over ZeroMQ. A run on
the built-in simple_spread, resumed from its checkpoint with the replay buffer kept; a run on mpe2's own
simple_spread_v3 through the PettingZoo adapter (its global state from state()); config errors a user meets first."""

from __future__ import annotations

import numpy as np
import pytest

from learner.cli import main
from tests.processes import Run, metrics, start

pytestmark = pytest.mark.integration

FAST = ("--set", "coma.epochs=2", "--set", "coma.hidden_sizes=[64, 64]")


def test_coma_trains_and_resumes_with_its_replay_buffer(tmp_path) -> None:
    # The learner counts every agent step it has received, and under load the actors can send up to about three
    # batches (18k agent steps) before the first update ends: 30k leaves room for at least two updates.
    run = Run(tmp_path, *FAST, "--set", "trainer.total_timesteps=30000", "--plain", config="configs/coma_spread.yaml")
    try:
        learner, actors = run.learner(), run.actors(1)
        assert learner.wait(timeout=240) == 0, run.log("learner.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        first = metrics(run.run_dir)
        resumed = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                        "--set", "trainer.total_timesteps=48000", "--plain", log=tmp_path / "resumed.log")
        run.procs.append(resumed)
        actors = run.actors(1, log="actors2.log")
        assert resumed.wait(timeout=240) == 0, run.log("resumed.log")
        assert actors.wait(timeout=30) == 0, run.log("actors2.log")
        run.assert_clean()
    finally:
        run.close()
    after = metrics(run.run_dir)[len(first):]
    assert len(first) >= 2 and after and after[0]["update"] == first[-1]["update"] + 1
    for record in first + after:
        assert record["transitions_added"] == 2000 and record["gradient_steps"] == 2 * 32
        assert np.isfinite([record["critic_loss"], record["q_mean"], record["actor_loss_0"]]).all()
        assert record["episode_length_mean"] == 25
    fills = [record["buffer_fill"] for record in first + after]
    assert fills == pytest.approx([0.02 * (i + 1) for i in range(len(fills))])  # the replay went on from the checkpoint
    assert first[-1]["agent_steps"] >= 30000 and after[-1]["agent_steps"] >= 48000


def test_coma_runs_on_mpe2_through_the_pettingzoo_adapter(tmp_path) -> None:
    run = Run(tmp_path, *FAST, "--set", "trainer.batch_size=500", "--set", "coma.rollout_length=500",
              "--set", "trainer.minibatch_size=500", "--set", "trainer.forward_pass_minibatch_target_size=24",
              "--set", "trainer.total_timesteps=3000", config="configs/coma_mpe_spread.yaml")
    try:
        run.train_to_the_end(1)
    finally:
        run.close()
    records = metrics(run.run_dir)
    assert len(records) >= 2 and records[-1]["transitions_added"] == 500
    assert np.isfinite(records[-1]["critic_loss"]) and records[-1]["episode_length_mean"] == 25


@pytest.mark.parametrize(("overrides", "message"), [
    (["--config", "cartpole"], "trainer.algorithm coma needs continuous (box) actions; this env's are Discrete(2)"),
    (["--config", "coma_spread", "--set", "trainer.batch_size=4000"],
     "trainer.batch_size (4000 env steps) must equal coma.rollout_length (2000)"),
    (["--config", "coma_spread", "--set", "model.core=lstm"], "model.core must be mlp, got 'lstm'"),
    (["--config", "coma_spread", "--set", "selfplay.enabled=true"], "selfplay.enabled must be false"),
])
def test_coma_config_errors_name_the_problem(tmp_path, capsys, overrides: list[str], message: str) -> None:
    extra = [] if "coma_spread" in overrides else ["--set", "trainer.algorithm=coma", "--set",
                                                   "coma.rollout_length=8192"]
    assert main([*overrides, "--run-dir", str(tmp_path / "run"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
