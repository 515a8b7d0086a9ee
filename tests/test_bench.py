"""The benchmarks in ops/bench run and print their figures (tiny windows; no figure is judged here: tests never
assert on speed), and leave no processes or shared memory behind. The learning experiments of ops/experiments:
tests/test_experiments.py."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from actors.worker_channel import WAKE
from tests.processes import descendants

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def run_bench(module: str, *args: str, timeout: float = 240) -> list[dict]:
    """``python -m ops.bench.<module> args`` from the repository root; its JSON records."""
    done = subprocess.run([sys.executable, "-m", f"ops.bench.{module}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("transport", [None, "ipc"])
def test_pipeline_bench_reports_raw_pipeline_and_inference_figures(transport: str | None) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    sizes = ("network.message_bytes=0", "network.rows_per_message=16", "network.send_queue_messages=3")
    (record,) = run_bench("pipeline", "--envs", "synthetic20us", "--async-factor", "2", "--seconds", "1",
                          "--envs-per-worker", "8", *(part for size in sizes for part in ("--set", size)),
                          *(["--transport", transport] if transport else []))
    assert record["bench"] == "pipeline" and record["env"] == "synthetic20us" and record["envs_per_worker"] == 8
    assert record["overrides"] == list(sizes) and record["rows_per_message"] == 16 and record["data_hwm"] == 3
    # the default, shm, is what a learner on the host's machine offers; the sink checks the connection and messages
    assert record["transport"] == (transport or "shm")
    assert record["raw_agent_steps_per_s"] > 0 and record["pipeline_agent_steps_per_s"] > 0
    assert record["pipeline_over_raw"] > 0 and record["target"] == 0.8
    assert record["round"] == 1 and record["load_before_raw"] >= 0 and record["load_before_pipeline"] >= 0
    assert record["env_cpu_us_per_agent_step"] > 0 and record["cpu_us_per_agent_step_host"] > 0
    assert 0 < record["predicted_pipeline_over_raw"] < 1 and record["host_max_agent_steps_per_s"] > 0
    assert 0 < record["inference_batch_agents_mean"] <= record["forward_pass_minibatch_target_size"]
    assert 0 <= record["worker_wait_fraction"] <= 1 and record["messages_rejected"] == 0
    assert record["machine"]
    assert set(Path("/dev/shm").glob("sluice_*")) <= before
    assert not descendants(os.getpid())


@pytest.mark.parametrize("without", [[], ["--host-without", "gather"]])
def test_pipeline_bench_times_the_hosts_stages(without: list[str]) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    (record,) = run_bench("pipeline", "--envs", "synthetic20us", "--async-factor", "2", "--seconds", "1",
                          "--envs-per-worker", "8", "--pipeline-only", "--host-stages", *without)
    assert record.get("host_without", []) == without[1:] and record["messages_shared_fraction"] == 1.0
    figures = record["host_stages_cpu_us_per_agent_step"]
    assert {"poll", "collect", "act.scan", "act.policy", "act.wake", "act.assembler", "ship.gather", "ship.send",
            "main_thread", "process"} <= figures.keys()
    assert all(value >= 0 for value in figures.values()) and figures["main_thread"] > 0
    parts = sum(value for name, value in figures.items() if name not in ("main_thread", "process"))
    assert parts == pytest.approx(figures["main_thread"], rel=0.2)  # groups of 4 agents: the clock's error shows
    assert record["host_stages_agent_steps"] > 0 and record["host_stages_clock_us_per_call"] > 0
    assert not list(Path(tempfile.gettempdir()).glob("sluice_host_stages_*"))
    assert set(Path("/dev/shm").glob("sluice_*")) <= before
    assert not descendants(os.getpid())


@pytest.mark.parametrize("args, message", [
    (["--hosts", "2", "--host-stages"], "--profile-host and --host-stages time one host process: leave --hosts out"),
    (["--profile-host", "x.prof", "--host-stages"], "--profile-host or --host-stages: one at a time"),
    (["--host-without", "gather"], "--host-without changes what --host-stages times: add --host-stages"),
    (["--host-stages", "--host-without", "gather", "--transport", "ipc"],
     "--host-without gather leaves rows out of the shared-memory slot: it needs --transport shm"),
    (["--host-stages", "--host-without", "scan"], "argument --host-without: invalid choice: 'scan'")])
def test_pipeline_bench_refuses_host_stages_it_cannot_time(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "ops.bench.pipeline", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


def test_fixed_costs_bench_fits_per_group_and_per_message_costs() -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    records = run_bench("fixed_costs", "--envs", "synthetic20us", "--envs-per-worker", "8", "16",
                        "--message-rows", "8", "16", "--seconds", "1")
    runs, (fit,) = records[:-1], records[-1:]
    assert [(r["envs_per_worker"], r["rows_per_message"]) for r in runs] == [(8, 8), (8, 16), (16, 8), (16, 16)]
    assert [r["agent_steps_per_group"] for r in runs] == [4, 4, 8, 8]  # async factor 2, one agent per env
    assert all(r["agent_steps_per_message"] > 0 and r["cpu_us_per_agent_step_host"] > 0 for r in runs)
    assert fit["runs"] == 4 and fit["agent_steps_per_group"] == [4, 8] and fit["rows_per_message"] == [8, 16]
    for kind in ("host", "workers", "sink"):
        assert {f"{kind}_fixed_us_per_group", f"{kind}_fixed_us_per_message", f"{kind}_marginal_us_per_agent_step",
                f"{kind}_rms_residual_us"} <= fit.keys()
    assert set(Path("/dev/shm").glob("sluice_*")) <= before
    assert not descendants(os.getpid())


def test_fixed_costs_bench_refuses_a_sweep_it_cannot_fit() -> None:
    done = subprocess.run([sys.executable, "-m", "ops.bench.fixed_costs", "--envs-per-worker", "64", "64"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--envs-per-worker: the fit needs two different positive sizes at least, got [64, 64]" in done.stderr


def test_message_cost_bench_streams_both_frame_layouts() -> None:
    records = run_bench("message_cost", "--configs", "configs/cartpole.yaml", "--messages", "20", "--rounds", "1")
    assert [(r["frames"], r["frame_count"]) for r in records] == [("per_array", 16), ("packed", 3)]
    assert all(r["encode_us"] > 0 and r["decode_us"] > 0 and r["send_cpu_us"] > 0 and r["recv_cpu_us"] > 0
               and r["encode_packed_us"] > 0 and r["decode_packed_us"] > 0
               and r["send_multipart_us"] > 0 and r["send_nonblocking_us"] > 0
               and r["messages"] == 20 and r["arrays"] == 14 for r in records)
    assert not descendants(os.getpid())
    assert not list(Path(tempfile.gettempdir()).glob("sluice_message_cost_*"))


def test_message_cost_bench_refuses_too_few_messages() -> None:
    done = subprocess.run([sys.executable, "-m", "ops.bench.message_cost", "--messages", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--messages: 2 at least (the first one is not timed), got 1" in done.stderr


def test_group_cost_bench_times_the_inference_step_and_the_wake_round_trip() -> None:
    records = run_bench("group_cost", "--config", "configs/cartpole.yaml", "--calls", "200", "--rounds", "1",
                        "--step-us", "0", "20")
    wakes = [r for r in records if r["kind"] == "wake"]
    assert [r["step_us"] for r in wakes] == [0.0, 20.0]
    assert all(r["host_cpu_us_per_round_trip"] > 0 and r["wall_us_per_round_trip"] > 0 for r in wakes)
    assert wakes[1]["wall_us_per_round_trip"] >= 20  # the woken process's step is inside each round trip
    handoffs = [r for r in records if r["kind"] == "handoff"]
    assert [r["step_us"] for r in handoffs] == [0.0, 20.0]
    assert all(r["host_cpu_us_per_round_trip"] > 0 for r in handoffs) and handoffs[1]["wall_us_per_round_trip"] >= 20
    assert not list(Path("/dev/shm").glob("sluice_*_group_cost"))
    (act,) = [r for r in records if r["kind"] == "act"]
    assert act["config"] == "configs/cartpole.yaml" and act["slots_per_group"] > 0 and act["calls"] == 200
    assert 0 < act["us_per_agent_step"] < act["us_per_call"] and act["policy"] == "null"
    records = run_bench("group_cost", "--config", "configs/cartpole.yaml", "--calls", "50", "--rounds", "1",
                        "--step-us", "0", "--policy", "model", "--set", "model.obs_norm=true")
    (act,) = [r for r in records if r["kind"] == "act"]
    assert act["policy"] == "model" and 0 < act["decide_us_per_call"] < act["us_per_call"]
    assert act["overrides"] == ["model.obs_norm=true"]
    assert not descendants(os.getpid())


def test_group_cost_bench_stops_with_a_message_when_the_woken_process_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.bench import group_cost
    monkeypatch.setattr(group_cost, "ANSWER_TIMEOUT_MS", 50)
    host, silent = socket.socketpair()
    poller = select.poll()
    poller.register(host.fileno(), select.POLLIN)
    with pytest.raises(SystemExit, match="the woken process did not answer within 50 ms"):
        group_cost._round_trip(host.fileno(), poller)
    silent.close()  # gone: writing to it fails
    with pytest.raises(SystemExit, match="the woken process is gone"):
        group_cost._round_trip(host.fileno(), poller)
    host.close()


def test_group_cost_bench_stops_with_a_message_when_the_process_handed_a_group_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.bench import group_cost
    monkeypatch.setattr(group_cost, "ANSWER_TIMEOUT_MS", 50)
    host, silent = socket.socketpair()
    arrays = {name: np.zeros(shape, dtype=np.int64) for name, shape in
              (("commands", (1, 1)), ("answers", (1, 1)), ("sleeping", (2,)))}
    arrays["sleeping"][0] = 1  # asleep: the host writes WAKE, and nobody reads it
    handoff = group_cost.HandoffHost(arrays, host.fileno())
    with pytest.raises(SystemExit, match="the process handed a group did not answer within 50 ms"):
        handoff.round_trip()
    assert silent.recv(1) == bytes([WAKE]) and arrays["sleeping"][1] == 0
    silent.close()  # gone: writing to it fails
    with pytest.raises(SystemExit, match="the process handed a group is gone"):
        handoff.round_trip()
    host.close()


@pytest.mark.parametrize(("args", "message"), [
    (("--calls", "0"), "--calls, --rounds and --groups-per-call: 1 at least, got 0, 3 and 1"),
    (("--step-us", "-5"), "--step-us: 0 or more, got [-5.0]"),
    (("--set", "model.obs_nrom=true"), "unknown key 'model.obs_nrom' (did you mean 'obs_norm'?)"),
])
def test_group_cost_bench_refuses_sizes_it_cannot_time(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "ops.bench.group_cost", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


def test_assembler_bench_reports_its_ratio() -> None:
    records = run_bench("assembler_copy", "--seconds", "0.2", "--rounds", "1")
    headlines = [r for r in records if r.get("bench", r.get("benchmark")) == "assembler_copy"]
    assert headlines and all(r["assembler_over_memcpy"] > 0 and r["target"] == 0.5 for r in headlines)


def test_ingest_bench_reports_its_ratio_and_keeps_obs_bytes() -> None:
    records = run_bench("ingest", "--config", "configs/cartpole.yaml", "--updates", "1", "--rounds", "1")
    headline = [r for r in records if r.get("bench", r.get("benchmark")) == "ingest"]
    assert headline and headline[0]["ingest_ratio"] > 0 and headline[0]["target"] == 0.9
    assert not descendants(os.getpid())


TINY_LEARNER_BATCH = ("--set", "trainer.batch_size=256", "--set", "trainer.minibatch_size=128", "--set",
                      "trainer.bptt_horizon=16", "--set", "trainer.update_epochs=1", "--set",
                      "trainer.forward_pass_minibatch_target_size=4")
"""16 rows of 16 steps in minibatches of 8 rows: two ranks hold 8 rows and draw 4 per minibatch."""


def test_learner_update_bench_times_one_and_two_ranks() -> None:
    records = run_bench("learner_update", "--ranks", "1", "--ranks", "2", "--updates", "1", "--no-compile",
                        *TINY_LEARNER_BATCH, timeout=120)
    assert [(r["ranks"], r["compile"]) for r in records] == [(1, False), (2, False)]
    for record in records:
        assert record["samples_per_s"] > 0 and record["rank_threads"] >= 1 and record["update_s_median"] > 0
        assert record["segments"] == 16 and record["rank_segments"] == 16 // record["ranks"]
    assert records[0]["rank_threads"] == os.cpu_count() and records[1]["rank_threads"] == max(1, os.cpu_count() // 2)
    assert not descendants(os.getpid())


def test_learner_update_bench_refuses_ranks_that_do_not_split_the_batch() -> None:
    done = subprocess.run([sys.executable, "-m", "ops.bench.learner_update", "--ranks", "3", "--no-compile",
                           *TINY_LEARNER_BATCH], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--ranks 3: segments (16) must be divisible by the learner ranks (3)" in done.stderr
    assert not done.stdout


def test_curve_cost_bench_reports_both_modes_and_their_ratio() -> None:
    records = run_bench("curve_cost", "--message-bytes", "100000", "--seconds", "0.5")
    modes = {r["mode"]: r for r in records if "mode" in r}
    assert set(modes) == {"plaintext", "curve"} and all(m["gbytes_per_s"] > 0 for m in modes.values())
    assert [r for r in records if r.get("curve_over_plaintext", 0) > 0]


def test_coma_step_bench_times_a_gradient_step() -> None:
    (record,) = run_bench("coma_step", "--steps", "3", "--repeats", "2", "--warmup", "1",
                          "--set", "coma.hidden_sizes=[32, 32]", "--set", "coma.batch_size=16")
    assert record["bench"] == "coma_step" and record["batch_size"] == 16 and record["hidden_sizes"] == [32, 32]
    assert 0 < record["ms_per_step_best"] <= record["ms_per_step_median"] and record["fused_adam"] is True


def test_opponent_inference_bench_times_separate_and_batched_passes() -> None:
    records = run_bench("opponent_inference", "--snapshots", "3", "--rows", "2", "5", "--steps", "2",
                        "--repeats", "1")
    assert [(r["bench"], r["snapshots"], r["rows"]) for r in records] == [("opponent_inference", 3, 2),
                                                                         ("opponent_inference", 3, 5)]
    for record in records:
        assert all(record[key] > 0 for key in ("separate_ms", "batched_ms", "batched_subset_ms",
                                                "batched_restacking_ms", "speedup"))


def test_assembler_layouts_bench_times_cold_and_warm_warm_ups_and_calls() -> None:
    records = run_bench("assembler_layouts", "--agents", "4", "--calls", "5", "--rounds", "1")
    assert [(r["cache"], r["layout_index"]) for r in records] == [(c, i) for c in ("cold", "warm") for i in range(4)]
    assert all(r["warm_up_s"] >= 0 and r["machine"] for r in records)
    assert all(r["us_per_call_1_agent"] > 0 and r["us_per_call_4_agents"] > 0 for r in records if r["cache"] == "warm")


def test_spread_steps_bench_times_the_native_port_and_mpe2() -> None:
    records = run_bench("spread_steps", "--envs", "8", "--seconds", "0.2")
    assert [r["side"] for r in records] == ["native numba", "mpe2 simple_spread_v3"]
    assert all(r["env_steps_per_s"] > 0 and r["machine"] for r in records)


def test_overhead_figures_add_up() -> None:
    from ops.bench.pipeline import overhead_figures

    figures = overhead_figures({"env_cpu_us_per_agent_step": 1.0, "cpu_us_per_agent_step_host": 0.5,
                                "cpu_us_per_agent_step_sink": 0.1, "cpu_us_per_agent_step_workers": 1.3})
    assert figures == {"workers_beyond_env_us_per_agent_step": 0.3, "overhead_us_per_agent_step": 0.9,
                       "predicted_pipeline_over_raw": round(1 / 1.9, 3), "host_max_agent_steps_per_s": 2_000_000}
