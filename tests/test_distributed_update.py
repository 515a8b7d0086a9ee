"""The data-parallel PPO update (issue 15) with real processes over gloo: two ranks holding half the rows each take
the single-process update on the whole batch; a rank whose peer hangs or never joins fails with its timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs.schema import TrainerSection
from learner.coma.algorithm import Coma
from tests.distributed_coma_case import SECTION, SHAPES, make_coma_case, run_coma_steps
from tests.distributed_update_worker import TIMEOUT_EXIT, build_learner, make_case, run_update

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
ROWS = 8
PROCESS_WAIT_S = 120.0
"""Longest the test waits for a rank process (torch's import on a loaded 2-core machine takes seconds)."""


def trainer_settings(**overrides: object) -> dict:
    """One minibatch per epoch holding every row (the setting where the ranks' minibatches are the single one's),
    several epochs, prioritized sampling, advantage and value-target normalisation, gradient clipping."""
    settings = dict(batch_size=ROWS * 4, minibatch_size=ROWS * 4, bptt_horizon=4, num_workers=1,
                    forward_pass_minibatch_target_size=1, update_epochs=3, gamma=0.99, gae_lambda=0.95,
                    clip_coef=0.2, vf_clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                    prio_alpha=0.6, norm_adv=True, clip_vloss=True, norm_value_targets=True)
    settings.update(overrides)
    return settings


def start_rank(directory: Path, rank: int, *, world_size: int, timeout_s: float,
               stall: bool = False, coma: bool = False) -> subprocess.Popen:
    command = [sys.executable, "-m", "tests.distributed_update_worker", "--rank", str(rank), "--world-size",
               str(world_size), "--init-method", f"file://{directory / 'rendezvous'}", "--directory",
               str(directory), "--timeout-s", str(timeout_s)] + (["--stall"] if stall else []) + \
        (["--coma"] if coma else [])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(processes: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """Wait for every process (killing any still running past PROCESS_WAIT_S); their exit statuses and stderr."""
    results = []
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=PROCESS_WAIT_S)
            results.append((process.returncode, stderr))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return results


def test_two_ranks_take_the_single_process_update(tmp_path):
    settings = trainer_settings()
    case = make_case(ROWS, seed=3)
    save_file(case, str(tmp_path / "batch.safetensors"))
    (tmp_path / "trainer.json").write_text(json.dumps(settings))
    processes = [start_rank(tmp_path, rank, world_size=2, timeout_s=60.0) for rank in range(2)]
    for status, stderr in finish(processes):
        assert status == 0, stderr

    policy, value_normalizer, metrics = run_update(case, TrainerSection(**settings), rank=0, world_size=1)
    expected = {**{f"policy.{k}": v for k, v in policy.state_dict().items()},
                **{f"value_normalizer.{k}": v for k, v in value_normalizer.state_dict().items()}}
    initial = build_learner(seed=0)[0].state_dict()
    for rank in range(2):
        got = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, atol=1e-5, rtol=1e-5, msg=f"rank {rank}: {name}")
        rank_metrics = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "grad_norm",
                    "explained_variance", "advantage_mean", "ratio_mean", "is_weight_mean", "is_weight_min",
                    "is_weight_max", "gradient_steps"):
            assert rank_metrics[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-5), (rank, key)
    moved = [name for name, tensor in policy.state_dict().items() if not torch.equal(tensor, initial[name])]
    assert moved, "the update did not move the weights: the comparison would be vacuous"
    assert metrics["is_weight_min"] < metrics["is_weight_max"]  # prioritized: the weights use global P(i)


def test_two_ranks_take_the_single_process_coma_steps(tmp_path):
    """COMA under ranks: each holds half of a gradient step's transitions; its critic and actor gradients averaged
    over the ranks give the single process's steps on all of them (critic, actors and both soft-updated targets)."""
    case = make_coma_case(seed=5)
    save_file(case, str(tmp_path / "coma.safetensors"))
    processes = [start_rank(tmp_path, rank, world_size=2, timeout_s=60.0, coma=True) for rank in range(2)]
    for status, stderr in finish(processes):
        assert status == 0, stderr

    coma, steps = run_coma_steps(case, rank=0, world_size=1)
    expected = coma.state_dict()
    initial = Coma(SHAPES, SECTION, seed=0, device=torch.device("cpu")).state_dict()
    rank_steps = []
    for rank in range(2):
        got = load_file(str(tmp_path / f"coma{rank}.safetensors"))
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, atol=1e-5, rtol=1e-5, msg=f"rank {rank}: {name}")
        rank_steps.append(json.loads((tmp_path / f"coma{rank}.json").read_text()))
    for step, want in enumerate(steps):  # each rank's loss is its half's mean: their average is the whole's
        for key in ("critic_loss", "q_mean", "actor_loss_0", "actor_loss_1", "entropy", "action_std"):
            mean = (rank_steps[0][step][key] + rank_steps[1][step][key]) / 2
            assert mean == pytest.approx(want[key], rel=1e-4, abs=1e-5), (step, key)
        assert rank_steps[0][step]["critic_grad_norm"] == pytest.approx(want["critic_grad_norm"], rel=1e-4)
    for prefix in ("critic.", "actors.", "target_critic.", "target_actors."):
        assert any(not torch.equal(t, initial[n]) for n, t in expected.items() if n.startswith(prefix)), prefix


def test_a_rank_whose_peer_hangs_times_out(tmp_path):
    (tmp_path / "trainer.json").write_text(json.dumps(trainer_settings()))
    save_file(make_case(ROWS, seed=0), str(tmp_path / "batch.safetensors"))
    stalled = start_rank(tmp_path, 1, world_size=2, timeout_s=3.0, stall=True)
    try:
        [(status, stderr)] = finish([start_rank(tmp_path, 0, world_size=2, timeout_s=3.0)])
    finally:
        stalled.kill()
        stalled.communicate()
    assert status == TIMEOUT_EXIT, stderr
    assert "CollectiveTimeout: learner rank 0 of 2:" in stderr and "did not complete within 3 s" in stderr


def test_a_rank_whose_peer_never_joins_times_out(tmp_path):
    [(status, stderr)] = finish([start_rank(tmp_path, 0, world_size=2, timeout_s=3.0)])
    assert status == TIMEOUT_EXIT, stderr
    assert "CollectiveTimeout: learner rank 0 of 2: the ranks did not all join the gloo process group" in stderr
