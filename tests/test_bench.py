"""The benchmarks in ops/bench run and print their figures (tiny windows; no figure is judged here: tests never
assert on speed), and leave no processes or shared memory behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.processes import descendants, free_port_triple

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
    records = run_bench("coma_spread.py", "--mode", "serial", "--seeds", "1", "--seconds", "1", "--episodes", "8",
                        "--envs", "4", "--set", "coma.rollout_length=128", "--set", "coma.hidden_sizes=[16, 16]")
    policies = {r["policy"]: r for r in records}
    assert set(policies) == {"random", "scripted", "coma"}
    assert all(r["episodes"] == 8 and r["team_return_mean"] < 0 for r in records)
    assert policies["scripted"]["team_return_mean"] > policies["random"]["team_return_mean"]
    assert policies["coma"]["transitions"] >= 128


def test_coma_spread_pipeline_bench_scores_the_checkpoint_and_plots_the_curve(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    plot = tmp_path / "coma.png"
    records = run_bench("coma_spread.py", "--seeds", "1", "--seconds", "20", "--episodes", "4",
                        "--port", str(free_port_triple()), "--plot", str(plot), "--set", "coma.epochs=1",
                        timeout=150)
    policies = {r["policy"]: r for r in records}
    assert set(policies) == {"random", "scripted", "coma"}
    coma = policies["coma"]
    assert coma["mode"] == "pipeline" and coma["evaluate_error"] is None and coma["learner_exit_code"] in (0, 130)
    assert coma["episodes"] == 4 and coma["team_return_mean"] < 0 and coma["agent_steps"] > 0
    assert plot.stat().st_size > 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not descendants(os.getpid())
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_spread_steps_bench_times_the_native_port_and_mpe2() -> None:
    records = run_bench("spread_steps.py", "--envs", "8", "--seconds", "0.2")
    assert [r["side"] for r in records] == ["native numba", "mpe2 simple_spread_v3"]
    assert all(r["env_steps_per_s"] > 0 and r["machine"] for r in records)
