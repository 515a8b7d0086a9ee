"""The benchmarks in ops/bench run and print their figures (tiny windows; no figure is judged here: tests never
assert on speed), and leave no processes or shared memory behind."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.processes import alive, descendants, free_port_triple, wait_for

pytestmark = pytest.mark.integration

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


TINY_LEARNER_BATCH = ("--set", "trainer.batch_size=256", "--set", "trainer.minibatch_size=128", "--set",
                      "trainer.bptt_horizon=16", "--set", "trainer.update_epochs=1", "--set",
                      "trainer.forward_pass_minibatch_target_size=4")
"""16 rows of 16 steps in minibatches of 8 rows: two ranks hold 8 rows and draw 4 per minibatch."""


def test_learner_update_bench_times_one_and_two_ranks() -> None:
    records = run_bench("learner_update.py", "--ranks", "1", "--ranks", "2", "--updates", "1", "--no-compile",
                        *TINY_LEARNER_BATCH, timeout=120)
    assert [(r["ranks"], r["compile"]) for r in records] == [(1, False), (2, False)]
    for record in records:
        assert record["samples_per_s"] > 0 and record["rank_threads"] >= 1 and record["update_s_median"] > 0
        assert record["segments"] == 16 and record["rank_segments"] == 16 // record["ranks"]
    assert records[0]["rank_threads"] == os.cpu_count() and records[1]["rank_threads"] == max(1, os.cpu_count() // 2)
    assert not descendants(os.getpid())


def test_learner_update_bench_refuses_ranks_that_do_not_split_the_batch() -> None:
    done = subprocess.run([sys.executable, "ops/bench/learner_update.py", "--ranks", "3", "--no-compile",
                           *TINY_LEARNER_BATCH], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--ranks 3: segments (16) must be divisible by the learner ranks (3)" in done.stderr
    assert not done.stdout


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


@pytest.mark.slow
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
    assert coma["updates"] >= 1 and coma["update_s_median"] > 0
    assert plot.stat().st_size > 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not descendants(os.getpid())
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_coma_step_bench_times_a_gradient_step() -> None:
    (record,) = run_bench("coma_step.py", "--steps", "3", "--repeats", "2", "--warmup", "1",
                          "--set", "coma.hidden_sizes=[32, 32]", "--set", "coma.batch_size=16")
    assert record["bench"] == "coma_step" and record["batch_size"] == 16 and record["hidden_sizes"] == [32, 32]
    assert 0 < record["ms_per_step_best"] <= record["ms_per_step_median"] and record["fused_adam"] is True


def test_opponent_inference_bench_times_separate_and_batched_passes() -> None:
    records = run_bench("opponent_inference.py", "--snapshots", "3", "--rows", "2", "5", "--steps", "2",
                        "--repeats", "1")
    assert [(r["bench"], r["snapshots"], r["rows"]) for r in records] == [("opponent_inference", 3, 2),
                                                                         ("opponent_inference", 3, 5)]
    for record in records:
        assert all(record[key] > 0 for key in ("separate_ms", "batched_ms", "batched_subset_ms",
                                                "batched_restacking_ms", "speedup"))


def test_spread_steps_bench_times_the_native_port_and_mpe2() -> None:
    records = run_bench("spread_steps.py", "--envs", "8", "--seconds", "0.2")
    assert [r["side"] for r in records] == ["native numba", "mpe2 simple_spread_v3"]
    assert all(r["env_steps_per_s"] > 0 and r["machine"] for r in records)


GRID_SMOKE_SETTINGS = ("env.max_steps=32", "trainer.batch_size=4096", "trainer.minibatch_size=2048",
                       "trainer.bptt_horizon=16", "trainer.forward_pass_minibatch_target_size=64",
                       "trainer.num_workers=1")


def test_gridworld_seeds_bench_scores_one_seed_through_the_pipeline(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    table = tmp_path / "grid.md"
    records = run_bench("gridworld_seeds.py", "--config", "grid_3agents", "--seeds", "1", "--agent-steps", "8192",
                        "--seconds", "90", "--port", str(free_port_triple()), "--markdown", str(table),
                        *(arg for setting in GRID_SMOKE_SETTINGS for arg in ("--set", setting)), timeout=200)
    seed, overview = records
    assert seed["bench"] == "gridworld_seeds" and seed["config"] == "grid_3agents" and seed["seed"] == 1
    assert seed["learner_exit_code"] == 0 and seed["learner_error"] is None
    assert seed["agent_steps"] >= 8192 and seed["budget_reached"] and seed["updates"] >= 1 and seed["final_return_mean"] is not None
    assert seed["return_at"] == {}  # 1M is far past a tiny budget
    assert all(isinstance(seed[key], bool) for key in ("above_random_by_1m", "final_at_least_3x_random",
                                                       "no_long_phase_below_random", "passed"))
    assert isinstance(seed["episode_stats"], dict) and seed["machine"]
    assert set(seed["episode_stats"]) == {"items_collected", "items_converted"}  # via metrics.jsonl
    assert seed["episode_stats"]["items_collected"] >= seed["episode_stats"]["items_converted"] >= 0
    assert overview["bench"] == "gridworld_seeds_summary" and overview["seeds_total"] == 1
    assert overview["final_return_min"] == overview["final_return_max"] == seed["final_return_mean"]
    assert overview["random_return_mean"] == seed["random_return_mean"]
    random_stats = overview["random_episode_stats"]  # the random policy's named stats, from the env's own counters
    assert set(random_stats) == {"items_collected", "items_converted"}
    assert random_stats["items_collected"] >= random_stats["items_converted"] == overview["random_return_mean"]
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| policy | 1M | 2M | 4M | 8M | final |")
    assert lines[2].startswith("| random |") and lines[3].startswith("| seed 1 |")
    assert lines[2].rstrip(" |").endswith(f"{random_stats['items_collected']:g} | {random_stats['items_converted']:g}")
    assert not descendants(os.getpid())
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_gridworld_random_baseline_counts_whole_episodes_of_a_staggered_config() -> None:
    config = REPO / "configs" / "grid_3agents.yaml"
    assert "stagger_start" in config.read_text()  # the config staggers its envs' first episodes
    (record,) = run_bench("gridworld_random_baseline.py", "--config", str(config), "--episodes", "30", timeout=120)
    assert record["bench"] == "gridworld_random_baseline" and record["episodes"] >= 30
    assert record["episode_length_mean"] == 1000.0 and "stagger_start" not in record["env_kwargs"]


C4_SMOKE_SETTINGS = ("trainer.total_timesteps=12000", "trainer.batch_size=2048", "trainer.minibatch_size=1024",
                     "trainer.forward_pass_minibatch_target_size=32", "selfplay.snapshot_interval=1",
                     "selfplay.alternation_steps=40", "evaluation.interval_updates=1", "evaluation.games=10",
                     "model.hidden_size=32", "evaluation.gate_games=4")
"""A Connect Four run of a few updates that still evaluates snapshots and keeps a best one."""


@pytest.mark.slow
def test_connect4_strength_bench_trains_plays_the_best_and_rates_the_kept_best(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    table, kept = tmp_path / "c4.md", tmp_path / "runs"
    records = run_bench("connect4_strength.py", "--seeds", "1", "--seconds", "120", "--games", "20", "--elo-games",
                        "10", "--port", str(free_port_triple()), "--markdown", str(table), "--keep-runs", str(kept),
                        *(arg for setting in C4_SMOKE_SETTINGS for arg in ("--set", setting)), timeout=240)
    seed, overview = records
    assert seed["bench"] == "connect4_strength" and seed["seed"] == 1 and seed["learner_exit_code"] == 0
    assert seed["within_cap"] and seed["agent_steps"] >= 12000 and seed["best_update"] is not None
    assert set(seed["results"]) == {"one_ply", "negamax-4"}
    for result in seed["results"].values():
        assert result["wins"] + result["draws"] + result["losses"] == result["games"] == 20
        assert result["score"] == (result["wins"] + result["draws"] / 2) / 20
    assert seed["kept_best_elo"] and isinstance(seed["elo_never_falls"], bool)
    assert [p["update"] for p in seed["kept_best_elo"]] == sorted(p["update"] for p in seed["kept_best_elo"])
    assert seed["greedy"] is True and set(seed["results_other_mode"]) == {"one_ply", "negamax-4"}  # config: greedy
    assert seed["elo_largest_drop"] >= 0 and (seed["elo_largest_drop"] == 0) == seed["elo_never_falls"]
    curve, steps = seed["kept_best_elo"], seed["elo_steps"]
    assert [(s["from"], s["to"]) for s in steps] == [(a["update"], b["update"]) for a, b in zip(curve, curve[1:])]
    assert all(s["sd"] >= 0 and 0 <= s["p_fall"] <= 1 for s in steps)
    assert [s["change"] for s in steps] == [round(b["elo"] - a["elo"], 1) for a, b in zip(curve, curve[1:])]
    assert isinstance(seed["passed"], bool) and overview["bench"] == "connect4_strength_summary"
    assert overview["trials"] == 1 and len(overview["one_ply_win_rate"]) == 1
    assert (kept / "seed1" / "best" / "best.json").is_file() and (kept / "seed1" / "elo" / "elo.json").is_file()
    assert table.read_text().startswith("| seed | train s | agent steps | best update |")
    # a kept run scores again without training
    (again, _), = [run_bench("connect4_strength.py", "--runs", str(kept / "seed1"), "--games", "10", "--elo-games",
                             "4", "--game-seed", "5", "--markdown", str(tmp_path / "again.md"), timeout=120)]
    assert again["run_dir"] == str(kept / "seed1") and again["best_update"] == seed["best_update"]
    assert f"| {kept / 'seed1'} | - | - | {seed['best_update']} |" in (tmp_path / "again.md").read_text()
    assert (seed["game_seed"], again["game_seed"]) == (20261126, 5)  # other final games for the same kept best
    assert all(r["games"] == 10 for r in again["results"].values()) and "train_s" not in again
    assert not descendants(os.getpid())
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_a_bench_stopped_by_sigterm_leaves_no_process_or_shared_memory(tmp_path: Path) -> None:
    """pipeline_run cleans up on SIGTERM as on Ctrl-C: the learner, the actor host and their children go."""
    before = set(Path("/dev/shm").glob("sluice_*"))
    bench = subprocess.Popen([sys.executable, "ops/bench/connect4_strength.py", "--seeds", "1", "--seconds", "300",
                              "--port", str(free_port_triple()),
                              *(arg for setting in (*C4_SMOKE_SETTINGS, "trainer.total_timesteps=100000000")
                                for arg in ("--set", setting))],
                             cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)

    def logs() -> list[str]:
        return [log.read_text(errors="replace") for log in tmp_path.glob("sluice-bench-*/learner.log")]

    assert wait_for(lambda: any("upd " in text for text in logs()), timeout=120), logs()
    started = descendants(bench.pid)
    assert len(started) >= 3  # learner, actor host, its workers (and the evaluator)
    bench.send_signal(signal.SIGTERM)
    bench.wait(timeout=60)
    assert bench.returncode != 0 and "KeyboardInterrupt" in bench.stderr.read()
    assert not [pid for pid in started if alive(pid)]
    assert not list(tmp_path.glob("sluice-bench-*"))  # the temporary run directory is gone too
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


@pytest.fixture(scope="module")
def grid_criteria() -> ModuleType:
    """ops/bench/learning_criteria.py (ops/bench is a script folder, like ops/soak)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO / "ops" / "bench"))
        return importlib.import_module("learning_criteria")


def grid_curve(criteria: ModuleType, *points: tuple[float, float]) -> list:
    """A hand-made curve from (million agent steps, last-100 mean return) pairs."""
    return [criteria.CurvePoint(agent_steps=int(m * 1e6), return_mean=r) for m, r in points]


def test_grid_criteria_pass_a_curve_that_rises_early_and_stays_above(grid_criteria) -> None:
    curve = grid_curve(grid_criteria, (0.5, 1.0), (1.0, 1.5), (2.0, 1.2), (4.0, 3.0), (8.0, 4.5))
    result = grid_criteria.evaluate_curve(curve, random_return=1.32)
    assert result.first_above_agent_steps == 1_000_000 and result.final_return == 4.5
    assert result.above_random_by_1m and result.final_at_least_3x_random and result.no_long_phase_below_random
    assert result.passed
    # the dip at 2M (one record) is a phase of 2M agent steps to the next record above: exactly the limit
    assert result.longest_below_agent_steps == 2_000_000


def test_grid_criteria_fail_a_dip_below_random_longer_than_2m(grid_criteria) -> None:
    curve = grid_curve(grid_criteria, (0.5, 2.0), (1.0, 1.0), (2.0, 1.1), (3.1, 1.3), (3.2, 2.0), (8.0, 5.0))
    result = grid_criteria.evaluate_curve(curve, random_return=1.32)
    assert result.above_random_by_1m and result.final_at_least_3x_random
    assert result.longest_below_agent_steps == 2_200_000
    assert not result.no_long_phase_below_random and not result.passed


def test_grid_criteria_fail_a_run_that_ends_in_a_long_dip(grid_criteria) -> None:
    curve = grid_curve(grid_criteria, (0.5, 5.0), (1.0, 1.0), (3.5, 0.5))
    result = grid_criteria.evaluate_curve(curve, random_return=1.0)
    assert result.longest_below_agent_steps == 2_500_000 and not result.no_long_phase_below_random


def test_grid_criteria_fail_a_late_start_and_a_weak_finish(grid_criteria) -> None:
    late = grid_criteria.evaluate_curve(grid_curve(grid_criteria, (1.0, 1.0), (8.0, 0.8), (9.0, 9.0)),
                                        random_return=1.0)
    assert late.first_above_agent_steps == 9_000_000 and not late.above_random_by_1m
    assert late.final_at_least_3x_random and late.no_long_phase_below_random
    weak = grid_criteria.evaluate_curve(grid_curve(grid_criteria, (0.5, 2.0), (8.0, 2.9)), random_return=1.0)
    assert weak.above_random_by_1m and not weak.final_at_least_3x_random
    never = grid_criteria.evaluate_curve(grid_curve(grid_criteria, (0.5, 0.2), (8.0, 0.9)), random_return=1.0)
    assert never.first_above_agent_steps is None and never.longest_below_agent_steps == 0
    assert not never.above_random_by_1m and never.no_long_phase_below_random and not never.passed
    empty = grid_criteria.evaluate_curve([], random_return=1.0)
    assert empty.final_return is None and not empty.passed


def test_grid_criteria_read_3x_as_twice_randoms_magnitude_above_it(grid_criteria) -> None:
    beats = grid_criteria.beats_by_multiple
    assert beats(3.0, 1.0) and not beats(2.99, 1.0)
    assert beats(0.1, 0.0) and not beats(0.0, 0.0)  # zero random: strictly better is needed
    assert beats(10.0, -10.0) and not beats(9.9, -10.0)  # negative random: improve by 2 |random|


def test_grid_criteria_read_a_synthetic_metrics_list(grid_criteria) -> None:
    records = [
        {"update": 1, "agent_steps": 65536, "episode_return_mean": None, "episode_length_mean": None},
        {"update": 2, "agent_steps": 131072, "episode_return_mean": 2.0, "episode_length_mean": 1000.0,
         "episode_items_collected_mean": 3.0, "episode_items_converted_mean": None},
        {"update": 3, "agent_steps": 1_048_576, "episode_return_mean": 3.5, "episode_length_mean": 1000.0,
         "episode_items_collected_mean": 5.0, "episode_items_converted_mean": 3.5},
    ]
    curve = grid_criteria.curve_from_records(records)
    assert [(p.agent_steps, p.return_mean) for p in curve] == [(131072, 2.0), (1_048_576, 3.5)]
    assert grid_criteria.return_at_marks(curve, [100_000, 1_000_000, 2_000_000]) == {100_000: 2.0, 1_000_000: 3.5}
    assert grid_criteria.last_episode_stats(records) == {"items_collected": 5.0, "items_converted": 3.5}
    result = grid_criteria.evaluate_curve(curve, random_return=1.0)
    assert result.passed and result.first_above_agent_steps == 131072


def reference_criteria(steps: np.ndarray, returns: np.ndarray, random_return: float) -> tuple:
    """The three criteria by whole-array NumPy: first above, longest phase below after it, and the booleans."""
    above = returns > random_return
    if not above.any():
        return None, 0, False, bool(returns[-1] - random_return >= 2 * abs(random_return)
                                    and returns[-1] > random_return), True
    first = int(np.argmax(above))
    tail_steps, tail_above = steps[first:], above[first:]
    starts = np.flatnonzero(~tail_above & np.concatenate([[True], tail_above[:-1]]))
    next_above = [np.flatnonzero(tail_above[start:]) for start in starts]
    ends = [tail_steps[start + later[0]] if later.size else tail_steps[-1] for start, later in zip(starts, next_above)]
    longest = int(max((end - tail_steps[start] for start, end in zip(starts, ends)), default=0))
    final_ok = bool(returns[-1] - random_return >= 2 * abs(random_return) and returns[-1] > random_return)
    return int(steps[first]), longest, bool(steps[first] <= 1_000_000), final_ok, longest <= 2_000_000


@given(gaps=st.lists(st.integers(1, 1_500_000), min_size=1, max_size=40),
       returns=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0, 6.0]), min_size=40, max_size=40),
       random_return=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]))
def test_grid_criteria_match_a_numpy_reference(grid_criteria, gaps, returns, random_return) -> None:
    steps = np.cumsum(gaps)
    values = np.asarray(returns[:len(steps)])
    curve = [grid_criteria.CurvePoint(agent_steps=int(s), return_mean=float(r)) for s, r in zip(steps, values)]
    result = grid_criteria.evaluate_curve(curve, random_return=random_return)
    got = (result.first_above_agent_steps, result.longest_below_agent_steps, result.above_random_by_1m,
           result.final_at_least_3x_random, result.no_long_phase_below_random)
    assert got == reference_criteria(steps, values, random_return)
