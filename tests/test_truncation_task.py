"""Time-limit bootstrapping end to end: real learner and actor processes on the truncation probe.

probe_truncation shows one constant (zero) observation, pays 1 per step and is truncated, never terminated,
after 50 steps. The actor host ships V(final obs) of truncated episodes as ``bootstrap`` and the learner adds
``gamma * bootstrap`` to that transition's reward, so the value of the observation must converge to
``1 / (1 - gamma)`` = 20 at gamma 0.95. A learner that treated the time limit as terminal would instead
learn the mean, over the 50 positions in an episode, of the truncated discounted sum (~13).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.registry import env_spec
from configs.loader import load_config
from learner.run.checkpoint import list_checkpoints, load_checkpoint
from policies.factory import make_policy
from tests.processes import REPO, alive, descendants, free_port_triple, kill_tree, shm_segments, start, wait_for

pytestmark = pytest.mark.integration

CONFIG = REPO / "configs" / "probe_truncation.yaml"


def non_bootstrapped_value(gamma: float, max_steps: int) -> float:
    """Mean over an episode's steps of the discounted sum of the rewards left before the time limit."""
    discounts = gamma ** np.arange(max_steps)
    return float(np.mean([discounts[: max_steps - k].sum() for k in range(max_steps)]))


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            kill_tree(proc)


def test_value_converges_to_the_bootstrapped_return(tmp_path: Path, procs: list) -> None:
    config = load_config(CONFIG)
    gamma, max_steps = config.trainer.gamma, config.env.max_steps
    assert (gamma, max_steps) == (0.95, 50)
    target = 1.0 / (1.0 - gamma)
    wrong = non_bootstrapped_value(gamma, max_steps)
    assert abs(wrong - target) > 5.0  # the probe separates the two answers (20 vs ~13)

    port = free_port_triple()
    run_dir = tmp_path / "run"
    learner = start("learner", "--config", str(CONFIG), "--run-dir", str(run_dir),
                    "--set", f"network.port={port}", log=tmp_path / "learner.log")
    procs.append(learner)
    actors = start("actors", "--n", "1", "--learner", f"tcp://127.0.0.1:{port}", log=tmp_path / "actors.log")
    procs.append(actors)
    assert wait_for(lambda: len(descendants(actors.pid)) >= 1, 30)
    workers = descendants(actors.pid)

    assert learner.wait(timeout=150) == 0, (tmp_path / "learner.log").read_text()
    assert actors.wait(timeout=30) == 0, (tmp_path / "actors.log").read_text()
    assert "reached total_timesteps" in (tmp_path / "learner.log").read_text()
    for proc in (learner, actors):
        assert not alive(proc.pid)
        assert shm_segments(proc.pid) == [], f"leaked shared memory of {proc.args}"
    assert wait_for(lambda: not any(alive(pid) for pid in workers), 5), "orphaned env workers"

    checkpoints = list_checkpoints(run_dir)
    assert checkpoints, "no checkpoint written"
    policy = make_policy(env_spec(config.env), config.model)
    checkpoint = load_checkpoint(checkpoints[-1])
    policy.load_state_dict(checkpoint.learned.modules["model"])
    state = checkpoint.trainer_state
    assert state.env_steps >= config.trainer.total_timesteps
    policy.eval()
    with torch.no_grad():
        _, value = policy(torch.zeros(1, *env_spec(config.env).obs_shape))
    v = float(value[0])
    print(f"V(0) = {v:.3f}; bootstrapped target {target:.3f}, non-bootstrapped {wrong:.3f}")
    assert abs(v - target) < 0.1 * target, f"V(0) = {v:.3f}, expected {target:.3f} +- 10%"
    assert abs(v - wrong) > 5.0, f"V(0) = {v:.3f} is near the non-bootstrapped {wrong:.3f}"
