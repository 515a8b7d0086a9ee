"""The learning experiments in ops/experiments run end to end at toy sizes and print their records (no result is
judged here: a few thousand agent steps learn nothing), and leave no processes or shared memory behind. Their pure
scoring (learning_criteria): tests/test_learning_criteria.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import alive, descendants, free_port_triple, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def run_experiment(module: str, *args: str, timeout: float = 240) -> list[dict]:
    """``python -m ops.experiments.<module> args`` from the repository root; its JSON records."""
    done = subprocess.run([sys.executable, "-m", f"ops.experiments.{module}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_coma_spread_bench_scores_random_scripted_and_coma_team_returns() -> None:
    records = run_experiment("coma_spread", "--mode", "serial", "--seeds", "1", "--seconds", "1", "--episodes", "8",
                        "--envs", "4", "--set", "coma.rollout_length=128", "--set", "coma.hidden_sizes=[16, 16]")
    policies = {r["policy"]: r for r in records}
    assert set(policies) == {"random", "scripted", "coma"}
    assert all(r["episodes"] == 8 and r["team_return_mean"] < 0 for r in records)
    assert policies["scripted"]["team_return_mean"] > policies["random"]["team_return_mean"]
    assert policies["coma"]["transitions"] >= 128


@pytest.mark.slow
def test_coma_spread_pipeline_bench_scores_the_checkpoint_and_plots_the_curve(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    children_before = descendants(os.getpid())  # e.g. multiprocessing's resource tracker from earlier tests
    plot = tmp_path / "coma.png"
    records = run_experiment("coma_spread", "--seeds", "1", "--seconds", "12", "--episodes", "4",
                        "--port", str(free_port_triple()), "--plot", str(plot), "--set", "coma.epochs=1",
                        timeout=150)
    policies = {r["policy"]: r for r in records}
    assert set(policies) == {"random", "scripted", "coma"}
    coma = policies["coma"]
    assert coma["mode"] == "pipeline" and coma["evaluate_error"] is None and coma["learner_exit_code"] in (0, 130)
    assert coma["episodes"] == 4 and coma["team_return_mean"] < 0 and coma["agent_steps"] > 0
    assert coma["updates"] >= 1 and coma["update_s_median"] > 0
    assert plot.stat().st_size > 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert descendants(os.getpid()) <= children_before
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


GRID_SMOKE_SETTINGS = ("env.max_steps=32", "trainer.batch_size=4096", "trainer.minibatch_size=2048",
                       "trainer.bptt_horizon=16", "trainer.forward_pass_minibatch_target_size=64",
                       "trainer.num_workers=1")


def test_gridworld_seeds_bench_scores_one_seed_through_the_pipeline(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    children_before = descendants(os.getpid())  # e.g. multiprocessing's resource tracker from earlier tests
    table = tmp_path / "grid.md"
    records = run_experiment("gridworld_seeds", "--config", "grid_3agents", "--seeds", "1", "--agent-steps", "8192",
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
    assert descendants(os.getpid()) <= children_before
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_gridworld_random_baseline_counts_whole_episodes_of_a_staggered_config() -> None:
    config = REPO / "configs" / "grid_3agents.yaml"
    assert "stagger_start" in config.read_text()  # the config staggers its envs' first episodes
    (record,) = run_experiment("gridworld_random_baseline", "--config", str(config), "--episodes", "30", timeout=120)
    assert record["bench"] == "gridworld_random_baseline" and record["episodes"] >= 30
    assert record["episode_length_mean"] == 1000.0 and "stagger_start" not in record["env_kwargs"]


@pytest.mark.slow
def test_token_cue_trains_both_encoders_through_the_pipeline_and_the_token_one_learns() -> None:
    """The one learning claim of docs/ENVIRONMENTS.md's token section: the token encoder
    on the declared layout is far above chance (8 of 32), the flat MLP over the same rows is not (at 60% of the
    documented budget)."""
    records = run_experiment("token_cue", "--seeds", "1", "--agent-steps", "120000", "--port",
                             str(free_port_triple()), timeout=300)
    scores = {r["encoder"]: r for r in records}
    assert set(scores) == {"tokens", "mlp"} and all(r["learner_exit_code"] == 0 for r in records)
    assert scores["tokens"]["return_mean"] > 20 > 12 > scores["mlp"]["return_mean"]


def test_minigrid_doorkey_trains_through_the_pipeline_and_scores_random() -> None:
    records = run_experiment("minigrid_doorkey", "--seconds", "14", "--random-episodes", "2", "--eval-episodes", "2",
                             "--port",
                             str(free_port_triple()), "--set", "trainer.batch_size=2048", "--set",
                             "trainer.minibatch_size=1024", "--set", "trainer.bptt_horizon=32", timeout=200)
    random_policy, seed = records
    assert random_policy["policy"] == "random" and 0 <= random_policy["return_mean"] < 0.5
    assert seed["seed"] == 1 and seed["target"] == 0.9 and seed["learner_exit_code"] == 130  # stopped at --seconds
    assert seed["reached"] is False and seed["agent_steps"] > 0  # it trained (the metrics' last update)
    # a curve point needs an episode that ended (up to 640 steps): in 14 s a slow machine may have none yet
    assert all(point["agent_steps"] <= seed["agent_steps"] for point in seed["curve"])
    assert seed["eval_episodes"] == 2 and 0 <= seed["eval_return_mean"] < 1 and seed["eval_length_mean"] > 0


@pytest.mark.slow
def test_aec_selfplay_trains_tictactoe_and_plays_minimax_and_random_in_both_modes() -> None:
    records = run_experiment("aec_selfplay", "--game", "tictactoe", "--agent-steps", "8000", "--seconds", "120", "--games", "10",
                             "--port", str(free_port_triple()), "--set", "trainer.batch_size=2048",
                             "--set", "trainer.minibatch_size=1024", timeout=300)
    training, *games = records
    assert training["learner_exit_code"] == 0 and training["agent_steps"] >= 8000
    assert training["game"] == "tictactoe" and isinstance(training["curve"], list)
    assert {(g["opponent"], g["mode"]) for g in games} == {
        (opponent, mode) for opponent in ("examples.tictactoe_players:MinimaxPlayer", "random")
        for mode in ("greedy", "sampled")}
    for game in games:
        assert game["games"] == game["wins"] + game["draws"] + game["losses"] == 10
        assert sum(sum(seat.values()) for seat in game["per_seat"].values()) == 10 and isinstance(game["passed"], bool)
    assert all(g["wins"] == 0 for g in games if g["opponent"].endswith("MinimaxPlayer"))  # it is perfect


C4_SMOKE_SETTINGS = ("trainer.total_timesteps=12000", "trainer.batch_size=2048", "trainer.minibatch_size=1024",
                     "trainer.forward_pass_minibatch_target_size=32", "selfplay.snapshot_interval=1",
                     "selfplay.alternation_steps=40", "evaluation.interval_updates=1", "evaluation.games=10",
                     "model.hidden_size=32", "evaluation.gate_games=4")
"""A Connect Four run of a few updates that still evaluates snapshots and keeps a best one."""


@pytest.mark.slow
def test_connect4_strength_bench_trains_plays_the_best_and_rates_the_kept_best(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").glob("sluice_*"))
    children_before = descendants(os.getpid())  # e.g. multiprocessing's resource tracker from earlier tests
    table, kept = tmp_path / "c4.md", tmp_path / "runs"
    records = run_experiment("connect4_strength", "--seeds", "1", "--seconds", "120", "--games", "20", "--elo-games",
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
    (again, _), = [run_experiment("connect4_strength", "--runs", str(kept / "seed1"), "--games", "10", "--elo-games",
                             "4", "--game-seed", "5", "--markdown", str(tmp_path / "again.md"), timeout=120)]
    assert again["run_dir"] == str(kept / "seed1") and again["best_update"] == seed["best_update"]
    assert f"| {kept / 'seed1'} | - | - | {seed['best_update']} |" in (tmp_path / "again.md").read_text()
    assert (seed["game_seed"], again["game_seed"]) == (20261126, 5)  # other final games for the same kept best
    assert all(r["games"] == 10 for r in again["results"].values()) and "train_s" not in again
    assert descendants(os.getpid()) <= children_before
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


def test_an_experiment_stopped_by_sigterm_leaves_no_process_or_shared_memory(tmp_path: Path) -> None:
    """pipeline_run cleans up on SIGTERM as on Ctrl-C: the learner, the actor host and their children go."""
    before = set(Path("/dev/shm").glob("sluice_*"))
    bench = subprocess.Popen([sys.executable, "-m", "ops.experiments.connect4_strength", "--seeds", "1",
                              "--seconds", "300", "--port", str(free_port_triple()),
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
    assert bench.returncode == 143 and "connect4_strength: stopped by SIGTERM" in bench.stderr.read()
    assert not [pid for pid in started if alive(pid)]
    assert not list(tmp_path.glob("sluice-bench-*"))  # the temporary run directory is gone too
    assert set(Path("/dev/shm").glob("sluice_*")) <= before
