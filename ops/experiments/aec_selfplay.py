"""Experiment: does self-play learn a turn-based PettingZoo game (``env.name: pettingzoo_aec``)?

``--game tictactoe``: ``configs/tictactoe.yaml`` (self-play against the pool, with 20% ``random`` and 40% perfect
minimax opponents mixed in); the targets: against the perfect player (``examples.tictactoe_players:MinimaxPlayer``)
at least 95% of the games drawn or won (``not_lost``), against random at least 90% won.
``--game connect_four_v3``: ``configs/connect_four_v3.yaml`` (PettingZoo's own Connect Four rules, pure Python; 40% of
the envs play the built-in one-ply through ``examples.connect_four_v3_players:OnePlyV3Player``); the target: at least
80% won against that one-ply player. Its learning curve is the run's evaluation during training
(``<run-dir>/evaluation.jsonl``: each evaluated snapshot's score against the config's baselines), printed as ``curve``.

For each seed the game's config trains through the real pipeline (``pipeline_run.trained_run``: ``python -m learner``
and one actor host) for ``--agent-steps`` learner steps, stopped with SIGINT if it runs past ``--seconds``. Then the
final checkpoint plays ``--games`` games (seats alternating) against each of the game's opponents through ``python -m
evaluation.evaluate``'s own code (``evaluation.opponents.resolve_opponent``, ``evaluation.evaluate.play_opponent``),
once greedy and once sampling its moves. Reported per opponent and mode: wins, draws, losses, and per seat. Prints one
JSON line per seed, mode and opponent, and the training's figures (seconds, agent steps, updates, the curve). Usage:
.venv/bin/python -m ops.experiments.aec_selfplay [--game tictactoe] [--seeds 1] [--agent-steps N] [--seconds 1200]
    [--games 400] [--port 6500] [--set SECTION.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.evaluate import play_opponent
from evaluation.load_policy import load_policy
from evaluation.opponents import resolve_opponent
from ops.benchlib import emit
from ops.experiments.pipeline_run import trained_run

MINIMAX = "examples.tictactoe_players:MinimaxPlayer"
ONE_PLY_V3 = "examples.connect_four_v3_players:OnePlyV3Player"


@dataclass(frozen=True, kw_only=True)
class Game:
    """One game's config, training budget and targets."""

    config: str
    """The shipped config it trains."""
    agent_steps: int
    """Default learner agent steps of training."""
    targets: dict[str, tuple[str, float]]
    """Per opponent the final checkpoint plays: the figure judged and its bar."""


GAMES = {
    "tictactoe": Game(config="tictactoe", agent_steps=2_000_000,
                      targets={MINIMAX: ("not_lost", 0.95), "random": ("win_rate", 0.90)}),
    "connect_four_v3": Game(config="connect_four_v3", agent_steps=13_000_000,
                            targets={ONE_PLY_V3: ("win_rate", 0.80), "random": ("win_rate", 0.90)}),
}
GAME_SEED = 20261127
"""Seed of the final games."""


def play(run_dir: Path, *, opponent: str, target: tuple[str, float], games: int, greedy: bool,
         seed: int) -> dict[str, Any]:
    """The run's newest checkpoint against ``opponent`` (``games`` games, seats alternating), as evaluate does."""
    loaded = load_policy(run_dir)
    resolved = resolve_opponent(opponent, run_dir=run_dir, config=loaded.config, spec=loaded.spec, greedy=greedy,
                                seed=seed)
    summary = play_opponent(loaded, resolved, episodes=games, deterministic=greedy, seed=seed)
    outcome = summary.match.outcome
    per_seat = {}
    for seat, label in ((0, "first"), (1, "second")):
        results = outcome.returns_a[outcome.seats_a == seat]
        per_seat[label] = {"wins": int((results > 0).sum()), "draws": int((results == 0).sum()),
                           "losses": int((results < 0).sum())}
    figure, bar = target
    record = {"opponent": opponent, "mode": "greedy" if greedy else "sampled", "update": loaded.update,
              "games": outcome.games, "wins": outcome.wins_a, "draws": outcome.draws, "losses": outcome.wins_b,
              "win_rate": round(outcome.wins_a / outcome.games, 4),
              "not_lost": round((outcome.wins_a + outcome.draws) / outcome.games, 4), "per_seat": per_seat}
    return {**record, "target": f"{figure} >= {bar}", "passed": record[figure] >= bar}


def training_figures(run_dir: Path) -> dict[str, Any]:
    """Updates, agent steps, seconds and the last pool win/draw/loss rates of a run's metrics.jsonl, and the curve of
    its evaluation during training (update -> score against each baseline, from <run-dir>/evaluation.jsonl)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    figures = {key: last.get(key) for key in ("update", "agent_steps", "elapsed_s", "win_rate", "draw_rate",
                                              "loss_rate", "pool_snapshots")}
    evaluations = run_dir / "evaluation.jsonl"
    records = [json.loads(line) for line in evaluations.read_text().splitlines() if line.strip()] \
        if evaluations.exists() else []
    figures["curve"] = [{"update": record.get("update"),
                         **{name: round(result["score"], 3) for name, result in record.get("baselines", {}).items()}}
                        for record in records]
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", choices=sorted(GAMES), default="tictactoe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--agent-steps", type=int, default=None,
                        help="learner agent steps of training (default: the game's, 2M for tictactoe, 13M for "
                             "connect_four_v3)")
    parser.add_argument("--seconds", type=float, default=1200.0, help="wall-clock cap of one training run")
    parser.add_argument("--games", type=int, default=400, help="games per opponent and mode, seats alternating")
    parser.add_argument("--port", type=int, default=6500)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="more config overrides for the learner")
    args = parser.parse_args(argv)
    game = GAMES[args.game]
    for seed in args.seeds:
        overrides = [f"trainer.total_timesteps={args.agent_steps or game.agent_steps}", *args.overrides]
        with trained_run(config=game.config, seed=seed, seconds=args.seconds, port=args.port,
                         overrides=overrides) as run:
            emit({"experiment": "aec_selfplay", "game": args.game, "seed": seed,
                  "learner_exit_code": run.learner_exit_code, **training_figures(run.run_dir)})
            for greedy in (True, False):
                for opponent, target in game.targets.items():
                    emit({"experiment": "aec_selfplay", "game": args.game, "seed": seed,
                          **play(run.run_dir, opponent=opponent, target=target, games=args.games, greedy=greedy,
                                 seed=GAME_SEED)})


if __name__ == "__main__":
    main()
