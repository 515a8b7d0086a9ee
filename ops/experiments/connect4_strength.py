"""Benchmark: how strong is the Connect Four agent that the README's self-play command trains? Issue 16's check.

For each seed, the README command (``python -m learner --config selfplay_connect4`` and one actor host with the
config's workers; ``pipeline_run.trained_run``) trains to the config's trainer.total_timesteps, stopped with SIGINT
if it runs past ``--seconds`` (the issue's limit: 30 minutes). Then, on the run directory:

* the snapshot that evaluation during training kept as the best (``<run-dir>/best/``) plays ``--games`` games
  (seats alternating; new game seeds, not the ones evaluation during training used) against each of
  ``--opponents`` (default one_ply and negamax-4), once sampling its moves and once greedy;
  its win rate and score (wins + draws / 2) per opponent are reported, with the issue's thresholds:
  win rate >= 0.8 against one_ply, score > 0.5 against negamax-4;
* ``python -m evaluation.elo --kept-best --tournament-mode round-robin`` rates every snapshot that was the kept
  best (when it became the best) against each other and the baselines; the kept best's ELO curve must never fall
  (each newer best rated at least as high as the one before). Each step of the curve is reported with its
  bootstrap standard deviation and the share of resampled tournaments in which it falls (``elo_steps``).

The verdicts are judged on the play mode the run's config evaluates with (evaluation.greedy; the shipped config:
true, greedy); the other mode's results are reported beside them. ``--game-seed`` picks other final games (the
same kept best against another 400 games: how much of a verdict is the games drawn). Prints one JSON line per
seed and a summary line; ``--markdown FILE`` writes the table for the README; ``--keep-runs DIR`` copies each
seed's run directory (pool, best/, evaluation.jsonl, metrics.jsonl, elo/) to ``DIR/seed<N>`` before the temporary
one is removed; ``--runs DIR ...`` scores such finished run directories again without training.

Usage: .venv/bin/python -m ops.experiments.connect4_strength [--seeds 1 2 3] [--seconds 1800] [--games 400]
       [--opponents one_ply negamax-4] [--elo-games 200] [--port 6500] [--set SECTION.KEY=VALUE ...]
       [--keep-runs DIR] [--markdown FILE] [--game-seed N]
       .venv/bin/python -m ops.experiments.connect4_strength --runs DIR/seed1 DIR/seed2 ... [--markdown FILE]
       [--game-seed N]
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from configs.loader import load_config, resolve_config_path
from envs.registry import env_spec
from evaluation import elo
from evaluation.arena import PolicyPlayer, baseline_player, play_match
from evaluation.best_snapshot import BEST_DIR, read_best
from evaluation.ratings import bootstrap_ratings
from ops.benchlib import emit, machine, run_stoppable
from ops.experiments.pipeline_run import trained_run

CONFIG = "selfplay_connect4"
WIN_RATE_VS_ONE_PLY = 0.8
"""The issue's bar: the best snapshot wins at least this share of its games against one_ply."""
SCORE_VS_NEGAMAX_4 = 0.5
"""The issue's bar: the best snapshot scores (wins + draws / 2) above this against negamax-4."""
GAME_SEED = 20261126
"""Seed of the final games (evaluation during training uses others)."""
BOOTSTRAP_SAMPLES = 200
"""Resampled tournaments behind each kept-best step's spread."""


def play_best(run_dir: Path, *, opponents: Sequence[str], games: int, greedy: bool,
              game_seed: int) -> dict[str, Any]:
    """The kept best snapshot's results against each opponent (``games`` games each, seats alternating, drawn from
    ``game_seed``), sampling its moves or (``greedy``) taking the most probable legal one."""
    best = read_best(run_dir)
    if best is None:
        return {}
    config = elo.load_run_config(run_dir)
    arrays = load_file(str(run_dir / BEST_DIR / best["weights"]))
    player = PolicyPlayer("best", env_spec(config.env), config.model, arrays, greedy=greedy, seed=game_seed,
                          version=best["policy_version"])
    results = {}
    for name in opponents:
        outcome = play_match(player, baseline_player(name, seed=game_seed), episodes=games, env_config=config.env,
                             seed=elo.pairing_seed(game_seed, "best", name))
        results[name] = {"wins": outcome.wins_a, "draws": outcome.draws, "losses": outcome.wins_b, "games": games,
                         "win_rate": round(outcome.wins_a / games, 4),
                         "score": round((outcome.wins_a + outcome.draws / 2) / games, 4)}
    return results


def kept_best_elo(run_dir: Path, *, games: int) -> dict[str, Any]:
    """Ratings of the snapshots that became the kept best, oldest first, whether the curve never falls, its largest
    drop from one kept best to the next (0 when it never falls), and for each step the bootstrap spread of the
    change (``evaluation.ratings.bootstrap_ratings``: how much of a step the tournament's games drawn decide)."""
    args = elo.build_parser().parse_args(["--run-dir", str(run_dir), "--kept-best", "--tournament-mode",
                                          "round-robin", "--episodes", str(games)])
    try:
        doc = elo.run(args)
    except elo.EloError as err:
        return {"kept_best_elo": [], "elo_never_falls": False, "elo_error": str(err)}
    curve = [{"update": s["update"], "elo": round(s["elo"], 1)} for s in doc["snapshots"]]
    ratings = [point["elo"] for point in curve]
    drops = [a - b for a, b in zip(ratings, ratings[1:])]
    return {"kept_best_elo": curve, "baseline_elo": {name: round(doc["ratings"][name], 1) for name in doc["baselines"]},
            "elo_never_falls": all(drop <= 0 for drop in drops), "elo_largest_drop": round(max([0.0, *drops]), 1),
            "elo_steps": elo_step_spread(doc)}


def elo_step_spread(doc: dict[str, Any], samples: int = BOOTSTRAP_SAMPLES) -> list[dict[str, Any]]:
    """Each step of the kept-best curve (an elo.json document): the change, its bootstrap standard deviation and
    the share of resampled tournaments in which it is a fall."""
    players = doc["players"]
    wins = np.array([[0 if x is None else x for x in row] for row in doc["wins"]], dtype=np.float64)
    draws = np.array([[0 if x is None else x for x in row] for row in doc["draws"]], dtype=np.float64)
    resampled = bootstrap_ratings(players, wins, draws, anchor=doc["anchor"]["player"], samples=samples)
    columns = [players.index(s["name"]) for s in doc["snapshots"]]
    steps = []
    for (i, a), (j, b) in zip(zip(columns, doc["snapshots"]), zip(columns[1:], doc["snapshots"][1:])):
        change = resampled[:, j] - resampled[:, i]
        steps.append({"from": a["update"], "to": b["update"], "change": round(b["elo"] - a["elo"], 1),
                      "sd": round(float(change.std()), 1), "p_fall": round(float((change < 0).mean()), 3)})
    return steps


def score(run_dir: Path, *, opponents: Sequence[str], games: int, elo_games: int,
          game_seed: int) -> dict[str, Any]:
    """Everything the check measures on a finished run directory, and the issue's verdicts (judged on the play
    mode the run's config evaluates with, evaluation.greedy; the other mode is reported beside it)."""
    best = read_best(run_dir)
    if best is None:
        return {"best_update": None, "results": {}, "passed": False}
    greedy = elo.load_run_config(run_dir).evaluation.greedy
    record = {"best_update": best["update"], "greedy": greedy, "game_seed": game_seed,
              "results": play_best(run_dir, opponents=opponents, games=games, greedy=greedy, game_seed=game_seed),
              "results_other_mode": play_best(run_dir, opponents=opponents, games=games, greedy=not greedy,
                                              game_seed=game_seed),
              **kept_best_elo(run_dir, games=elo_games)}
    one_ply, negamax = record["results"].get("one_ply"), record["results"].get("negamax-4")
    record["wins_80pct_vs_one_ply"] = None if one_ply is None else one_ply["win_rate"] >= WIN_RATE_VS_ONE_PLY
    record["scores_over_50pct_vs_negamax_4"] = None if negamax is None else negamax["score"] > SCORE_VS_NEGAMAX_4
    record["passed"] = bool(record["wins_80pct_vs_one_ply"] and record["scores_over_50pct_vs_negamax_4"]
                            and record["elo_never_falls"])
    return record


def trial(*, seed: int, seconds: float, port: int, overrides: Sequence[str], opponents: Sequence[str], games: int,
          elo_games: int, total_timesteps: int, keep_runs: Path | None, game_seed: int) -> dict[str, Any]:
    """Train one seed with the README command and measure its kept best."""
    started = time.monotonic()
    with trained_run(config=CONFIG, seed=seed, seconds=seconds, port=port,
                     overrides=[f"trainer.total_timesteps={total_timesteps}", *overrides]) as run:
        train_s = time.monotonic() - started
        if keep_runs is not None and run.run_dir.is_dir():  # first: a run that fails to score is still kept
            shutil.copytree(run.run_dir, keep_runs / f"seed{seed}", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("checkpoints"))
        measured = score(run.run_dir, opponents=opponents, games=games, elo_games=elo_games, game_seed=game_seed)
        if keep_runs is not None and (run.run_dir / "elo").is_dir():  # and its elo/ output
            shutil.copytree(run.run_dir / "elo", keep_runs / f"seed{seed}" / "elo", dirs_exist_ok=True)
        within_cap = run.learner_exit_code == 0 and train_s <= seconds
        return {"bench": "connect4_strength", "seed": seed, "train_s": round(train_s, 1), "seconds_cap": seconds,
                "within_cap": within_cap, "learner_exit_code": run.learner_exit_code, "agent_steps": run.agent_steps,
                **measured, "passed": measured["passed"] and within_cap,
                "learner_error": None if measured["best_update"] is not None else run.learner_output[-1500:]}


def markdown_table(trials: Sequence[dict[str, Any]], opponents: Sequence[str], games: int) -> str:
    """One row per seed: training time and steps, the best's update, its results per opponent, the ELO curve."""
    header = ["seed", "train s", "agent steps", "best update",
              *[f"vs {name}: W-D-L (win rate, score)" for name in opponents],
              *[f"{name}, other play mode (win rate, score)" for name in opponents], "kept-best ELO (update: elo)",
              "never falls (largest drop, its bootstrap sd)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for t in trials:
        trained = "train_s" in t  # --runs: scored again, not trained here
        cells = [str(t.get("seed", t.get("run_dir"))), f"{t['train_s']:.0f}" if trained else "-",
                 f"{t.get('agent_steps') or 0:,}" if trained else "-", str(t["best_update"])]
        for name in opponents:
            r = t["results"].get(name)
            cells.append("-" if r is None else
                         f"{r['wins']}-{r['draws']}-{r['losses']} ({r['win_rate']:.3f}, {r['score']:.3f})")
        for name in opponents:
            r = t.get("results_other_mode", {}).get(name)
            cells.append("-" if r is None else f"{'greedy' if not t['greedy'] else 'sampled'} "
                                               f"({r['win_rate']:.3f}, {r['score']:.3f})")
        cells.append(", ".join(f"{p['update']}: {p['elo']:.0f}" for p in t.get("kept_best_elo", [])) or "-")
        cells.append(("yes" if t.get("elo_never_falls") else "NO") + f" ({_largest_drop(t)})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\n{games} games per opponent, seats alternating. Machine: {machine()}.")
    return "\n".join(lines) + "\n"


def _largest_drop(trial: dict[str, Any]) -> str:
    """The largest fall of the kept-best curve with where it is and its bootstrap sd; elo_largest_drop (0.0) when
    the curve never falls."""
    falls = [step for step in trial.get("elo_steps", []) if step["change"] < 0]
    if not falls:
        return str(trial.get("elo_largest_drop", "-"))
    worst = min(falls, key=lambda step: step["change"])
    return f"{-worst['change']} at {worst['from']} -> {worst['to']}, sd {worst['sd']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=1800.0, help="wall-clock cap per seed (the issue: 30 min)")
    parser.add_argument("--games", type=int, default=400, help="games of the best snapshot per opponent (even)")
    parser.add_argument("--opponents", nargs="+", default=["one_ply", "negamax-4"])
    parser.add_argument("--elo-games", type=int, default=200, help="games per pairing of the kept-best ELO tournament")
    parser.add_argument("--port", type=int, default=6500, help="the learner's network.port (and the next three)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="passed to the learner, repeatable")
    parser.add_argument("--keep-runs", type=Path, default=None, help="copy each seed's run directory here")
    parser.add_argument("--runs", type=Path, nargs="+", default=None,
                        help="score these finished run directories (e.g. from --keep-runs) instead of training")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the results as a Markdown table")
    parser.add_argument("--game-seed", type=int, default=GAME_SEED, help="seed of the final games against the "
                        "opponents (another seed: the same kept best against other games)")
    args = parser.parse_args()
    trials = []
    if args.runs is not None:
        for run_dir in args.runs:
            trials.append({"bench": "connect4_strength", "run_dir": str(run_dir),
                           **score(run_dir, opponents=args.opponents, games=args.games, elo_games=args.elo_games,
                                   game_seed=args.game_seed)})
            emit(trials[-1])
    else:
        total = load_config(resolve_config_path(CONFIG), args.overrides).trainer.total_timesteps
        for seed in args.seeds:
            trials.append(trial(seed=seed, seconds=args.seconds, port=args.port, overrides=args.overrides,
                                opponents=args.opponents, games=args.games, elo_games=args.elo_games,
                                total_timesteps=total, keep_runs=args.keep_runs, game_seed=args.game_seed))
            emit(trials[-1])
    emit({"bench": "connect4_strength_summary", "trials": len(trials), "passed": sum(t["passed"] for t in trials),
          **{f"{name}_{key}": [t["results"].get(name, {}).get(key) for t in trials]
             for name in args.opponents for key in ("win_rate", "score")}})
    if args.markdown is not None:
        args.markdown.write_text(markdown_table(trials, args.opponents, args.games))

if __name__ == "__main__":
    run_stoppable(main)
