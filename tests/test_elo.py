"""The arena (evaluation/arena.py: batched matches, seats alternating) and the Elo tool (python -m evaluation.elo, also as python -m evaluation.elo)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.registry import env_spec
from configs.loader import load_config
from configs.schema import RunConfig
from evaluation import elo
from evaluation.arena import MatchOutcome, NegamaxPlayer, OnePlyPlayer, PolicyPlayer, RandomPlayer, play_match
from learner.pool.store import SnapshotStore
from learner.run.run_dir import new_run_dir
from policies.factory import make_policy, state_arrays

C4_SETTINGS = ["env.name=connect_four", "env.num_agents=2", "env.max_steps=0", "model.hidden_size=16",
               "model.num_layers=1"]


def c4_config(*extra: str) -> RunConfig:
    return load_config(None, [*C4_SETTINGS, *extra])


class ColumnPlayer:
    """Always the given column while it is legal (else the first legal one); counts its empty-board moves."""

    def __init__(self, name: str, column: int) -> None:
        self.name, self.column, self.first_moves, self.rows = name, column, 0, 0

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        self.first_moves += int((obs.reshape(len(obs), -1) == 0).all(axis=1).sum())
        self.rows += len(obs)
        fallback = (masks != 0).argmax(axis=1)
        return np.where(masks[:, self.column] != 0, self.column, fallback).astype(np.int32)


# --- the arena ---------------------------------------------------------------------------------------------


def test_one_ply_beats_random():
    outcome = play_match(OnePlyPlayer(), RandomPlayer(), episodes=200, env_config=c4_config().env, seed=1)
    assert outcome.games == 200 and outcome.a_first == 100
    assert outcome.wins_a > 170, outcome
    reverse = play_match(RandomPlayer(), OnePlyPlayer(), episodes=200, env_config=c4_config().env, seed=1)
    assert reverse.wins_b > 170, reverse


def test_negamax_beats_one_ply_and_deeper_beats_shallower():
    env = c4_config().env
    versus_one_ply = play_match(NegamaxPlayer("negamax-2", depth=2), OnePlyPlayer(), episodes=200, env_config=env,
                                seed=2)
    assert versus_one_ply.score_a > 0.5, versus_one_ply  # same tactics, plus it never lets a win-now through
    deeper = play_match(NegamaxPlayer("negamax-4", depth=4), NegamaxPlayer("negamax-2", depth=2), episodes=100,
                        env_config=env, seed=2)
    assert deeper.score_a > 0.6, deeper
    with pytest.raises(ValueError, match="negamax depth must be an integer >= 1"):
        NegamaxPlayer("n", depth=0)


def test_random_vs_random_is_even_with_seats_alternating():
    outcome = play_match(RandomPlayer("r1"), RandomPlayer("r2"), episodes=1000, env_config=c4_config().env, seed=3)
    assert outcome.games == 1000 and outcome.a_first == 500
    assert abs(outcome.wins_a - outcome.wins_b) < 130, outcome  # ~4 standard deviations


def test_a_player_against_itself_is_symmetric():
    player = OnePlyPlayer()
    outcome = play_match(player, player, episodes=600, env_config=c4_config().env, seed=5)
    assert outcome.games == 600 and outcome.a_first == 300
    assert abs(outcome.wins_a - outcome.wins_b) < 110, outcome
    assert abs(outcome.score_a - 0.5) < 0.1


@pytest.mark.parametrize("episodes, num_envs", [(7, None), (7, 3), (300, None), (40, 8)])
def test_seats_alternate(episodes, num_envs):
    """Whoever moves first stacks four in its column first and wins; so a wins exactly the games it opens."""
    a, b = ColumnPlayer("a", 0), ColumnPlayer("b", 1)
    outcome = play_match(a, b, episodes=episodes, env_config=c4_config().env, seed=0, num_envs=num_envs)
    first = (episodes + 1) // 2
    assert outcome == MatchOutcome(wins_a=first, draws=0, wins_b=episodes - first, a_first=first)
    assert (a.first_moves, b.first_moves) == (first, episodes - first)
    assert a.rows == 4 * first + 3 * (episodes - first)  # a player is only asked for its own counted moves


def test_draws_by_time_limit_and_argument_errors():
    env = c4_config("env.max_steps=4").env  # no game can end within 4 moves: all truncated, counted as draws
    assert play_match(RandomPlayer(), OnePlyPlayer(), episodes=10, env_config=env, seed=0).draws == 10
    with pytest.raises(ValueError, match="episodes must be an integer >= 1"):
        play_match(RandomPlayer(), RandomPlayer(), episodes=0, env_config=env)
    with pytest.raises(ValueError, match="num_envs must be in"):
        play_match(RandomPlayer(), RandomPlayer(), episodes=5, env_config=env, num_envs=6)


def test_policy_player_samples_or_takes_argmax():
    config = c4_config()
    spec = env_spec(config.env)
    torch.manual_seed(0)
    arrays = state_arrays(make_policy(spec, config.model))
    obs = np.zeros((64, 2, 6, 7), dtype=np.uint8)
    masks = np.ones((64, 7), dtype=np.uint8)
    masks[:, 3] = 0
    sampled = PolicyPlayer("p", spec, config.model, arrays, seed=1).act(obs, masks)
    greedy = PolicyPlayer("g", spec, config.model, arrays, greedy=True).act(obs, masks)
    assert sampled.dtype == greedy.dtype == np.int32
    assert not (sampled == 3).any() and not (greedy == 3).any()
    assert len(set(greedy.tolist())) == 1 and len(set(sampled.tolist())) > 1  # same obs: argmax is constant
    lstm = load_config(None, [*C4_SETTINGS, "model.core=lstm"]).model
    with pytest.raises(ValueError, match="feed-forward policies only"):
        PolicyPlayer("l", spec, lstm, state_arrays(make_policy(spec, lstm)))


# --- the Elo tool ------------------------------------------------------------------------------------------


def make_run(run_dir: Path, snapshots: int, *overrides: str) -> Path:
    """A fake run: resolved config.yaml and a pool of random-init policies of a small MLP."""
    config = load_config(None, [*C4_SETTINGS, *overrides])
    new_run_dir(config, run_dir)
    if snapshots:
        store = SnapshotStore(run_dir / "pool")
        spec = env_spec(config.env)
        for k in range(snapshots):
            torch.manual_seed(k)
            store.add(state_arrays(make_policy(spec, config.model)), update=10 * k, policy_version=10 * k + 1)
    return run_dir


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("elo") / "run", 3)


def test_cli_end_to_end(fake_run, tmp_path, capsys):
    out = tmp_path / "out"
    code = elo.main(["--run-dir", str(fake_run), "--episodes", "60", "--window-size", "1", "--output-heatmap",
                     "--output-dir", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert {p.name for p in out.iterdir()} == {"elo.json", "elo.csv", "elo_over_snapshots.png",
                                                "win_rate_heatmap.png"}
    for png in ("elo_over_snapshots.png", "win_rate_heatmap.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "elo.json").read_text())
    ratings = doc["ratings"]
    assert ratings["random"] == 1000.0 and doc["anchor"] == {"player": "random", "rating": 1000.0}
    assert ratings["one_ply"] > ratings["random"] + 200
    assert ratings["negamax-4"] > ratings["one_ply"] and doc["baselines"] == list(elo.DEFAULT_BASELINES)
    assert [(s["name"], s["index"], s["update"], s["policy_version"]) for s in doc["snapshots"]] == [
        ("s0-u0", 0, 0, 1), ("s1-u10", 1, 10, 11), ("s2-u20", 2, 20, 21)]
    # sequential, window 1: 2 neighbour pairings + 3 x 4 baseline pairings + the 3 links of the baseline chain
    assert len(doc["pairings"]) == 17
    assert [(p["a"], p["b"]) for p in doc["pairings"][-3:]] == [
        ("random", "one_ply"), ("one_ply", "negamax-2"), ("negamax-2", "negamax-4")]
    assert all(p["wins_a"] + p["draws"] + p["wins_b"] == 60 and p["a_first"] == 30 for p in doc["pairings"])
    assert doc["settings"]["tournament_mode"] == "sequential" and doc["settings"]["episodes"] == 60
    csv_lines = (out / "elo.csv").read_text().splitlines()
    assert csv_lines[0].startswith("rank,player,elo") and csv_lines[1].split(",")[1].startswith("negamax-")
    assert "kept 3 (pool indices 0, 1, 2)" in captured.out and "one_ply" in captured.out
    assert "pairing 17/17" in captured.err


def test_cli_round_robin_thinning_and_default_output_dir(tmp_path, capsys):
    run_dir = make_run(tmp_path / "run", 5)
    assert elo.main(["--run-dir", str(run_dir), "--tournament-mode", "round-robin", "--episodes", "10",
                     "--max-snapshots", "3", "--greedy", "--baselines", "one_ply, random"]) == 0
    doc = json.loads((run_dir / "elo" / "elo.json").read_text())
    assert [s["index"] for s in doc["snapshots"]] == [0, 2, 4]
    assert len(doc["pairings"]) == 10  # 5 players, all pairs
    assert doc["baselines"] == ["random", "one_ply"] and doc["settings"]["baselines"] == "random,one_ply"
    assert not (run_dir / "elo" / "win_rate_heatmap.png").exists()
    assert "kept 3 (pool indices 0, 2, 4)" in capsys.readouterr().out


def test_kept_best_rates_the_snapshots_that_became_the_best(tmp_path, capsys):
    run_dir = make_run(tmp_path / "run", 5)
    store = SnapshotStore(run_dir / "pool")
    best_after = {0: 0, 1: 10, 2: 10, 3: 30, 4: 30}  # snapshots 1 and 3 became the best; 2 and 4 did not
    lines = [json.dumps({"update": 10 * k, "hash": store.snapshot(k).hash, "best_update": best_after[k]})
             for k in range(5)]
    (run_dir / "evaluation.jsonl").write_text("\n".join([*lines, "{torn"]) + "\n")
    assert elo.main(["--run-dir", str(run_dir), "--kept-best", "--episodes", "10", "--baselines", "random"]) == 0
    doc = json.loads((run_dir / "elo" / "elo.json").read_text())
    assert [s["index"] for s in doc["snapshots"]] == [0, 1, 3] and doc["settings"]["kept_best"] is True
    assert "kept 3 (pool indices 0, 1, 3)" in capsys.readouterr().out
    (run_dir / "evaluation.jsonl").unlink()
    assert elo.main(["--run-dir", str(run_dir), "--kept-best"]) == 2
    err = capsys.readouterr().err
    assert "--kept-best: cannot read" in err and "evaluation.interval_updates > 0" in err
    (run_dir / "evaluation.jsonl").write_text(json.dumps({"update": 5, "hash": "0" * 64, "best_update": 5}) + "\n")
    assert elo.main(["--run-dir", str(run_dir), "--kept-best"]) == 2
    assert "names no best snapshot that is in the pool" in capsys.readouterr().err


def test_pairings_and_thinning():
    names = ["s0", "s1", "s2", "s3"]
    seq = elo.pairings(names, "sequential", 2)
    assert seq[:5] == [("s1", "s0"), ("s2", "s1"), ("s2", "s0"), ("s3", "s2"), ("s3", "s1")]
    assert len(seq) == 5 + 4 * 4 + 3
    assert seq[5:9] == [("s0", "random"), ("s0", "one_ply"), ("s0", "negamax-2"), ("s0", "negamax-4")]
    assert seq[-3:] == [("random", "one_ply"), ("one_ply", "negamax-2"), ("negamax-2", "negamax-4")]
    assert len(elo.pairings(names, "round-robin", 2)) == 28  # 8 players
    two = elo.pairings(names, "sequential", 2, ("random", "one_ply"))
    assert len(two) == 5 + 8 + 1 and two[-1] == ("random", "one_ply")
    assert len(elo.pairings(names, "round-robin", 2, ("random", "one_ply"))) == 15
    assert elo.pairings(names, "sequential", 2, ("random",))[-1] == ("s3", "random")  # a chain of one: no link
    assert elo.thin_indices(4, 30) == [0, 1, 2, 3]
    assert elo.thin_indices(100, 5) == [0, 25, 50, 74, 99]
    assert elo.thin_indices(9, 1) == [8]
    assert elo.pairing_seed(0, "a", "b") == elo.pairing_seed(0, "a", "b") != elo.pairing_seed(0, "b", "a")


def test_baselines_parsing():
    assert elo.parse_baselines(",".join(elo.DEFAULT_BASELINES)) == elo.DEFAULT_BASELINES
    assert elo.parse_baselines(" negamax-10 , random,negamax-1,one_ply") == (
        "random", "one_ply", "negamax-1", "negamax-10")  # weakest first, whatever the order given
    assert elo.parse_baselines("random") == ("random",)
    assert elo.parse_baselines("pkg.b:Make,random,pkg.a:make,one_ply") == (
        "random", "one_ply", "pkg.b:Make", "pkg.a:make")  # entry points after the fixed ones, in the order given
    assert elo.default_baselines("connect_four") == elo.DEFAULT_BASELINES
    assert elo.default_baselines("pettingzoo_aec") == ("random",)
    assert isinstance(elo.baseline_player("negamax-3", seed=0), NegamaxPlayer)
    assert elo.baseline_player("negamax-3", seed=0).depth == 3
    assert isinstance(elo.baseline_player("one_ply", seed=0), OnePlyPlayer)
    assert isinstance(elo.baseline_player("random", seed=0), RandomPlayer)


@pytest.mark.parametrize("text, message", [
    ("random,two_ply", r"--baselines: unknown baseline 'two_ply'; allowed: random, one_ply, negamax-<depth> "
                       r"\(depth an integer >= 1; one_ply and negamax connect_four only\) or an entry point"),
    ("random,negamax-0", "unknown baseline 'negamax-0'; allowed: "),
    ("random,negamax-02", "unknown baseline 'negamax-02'; allowed: "),
    ("random,negamax-x", "unknown baseline 'negamax-x'; allowed: "),
    ("random,negamax", "unknown baseline 'negamax'; allowed: "),
    ("one_ply,negamax-2", r"--baselines must include 'random' \(the anchor, rated 1000\)"),
    ("", "--baselines must include 'random'"),
    ("random,one_ply,random", "--baselines names a baseline twice"),
])
def test_baselines_errors(text, message, fake_run, capsys):
    with pytest.raises(elo.EloError, match=message):
        elo.parse_baselines(text)
    assert elo.main(["--run-dir", str(fake_run), "--baselines", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m evaluation.elo: error: --baselines") and len(err.strip().splitlines()) == 1


def _empty_pool(run: Path) -> None:
    (run / "pool").mkdir()
    (run / "pool" / "index.json").write_text(json.dumps({"format": 1, "snapshots": []}))


@pytest.mark.parametrize("setup, extra, message", [
    ("missing", [], "run directory .* does not exist"),
    ("no_config", [], r"config.yaml does not exist \(is .* a run directory\?\)"),
    ("no_pool", [], "no snapshot pool in .*index.json does not exist"),
    ("empty_pool", [], "the snapshot pool .* is empty"),
    ("cartpole", [], "env.name 'cartpole' .* not a two-player turn-based env .*; allowed: 'connect_four'"),
    ("ok", ["--window-size", "0"], "--window-size must be >= 1, got 0"),
    ("ok", ["--episodes", "-3"], "--episodes must be >= 1, got -3"),
    ("ok", ["--max-snapshots", "0"], "--max-snapshots must be >= 1, got 0"),
])
def test_cli_errors(setup, extra, message, fake_run, tmp_path, capsys):
    run = tmp_path / "run"
    if setup == "ok":
        run = fake_run
    elif setup == "no_config":
        run.mkdir()
    elif setup in ("no_pool", "empty_pool"):
        make_run(run, 0)
        if setup == "empty_pool":
            _empty_pool(run)
    elif setup == "cartpole":
        new_run_dir(load_config(None, []), run)
        _empty_pool(run)
    assert elo.main(["--run-dir", str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m evaluation.elo: error: ")
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_cli_bad_mode_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        elo.main(["--run-dir", "x", "--tournament-mode", "swiss"])
    assert exc.value.code == 2
    assert "python -m evaluation.elo: error: argument --tournament-mode" in capsys.readouterr().err


@pytest.mark.integration
def test_the_elo_command_names_itself_in_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "evaluation.elo", "--run-dir", str(tmp_path / "missing")],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("python -m evaluation.elo: error: run directory"), done.stderr
