"""The memory probe with real learner and actor processes: an LSTM core solves it, an MLP cannot.

probe_memory shows a +-1 cue on the first observation only and asks for it ``delay`` = 8 steps later, so a
memoryless policy averages return 0 whatever it learns, and reaching 0.9 needs the recurrent state to be
carried by the actor host, stored with each row and replayed by the learner's BPTT.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_integration import Run, metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = "configs/probe_memory.yaml"
MLP_TIMESTEPS = 200_000
"""The MLP's budget: about twice the env steps the LSTM needs to solve (90-120k on a 2-core machine)."""


@pytest.fixture
def memory_run(tmp_path: Path):
    run = Run(tmp_path)
    run.learner_args[run.learner_args.index("configs/cartpole.yaml")] = CONFIG
    yield run
    run.close()


def test_lstm_solves_memory_probe(memory_run: Run) -> None:
    learner = memory_run.learner()
    actors = memory_run.actors(2)
    memory_run.note_workers(actors)
    assert learner.wait(timeout=180) == 0, memory_run.log("learner.log")
    assert actors.wait(timeout=30) == 0, memory_run.log("actors.log")
    assert "solved: mean return" in memory_run.log("learner.log")
    last = metrics(memory_run.run_dir)[-1]
    assert last["episode_return_mean"] >= 0.9
    assert "stopped (learner: target return reached)" in memory_run.log("actors.log")
    memory_run.assert_clean()


def test_mlp_cannot_solve_memory_probe(memory_run: Run) -> None:
    learner = memory_run.learner("--set", "model.core=mlp", "--set", "trainer.target_episode_return=null",
                                 "--set", f"trainer.total_timesteps={MLP_TIMESTEPS}")
    actors = memory_run.actors(2)
    memory_run.note_workers(actors)
    assert learner.wait(timeout=180) == 0, memory_run.log("learner.log")
    assert actors.wait(timeout=30) == 0, memory_run.log("actors.log")
    records = metrics(memory_run.run_dir)
    assert records[-1]["env_steps"] >= MLP_TIMESTEPS
    assert "solved" not in memory_run.log("learner.log")
    assert records[-1]["episode_return_mean"] < 0.3  # a coin flip: 0 +- 0.1 over the last 100 episodes
    memory_run.assert_clean()
