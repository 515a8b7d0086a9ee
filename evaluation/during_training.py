"""Evaluation during training: ``python -m evaluation.during_training --run-dir D`` (issue 16, parts 4 and 5).

Watches a self-play run's opponent pool (``<run-dir>/pool/``, a snapshot every ``selfplay.snapshot_interval``
updates) and evaluates, in pool order, each snapshot taken at least ``--interval-updates`` updates after the last
evaluated one (the first: at least that many after update 0): ``--games`` games against each baseline with
``evaluation.arena.play_match`` (seats alternating; the same seeds for every snapshot, so snapshots meet the same
games of a baseline). Each evaluation appends one JSON line to ``<run-dir>/evaluation.jsonl`` (``record``'s keys:
update, policy version, per baseline wins/draws/losses and score = (wins + draws / 2) / games, the mean score and
the best snapshot's update so far).

The best snapshot is the one with the highest mean score over the baselines so far (ties: the newer), so the kept best
never gets worse against them. With ``--gate-games N`` (evaluation.gate_games) such a snapshot must also pass
``evaluation/kept_best_gate.py``'s gate: score significantly above 0.5 (2 standard errors) in N games against the kept
best itself, and against the earlier kept bests (N games each) not significantly worse than the kept best does in the
same games (recorded as ``against_best``, ``against_earlier_bests`` and ``gate_passed``; both sides sample their
moves, even with ``--greedy``), so a snapshot that beats the baselines but loses to its predecessors does not replace
it. It lives in ``<run-dir>/best/`` (``evaluation/best_snapshot.py``: its weights and ``best.json``, written
atomically).

Usually the learner starts this as its child process when ``evaluation.interval_updates > 0`` and passes the
section's values as options; defaults otherwise come from the run's ``config.yaml``. It stops on SIGTERM or
SIGINT (exit 0) and when its parent process is gone; ``--once`` evaluates what is due and exits. A restarted
evaluator continues after the last line of ``evaluation.jsonl`` and keeps the best of ``best/best.json``.
Errors: ``python -m evaluation.during_training: error: <message>`` on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from configs.baselines import BASELINE_FORMS, baseline_env_problem, is_baseline_name
from configs.schema import RunConfig
from envs.baseline_players import baseline_player
from envs.registry import env_spec
from evaluation.arena import MatchOutcome, Player, PolicyPlayer, play_match
from evaluation.elo import EloError, pairing_seed, load_run_config, open_pool
from evaluation.best_snapshot import BEST_DIR, KeptBest, kept_best_lineage, read_best, write_best
from evaluation.kept_best_gate import GateResult, KeptBestGate
from learner.monitor.evaluation_results import EVALUATION_RESULTS
from learner.pool.store import Snapshot, SnapshotStore

PROG = "python -m evaluation.during_training"
POLICY_NAME = "snapshot"
"""The evaluated policy's player name (it seeds the games, so every snapshot plays the same games)."""


class DuringTrainingError(Exception):
    """A usage or input problem: ``python -m evaluation.during_training: error: <message>``, exit status 2."""


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived: stop now, between two writes."""


@dataclass(frozen=True, kw_only=True)
class EvaluationSettings:
    """What an evaluation plays."""

    interval_updates: int
    """Evaluate the first snapshot at least this many updates after the last evaluated one (>= 1)."""
    games: int
    """Games per baseline (even)."""
    baselines: tuple[str, ...]
    """Baseline names (configs.baselines), in the order given."""
    greedy: bool
    """Snapshots play their most probable legal action instead of sampling."""
    gate_games: int = 0
    """> 0: a snapshot whose mean score is at least the best's must also pass the gate (evaluation/kept_best_gate.py:
    significantly > 0.5 in this many games against the kept best, and against the earlier kept bests not significantly
    below its mean) to replace it; 0: the mean score alone decides."""
    seed: int
    """Seed of the games (each baseline's games derive from it and the baseline's name)."""


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One snapshot's results against every baseline."""

    snapshot: Snapshot
    """The pool entry evaluated."""
    outcomes: dict[str, MatchOutcome]
    """Baseline name -> the match, from the snapshot's side."""
    gate: GateResult | None = None
    """What the snapshot scored in the gate against the kept bests (None: not played)."""

    @property
    def scores(self) -> dict[str, float]:
        """Baseline name -> the snapshot's score, (wins + draws / 2) / games."""
        return {name: outcome.score_a for name, outcome in self.outcomes.items()}

    @property
    def mean_score(self) -> float:
        """The mean of the scores over the baselines (what the best snapshot is chosen by)."""
        scores = list(self.scores.values())
        return sum(scores) / len(scores)

    def record(self, *, best_update: int) -> dict:
        """The evaluation.jsonl line's object."""
        return {"update": self.snapshot.update, "policy_version": self.snapshot.policy_version,
                "pool_index": self.snapshot.index, "hash": self.snapshot.hash,
                "baselines": {name: {"wins": o.wins_a, "draws": o.draws, "losses": o.wins_b, "games": o.games,
                                     "score": o.score_a} for name, o in self.outcomes.items()},
                "mean_score": self.mean_score, "best_update": best_update, "time": time.time(),
                **({} if self.gate is None else self.gate.record())}


def is_new_best(mean_score: float, best_mean_score: float | None) -> bool:
    """Does a newer snapshot with ``mean_score`` replace the best so far? Yes when at least as good (ties: newer)."""
    return best_mean_score is None or mean_score >= best_mean_score


def due_snapshots(snapshots: Sequence[Snapshot], *, last_update: int, interval_updates: int) -> list[Snapshot]:
    """The snapshots to evaluate, in pool order: each the first at least ``interval_updates`` after the one
    before it (the first after ``last_update``, the last evaluated; 0 when none was)."""
    due, next_update = [], last_update + interval_updates
    for snapshot in snapshots:
        if snapshot.update >= next_update:
            due.append(snapshot)
            next_update = snapshot.update + interval_updates
    return due


def last_evaluated_update(path: Path) -> int:
    """The update of the last whole line of evaluation.jsonl (0 when there is none)."""
    if not path.is_file():
        return 0
    for line in reversed(path.read_text().splitlines()):
        try:
            update = json.loads(line).get("update")
        except (ValueError, AttributeError):
            continue
        if isinstance(update, int):
            return update
    return 0


class Evaluator:
    """Evaluates a run's due pool snapshots, appends the results and keeps the best snapshot."""

    def __init__(self, run_dir: Path, config: RunConfig, store: SnapshotStore, settings: EvaluationSettings) -> None:
        self.run_dir = run_dir
        self.config = config
        self.store = store
        self.settings = settings
        self.spec = env_spec(config.env)
        self.baselines: dict[str, Player] = {
            name: baseline_player(name, seed=settings.seed, where=f"--baselines {name!r}", error=DuringTrainingError)
            for name in settings.baselines}
        self.results_path = run_dir / EVALUATION_RESULTS
        self.last_update = last_evaluated_update(self.results_path)
        best = read_best(run_dir)
        self.best_update: int | None = None if best is None else int(best["update"])
        self.best_mean_score: float | None = None if best is None else float(best["mean_score"])
        self.lineage: list[KeptBest] = kept_best_lineage(self.results_path, best)
        """Every snapshot kept as the best so far, oldest first; the last is the current one."""
        self.gate = KeptBestGate(run_dir, config, self.spec, store, games=settings.gate_games, seed=settings.seed)

    def evaluate_due(self, stop_requested: Callable[[], bool] = lambda: False) -> list[Evaluation]:
        """Evaluate every snapshot due now (reading the pool index again first); returns the evaluations."""
        self.store.reload()
        done = []
        for snapshot in due_snapshots(self.store.snapshots, last_update=self.last_update,
                                      interval_updates=self.settings.interval_updates):
            if stop_requested():
                break
            done.append(self.evaluate(snapshot))
        return done

    def evaluate(self, snapshot: Snapshot) -> Evaluation:
        """Play one snapshot against every baseline, then record the results (and the best)."""
        arrays = self.store.load(snapshot.index)
        policy = PolicyPlayer(POLICY_NAME, self.spec, self.config.model, arrays,
                              greedy=self.settings.greedy, seed=self.settings.seed, version=snapshot.policy_version)
        outcomes = {name: play_match(policy, player, episodes=self.settings.games, env_config=self.config.env,
                                     seed=pairing_seed(self.settings.seed, POLICY_NAME, name))
                    for name, player in self.baselines.items()}
        evaluation = Evaluation(snapshot=snapshot, outcomes=outcomes)
        new_best = is_new_best(evaluation.mean_score, self.best_mean_score)
        gate = self._gate(arrays, snapshot.policy_version) if new_best and self.settings.gate_games else None
        if gate is not None:
            evaluation = Evaluation(snapshot=snapshot, outcomes=outcomes, gate=gate)
            new_best = gate.passed
        if new_best:
            write_best(self.run_dir / BEST_DIR, snapshot, self.store.read_bytes(snapshot.hash),
                       scores=evaluation.scores, games={name: o.games for name, o in outcomes.items()})
            self.best_update, self.best_mean_score = snapshot.update, evaluation.mean_score
            self.lineage.append(KeptBest(update=snapshot.update, policy_version=snapshot.policy_version,
                                         hash=snapshot.hash))
        with self.results_path.open("a") as file:
            file.write(json.dumps(evaluation.record(best_update=self.best_update)) + "\n")
        self.last_update = snapshot.update
        return evaluation

    def _gate(self, arrays: dict, version: int) -> GateResult | None:
        """The challenger (weights ``arrays``) in the gate against the kept best and the kept bests before it
        (None when there is no kept best yet, or best/ cannot be read: no gate)."""
        best = read_best(self.run_dir)
        if self.best_update is None or best is None:
            return None
        earlier = [kept for kept in self.lineage if kept.update < self.best_update]
        return self.gate.judge(arrays, version, best=best, earlier=earlier)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (the evaluation options default to the run's config.yaml)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Evaluate a self-play run's pool snapshots against "
                                     "fixed baselines while it trains, and keep the best one in <run-dir>/best/.")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (holds config.yaml and pool/)")
    parser.add_argument("--interval-updates", type=int, default=None,
                        help="evaluate a snapshot at least this many updates after the last (evaluation."
                             "interval_updates; 0 there means 1 here)")
    parser.add_argument("--games", type=int, default=None, help="games per baseline, even (evaluation.games)")
    parser.add_argument("--baselines", default=None,
                        help=f"comma-separated baselines (evaluation.baselines); names: {BASELINE_FORMS}")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=None,
                        help="snapshots take their most probable legal action (evaluation.greedy)")
    parser.add_argument("--gate-games", type=int, default=None,
                        help="a new best must also pass the gate (evaluation/kept_best_gate.py) in this many games "
                             "(even) against the kept best and each earlier kept best; "
                             "0: no head-to-head (evaluation.gate_games)")
    parser.add_argument("--poll-s", type=float, default=1.0, help="seconds between looks at the pool (default 1)")
    parser.add_argument("--once", action="store_true", help="evaluate the snapshots due now, then exit")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process is no longer the parent (default: the parent at start; the "
                             "learner passes its own, so a learner gone before this started is noticed too)")
    return parser


def settings_from(args: argparse.Namespace, config: RunConfig) -> EvaluationSettings:
    """The options given, else the config's evaluation section; DuringTrainingError naming a bad one."""
    section = config.evaluation
    interval = args.interval_updates if args.interval_updates is not None else max(1, section.interval_updates)
    games = args.games if args.games is not None else section.games
    text = args.baselines if args.baselines is not None else ",".join(section.baselines)
    baselines = tuple(name.strip() for name in text.split(",") if name.strip())
    if interval < 1:
        raise DuringTrainingError(f"--interval-updates must be >= 1, got {interval}")
    if games < 2 or games % 2:
        raise DuringTrainingError(f"--games must be even and >= 2 (seats alternate), got {games}")
    unknown = [name for name in baselines if not is_baseline_name(name)]
    if unknown or not baselines or len(set(baselines)) != len(baselines):
        raise DuringTrainingError(f"--baselines {text!r}: give distinct names, each one of: {BASELINE_FORMS}")
    for name in baselines:
        problem = baseline_env_problem(name, config.env.name)
        if problem is not None:
            raise DuringTrainingError(f"--baselines: {problem}")
    greedy = args.greedy if args.greedy is not None else section.greedy
    gate_games = args.gate_games if args.gate_games is not None else section.gate_games
    if gate_games < 0 or gate_games % 2:
        raise DuringTrainingError(f"--gate-games must be even and >= 0 (seats alternate), got {gate_games}")
    return EvaluationSettings(interval_updates=interval, games=games, baselines=baselines, greedy=greedy,
                              gate_games=gate_games, seed=config.run.seed)


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate until stopped (or once); 0 on a clean stop, 2 (with a message on stderr) on a usage error."""
    args = build_parser().parse_args(argv)
    parent = os.getppid() if args.parent_pid is None else args.parent_pid

    def stop(signum: int, _frame: object) -> None:
        raise StopRequested(signal.Signals(signum).name)

    handlers = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    threads = torch.get_num_threads()
    try:
        evaluator = _make_evaluator(args)
        while True:
            evaluator.evaluate_due(stop_requested=lambda: os.getppid() != parent)
            if args.once or os.getppid() != parent:
                return 0
            time.sleep(args.poll_s)
    except StopRequested:
        return 0
    except DuringTrainingError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    finally:  # as they were (main may run inside another program, e.g. a test)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        torch.set_num_threads(threads)  # _make_evaluator uses the run's run.torch_threads


def _make_evaluator(args: argparse.Namespace) -> Evaluator:
    try:
        config = load_run_config(args.run_dir)
        store = open_pool(args.run_dir)
    except EloError as err:
        raise DuringTrainingError(str(err)) from err
    torch.set_num_threads(config.run.torch_threads)
    return Evaluator(args.run_dir, config, store, settings_from(args, config))


if __name__ == "__main__":
    sys.exit(main())
