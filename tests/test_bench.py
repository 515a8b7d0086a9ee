"""The benchmarks in ops/bench run and print their figures (tiny windows; no figure is judged here: tests never
assert on speed), and leave no processes or shared memory behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.processes import descendants

REPO = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, timeout: float = 240) -> list[dict]:
    done = subprocess.run([sys.executable, f"ops/bench/{script}", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_pipeline_bench_reports_raw_pipeline_and_inference_figures() -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    (record,) = run_bench("pipeline.py", "--envs", "synthetic20us", "--async-factor", "2", "--seconds", "1",
                          "--envs-per-worker", "8")
    assert record["bench"] == "pipeline" and record["env"] == "synthetic20us" and record["envs_per_worker"] == 8
    assert record["raw_agent_steps_per_s"] > 0 and record["pipeline_agent_steps_per_s"] > 0
    assert record["pipeline_over_raw"] > 0 and record["target"] == 0.8
    assert 0 < record["inference_batch_agents_mean"] <= record["forward_pass_minibatch_target_size"]
    assert 0 <= record["worker_wait_fraction"] <= 1 and record["messages_rejected"] == 0
    assert record["machine"]
    assert set(Path("/dev/shm").glob("sluice_*")) <= before
    assert not descendants(os.getpid())


def test_assembler_bench_reports_its_ratio() -> None:
    records = run_bench("assembler_copy.py", "--seconds", "0.2", "--rounds", "1")
    headlines = [r for r in records if r.get("bench", r.get("benchmark")) == "assembler_copy"]
    assert headlines and all(r["assembler_over_memcpy"] > 0 and r["target"] == 0.5 for r in headlines)


def test_ingest_bench_reports_its_ratio_and_keeps_obs_bytes() -> None:
    records = run_bench("ingest.py", "--config", "configs/cartpole.yaml", "--updates", "1", "--rounds", "1")
    headline = [r for r in records if r.get("bench", r.get("benchmark")) == "ingest"]
    assert headline and headline[0]["ingest_ratio"] > 0 and headline[0]["target"] == 0.9
    assert not descendants(os.getpid())


def test_curve_cost_bench_reports_both_modes_and_their_ratio() -> None:
    records = run_bench("curve_cost.py", "--message-bytes", "100000", "--seconds", "0.5")
    modes = {r["mode"]: r for r in records if "mode" in r}
    assert set(modes) == {"plaintext", "curve"} and all(m["gbytes_per_s"] > 0 for m in modes.values())
    assert [r for r in records if r.get("curve_over_plaintext", 0) > 0]


def test_coma_spread_bench_scores_random_scripted_and_coma_team_returns() -> None:
    records = run_bench("coma_spread.py", "--seeds", "1", "--seconds", "1", "--episodes", "8", "--envs", "4",
                        "--set", "coma.rollout_length=128", "--set", "coma.hidden_sizes=[16, 16]")
    policies = {r["policy"]: r for r in records}
    assert set(policies) == {"random", "scripted", "coma"}
    assert all(r["episodes"] == 8 and r["team_return_mean"] < 0 for r in records)
    assert policies["scripted"]["team_return_mean"] > policies["random"]["team_return_mean"]
    assert policies["coma"]["transitions"] >= 128
