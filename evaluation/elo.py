"""Elo ratings of a self-play run's pool snapshots: ``python -m evaluation.elo --run-dir runs/X`` (seeds/002, issue 6).

Plays the run's pool snapshots (``<run-dir>/pool/``) against each other and against baselines (by default, on
``connect_four``, ``random``: uniformly random legal moves, ``one_ply``: win now, else block, else random, and
``negamax-2``, ``negamax-4``: random among the best moves of a 2- / 4-ply search for forced wins and losses; on a
two-player ``pettingzoo_aec`` env just ``random``; ``--baselines random,one_ply,negamax-<depth>,module.path:fn,...``
picks others, ``random`` always among them, an entry point being a player ``envs.baseline_players`` builds), with
``evaluation.arena.play_match`` (seats alternating, batched, in-process), then fits Bradley-Terry ratings by
maximum likelihood (``evaluation.ratings.fit_ratings``: order-independent, draws count half) on the Elo scale,
ANCHORED so that ``random`` is exactly 1000.

Pairings (each played ``--episodes`` times):

* ``sequential`` (default): every snapshot against each of the ``--window-size`` snapshots before it, every
  snapshot against every baseline, and the baselines in a chain from weakest to strongest (``random`` vs
  ``one_ply``, ``one_ply`` vs ``negamax-2``, ``negamax-2`` vs ``negamax-4``, then the entry points in the order
  given), so the fit stays connected;
* ``round-robin``: every pair of players (snapshots and baselines).

A long pool is thinned evenly to at most ``--max-snapshots`` (first and newest always kept); the output says
which were kept. ``--kept-best`` rates instead the snapshots that evaluation during training kept as the best, each
at the time it became the best (``<run-dir>/evaluation.jsonl``), so the plot is the kept best's curve. Snapshots play by SAMPLING from their policy, as in training (``--greedy``: argmax).
Each pairing's seed derives from ``--seed`` and the two players' names only, so a pairing's games do not
depend on which other pairings ran.

Writes into ``--output-dir`` (default ``<run-dir>/elo``): ``elo.json`` (ratings, per-snapshot pool index,
update and policy version, every pairing's results, the results matrices, settings), ``elo.csv`` (one row per
player, best first), ``elo_over_snapshots.png`` (Elo against snapshot update; baselines as dashed lines) and,
with ``--output-heatmap``, ``win_rate_heatmap.png``. Prints a table to stdout and progress to stderr.

Uncertainty: ``--bootstrap N`` (default ``DEFAULT_BOOTSTRAP``; 0 skips it) refits the ratings on ``N`` resampled
tournaments (``evaluation.ratings.bootstrap_ratings``: each pairing's games redrawn from its observed win, draw and
loss rates, a parametric bootstrap). The table's ``±2sd`` column, the CSV's ``elo_2sd`` column, the plot's error bars
and elo.json's ``uncertainty`` (``sd``, ``pm`` = 2 sd, and the 2.5 and 97.5 percentiles per player; each snapshot's
``elo_pm``) show it: plus or minus 2 standard deviations of a player's resampled ratings (about a 95% interval).
The anchor ``random`` is exactly 1000 in every resample, so its spread is 0 and the others' is relative to it. Errors:
``python -m evaluation.elo: error: <message>`` on stderr, exit status 2. Two-player turn-based envs only
(``configs.baselines.TWO_PLAYER_ENVS``: connect_four, and pettingzoo_aec with two agents).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from envs.registry import env_spec
from configs.baselines import (BASELINE_FORMS, TWO_PLAYER_ENVS, baseline_env_problem, baseline_strength,
                               is_baseline_name)
from configs.schema import RunConfig
from evaluation.best_snapshot import BEST_DIR, kept_best_lineage, read_best
from envs.baseline_players import baseline_player
from evaluation.arena import MatchOutcome, Player, PolicyPlayer, play_match
from learner.monitor.evaluation_results import EVALUATION_RESULTS
from learner.run.run_dir import RunDirError, read_run_config
from learner.pool.store import INDEX_NAME, Snapshot, SnapshotStore, SnapshotStoreError
from evaluation.ratings import (MatchResults, bootstrap_ratings, fit_ratings, plot_elo_over_snapshots,
                                plot_win_rate_heatmap, write_tables)

PROG = "python -m evaluation.elo"
DEFAULT_BASELINES = ("random", "one_ply", "negamax-2", "negamax-4")
"""Baselines rated on connect_four when ``--baselines`` is not given, weakest first (other envs: ``random``)."""
ANCHOR, ANCHOR_RATING = "random", 1000.0
ENTRY_POINT_RANK = 1_000_000
"""Entry-point baselines sort after every fixed one (whose ranks are small), in the order given."""
MODES = ("sequential", "round-robin")
DEFAULT_BOOTSTRAP = 200
"""Resampled tournaments behind the ± of each rating when ``--bootstrap`` is not given."""
SPREAD_SDS = 2.0
"""The ± shown is this many standard deviations of the bootstrap ratings."""


class EloError(Exception):
    """A usage or input problem: reported as ``python -m evaluation.elo: error: <message>``, exit status 2."""


@dataclass(frozen=True, kw_only=True)
class Spread:
    """The bootstrap spread of every player's rating."""

    samples: int
    """Resampled tournaments."""
    sd: dict[str, float]
    """Standard deviation of each player's resampled ratings (0 for the anchor)."""
    low: dict[str, float]
    """2.5th percentile of each player's resampled ratings."""
    high: dict[str, float]
    """97.5th percentile of each player's resampled ratings."""

    def pm(self, name: str) -> float:
        """The ± shown for ``name``: ``SPREAD_SDS`` standard deviations."""
        return SPREAD_SDS * self.sd[name]


@dataclass(frozen=True, kw_only=True)
class Pairing:
    """One pairing's results (a's side)."""

    a: str
    b: str
    outcome: MatchOutcome


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Rate a self-play run's pool snapshots and fixed baselines (random, one_ply, "
        "negamax-<depth>; Bradley-Terry maximum likelihood on the Elo scale, random = 1000).")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (holds config.yaml and pool/)")
    parser.add_argument("--tournament-mode", choices=MODES, default="sequential",
                        help="sequential (default): each snapshot vs the previous --window-size ones and every "
                             "baseline; round-robin: every pair of players")
    parser.add_argument("--window-size", type=int, default=5,
                        help="previous snapshots each snapshot plays in sequential mode (default 5)")
    parser.add_argument("--episodes", type=int, default=200, help="games per pairing, seats alternating (default 200)")
    parser.add_argument("--output-heatmap", action="store_true", help="also write win_rate_heatmap.png")
    parser.add_argument("--output-dir", type=Path, default=None, help="where to write (default <run-dir>/elo)")
    parser.add_argument("--max-snapshots", type=int, default=30,
                        help="evenly thin the pool to at most this many snapshots, first and newest kept (default 30)")
    parser.add_argument("--kept-best", action="store_true",
                        help="rate the snapshots that evaluation during training kept as the best (from "
                             "<run-dir>/evaluation.jsonl), each from the time it became the best, not the thinned pool")
    parser.add_argument("--greedy", action="store_true",
                        help="snapshots take their most probable legal action instead of sampling as in training")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pairings' games and of the bootstrap "
                        "(default 0)")
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, metavar="N",
                        help=f"resampled tournaments behind each rating's ± (2 standard deviations; default "
                             f"{DEFAULT_BOOTSTRAP}, 0 skips it)")
    parser.add_argument("--baselines", default=None,
                        help=f"comma-separated baselines to rate, random required (the anchor); names: "
                             f"{BASELINE_FORMS} (default on connect_four {','.join(DEFAULT_BASELINES)}, else "
                             f"{ANCHOR})")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run the tournament; 0 on success, 2 (with a message on stderr) on a usage or input error."""
    args = build_parser(prog).parse_args(argv)
    threads = torch.get_num_threads()
    try:
        run(args)
    except EloError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # run() uses the run's run.torch_threads
    return 0


def run(args: argparse.Namespace) -> dict:
    """Everything ``main`` does, raising ``EloError`` for bad input; returns the elo.json document."""
    _check_args(args)
    given = None if args.baselines is None else parse_baselines(args.baselines)
    config = load_run_config(args.run_dir)
    baselines = given if given is not None else default_baselines(config.env.name)
    for name in baselines:
        problem = baseline_env_problem(name, config.env.name)
        if problem is not None:
            raise EloError(f"--baselines: {problem}")
    store = open_pool(args.run_dir)
    torch.set_num_threads(config.run.torch_threads)
    kept = kept_best_indices(args.run_dir, store) if args.kept_best else thin_indices(len(store), args.max_snapshots)
    snapshots = [store.snapshot(i) for i in kept]
    names = [snapshot_name(s) for s in snapshots]
    print(f"pool: {len(store)} snapshots; kept {len(kept)} (pool indices {', '.join(map(str, kept))})")
    players = _make_players(config, store, snapshots, names, baselines, greedy=args.greedy, seed=args.seed)
    order = [*names, *baselines]
    pairs = pairings(names, args.tournament_mode, args.window_size, baselines)
    wins = np.zeros((len(order), len(order)))
    draws = np.zeros_like(wins)
    played: list[Pairing] = []
    start = time.perf_counter()
    for number, (a, b) in enumerate(pairs, start=1):
        outcome = play_match(players[a], players[b], episodes=args.episodes, env_config=config.env,
                             seed=pairing_seed(args.seed, a, b))
        i, j = order.index(a), order.index(b)
        wins[i, j] += outcome.wins_a
        wins[j, i] += outcome.wins_b
        draws[i, j] += outcome.draws
        draws[j, i] += outcome.draws
        played.append(Pairing(a=a, b=b, outcome=outcome))
        print(f"pairing {number}/{len(pairs)}: {a} vs {b}: {outcome.wins_a}-{outcome.draws}-{outcome.wins_b} "
              f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    results = MatchResults(players=tuple(order), wins=wins, draws=draws)
    ratings = fit_ratings(order, wins, draws, anchor=ANCHOR, anchor_rating=ANCHOR_RATING)
    spread = bootstrap_spread(order, wins, draws, samples=args.bootstrap, seed=args.seed)
    out_dir = args.output_dir if args.output_dir is not None else args.run_dir / "elo"
    doc = _write_outputs(out_dir, args, ratings, results, snapshots, names, played, baselines,
                         pool_size=len(store), spread=spread)
    print(format_table(ratings, results, snapshots, names, spread=spread))
    if spread is not None:
        print(f"±2sd: 2 standard deviations of each rating over {spread.samples} bootstrap resamples of the games "
              f"(about a 95% interval; {ANCHOR} is the anchor, ±0)")
    print(f"ratings anchored at {ANCHOR} = {ANCHOR_RATING:.0f}; wrote {', '.join(doc['files'])} to {out_dir}")
    best = read_best(args.run_dir)
    if best is not None:
        print(f"best snapshot kept during training: update {best['update']} (mean score {best['mean_score']:.3f} "
              f"against {', '.join(best['scores'])}), weights in {args.run_dir / BEST_DIR / best['weights']}")
    return doc


def _check_args(args: argparse.Namespace) -> None:
    if args.window_size < 1:
        raise EloError(f"--window-size must be >= 1, got {args.window_size}")
    if args.episodes < 1:
        raise EloError(f"--episodes must be >= 1, got {args.episodes}")
    if args.max_snapshots < 1:
        raise EloError(f"--max-snapshots must be >= 1, got {args.max_snapshots}")
    if args.bootstrap < 0:
        raise EloError(f"--bootstrap must be >= 0 (0 skips the bootstrap), got {args.bootstrap}")


def bootstrap_spread(players: list[str], wins: np.ndarray, draws: np.ndarray, *, samples: int,
                     seed: int) -> Spread | None:
    """Each player's rating spread over ``samples`` parametric bootstrap resamples (None when ``samples`` is 0)."""
    if samples == 0:
        return None
    start = time.perf_counter()
    resampled = bootstrap_ratings(players, wins, draws, anchor=ANCHOR, samples=samples, seed=seed)
    sd = resampled.std(axis=0)
    low, high = np.percentile(resampled, [2.5, 97.5], axis=0)
    print(f"bootstrap: {samples} resampled tournaments ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return Spread(samples=samples, sd={name: float(v) for name, v in zip(players, sd)},
                  low={name: float(v) for name, v in zip(players, low)},
                  high={name: float(v) for name, v in zip(players, high)})


def default_baselines(env_name: str) -> tuple[str, ...]:
    """The baselines rated when ``--baselines`` is not given: Connect Four's on connect_four, else ``random``."""
    return DEFAULT_BASELINES if env_name == "connect_four" else (ANCHOR,)


def parse_baselines(text: str) -> tuple[str, ...]:
    """``--baselines``'s comma list as baseline names, weakest first (random, one_ply, negamax by depth), then the
    entry points in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    strength: dict[str, int] = {}
    for number, name in enumerate(names):
        if not is_baseline_name(name):
            raise EloError(f"--baselines: unknown baseline {name!r}; allowed: {BASELINE_FORMS}")
        rank = baseline_strength(name)
        strength[name] = rank if rank is not None else ENTRY_POINT_RANK + number
    if len(strength) != len(names):
        raise EloError(f"--baselines names a baseline twice: {text!r}")
    if ANCHOR not in strength:
        raise EloError(f"--baselines must include {ANCHOR!r} (the anchor, rated {ANCHOR_RATING:.0f}), got {text!r}")
    return tuple(sorted(names, key=strength.__getitem__))


def load_run_config(run_dir: Path) -> RunConfig:
    try:
        config = read_run_config(run_dir)
    except RunDirError as err:
        raise EloError(str(err)) from err
    path = run_dir / "config.yaml"
    if config.env.name not in TWO_PLAYER_ENVS:
        raise EloError(f"env.name {config.env.name!r} in {path} is not a two-player turn-based env the arena can "
                       f"rate; allowed: {', '.join(map(repr, TWO_PLAYER_ENVS))}")
    try:
        spec = env_spec(config.env)
    except ValueError as err:
        raise EloError(f"the run's env is unusable: {err}") from err
    if spec.num_agents != 2:
        raise EloError(f"the run's env {config.env.name!r} in {path} has {spec.num_agents} agents per env; the arena "
                       f"plays two-player games only")
    return config


def open_pool(run_dir: Path) -> SnapshotStore:
    root = run_dir / "pool"
    if not (root / INDEX_NAME).is_file():
        raise EloError(f"no snapshot pool in {run_dir}: {root / INDEX_NAME} does not exist "
                       f"(was the run trained with self-play?)")
    try:
        store = SnapshotStore(root)
    except SnapshotStoreError as err:
        raise EloError(str(err)) from err
    if len(store) == 0:
        raise EloError(f"the snapshot pool {root} is empty: there is nothing to rate")
    return store


def kept_best_indices(run_dir: Path, store: SnapshotStore) -> list[int]:
    """Pool indices of the snapshots evaluation during training kept as the best, in the order they became it
    (each evaluation.jsonl record whose own update is its ``best_update``)."""
    path = run_dir / EVALUATION_RESULTS
    if not path.is_file():
        raise EloError(f"--kept-best: cannot read {path} (no such file); it is written by evaluation "
                       f"during training (evaluation.interval_updates > 0)")
    by_hash = {snapshot.hash: snapshot.index for snapshot in store.snapshots}
    kept = [by_hash[k.hash] for k in kept_best_lineage(path) if k.hash in by_hash]
    if not kept:
        raise EloError(f"--kept-best: {path} names no best snapshot that is in the pool")
    return list(dict.fromkeys(kept))


def thin_indices(total: int, limit: int) -> list[int]:
    """At most ``limit`` indices of ``range(total)``, evenly spaced, always with the first and the last."""
    if total <= limit:
        return list(range(total))
    if limit == 1:
        return [total - 1]
    return sorted({int(round(x)) for x in np.linspace(0, total - 1, limit)})


def snapshot_name(snapshot: Snapshot) -> str:
    """A player name for a snapshot: pool index and learner update, e.g. ``s3-u30``."""
    return f"s{snapshot.index}-u{snapshot.update}"


def pairings(snapshots: list[str], mode: str, window_size: int,
             baselines: Sequence[str] = DEFAULT_BASELINES) -> list[tuple[str, str]]:
    """(a, b) pairs to play; see the module docstring. Snapshots are in pool order, oldest first; baselines
    weakest first."""
    players = [*snapshots, *baselines]
    if mode == "round-robin":
        return [(players[i], players[j]) for i in range(len(players)) for j in range(i + 1, len(players))]
    if mode != "sequential":
        raise ValueError(f"unknown tournament mode {mode!r}; allowed: {', '.join(MODES)}")
    pairs = [(snapshots[k], snapshots[k - w]) for k in range(len(snapshots)) for w in range(1, window_size + 1)
             if k - w >= 0]
    pairs += [(name, baseline) for name in snapshots for baseline in baselines]
    return pairs + list(zip(baselines[:-1], baselines[1:]))


def pairing_seed(seed: int, a: str, b: str) -> int:
    """The seed of one pairing's games: a function of ``seed`` and the two names only."""
    entropy = [seed & 0xFFFFFFFF, zlib.crc32(a.encode()), zlib.crc32(b.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _make_players(config: RunConfig, store: SnapshotStore, snapshots: list[Snapshot], names: list[str],
                  baselines: Sequence[str], *, greedy: bool, seed: int) -> dict[str, Player]:
    spec = env_spec(config.env)
    players: dict[str, Player] = {name: baseline_player(name, seed=seed, where=f"--baselines {name!r}",
                                                        error=EloError) for name in baselines}
    for snapshot, name in zip(snapshots, names):
        try:
            arrays = store.load(snapshot.index)
            players[name] = PolicyPlayer(name, spec, config.model, arrays, greedy=greedy, seed=seed,
                                         version=snapshot.policy_version)
        except SnapshotStoreError as err:
            raise EloError(str(err)) from err
        except (RuntimeError, ValueError) as err:  # strict load_state_dict: weights do not fit the model
            raise EloError(f"snapshot {snapshot.index} does not fit the run's model ({config.model}): "
                           f"{str(err).splitlines()[0]}") from err
    return players


def _write_outputs(out_dir: Path, args: argparse.Namespace, ratings: dict[str, float], results: MatchResults,
                   snapshots: list[Snapshot], names: list[str], played: list[Pairing], baselines: Sequence[str], *,
                   pool_size: int, spread: Spread | None = None) -> dict:
    pm = None if spread is None else {name: spread.pm(name) for name in results.players}
    json_path, csv_path = write_tables(ratings, results, out_dir, spread=pm)
    doc = json.loads(json_path.read_text())
    doc["anchor"] = {"player": ANCHOR, "rating": ANCHOR_RATING}
    doc["baselines"] = list(baselines)
    doc["snapshots"] = [{"name": name, "index": s.index, "update": s.update, "policy_version": s.policy_version,
                         "hash": s.hash, "elo": ratings[name], **({} if pm is None else {"elo_pm": pm[name]})}
                        for s, name in zip(snapshots, names)]
    doc["uncertainty"] = None if spread is None else {
        "method": "parametric bootstrap (evaluation.ratings.bootstrap_ratings)", "samples": spread.samples,
        "seed": args.seed, "shown": f"±{SPREAD_SDS:g} standard deviations", "sd": spread.sd, "pm": pm,
        "p2.5": spread.low, "p97.5": spread.high}
    doc["pool_size"] = pool_size
    doc["pairings"] = [{"a": p.a, "b": p.b, "wins_a": p.outcome.wins_a, "draws": p.outcome.draws,
                        "wins_b": p.outcome.wins_b, "a_first": p.outcome.a_first} for p in played]
    doc["settings"] = {"run_dir": str(args.run_dir), "tournament_mode": args.tournament_mode,
                       "window_size": args.window_size, "episodes": args.episodes,
                       "max_snapshots": args.max_snapshots, "kept_best": args.kept_best, "greedy": args.greedy, "seed": args.seed,
                       "baselines": ",".join(baselines), "bootstrap": args.bootstrap}
    files = [json_path.name, csv_path.name]
    plot = plot_elo_over_snapshots(ratings, names, out_dir / "elo_over_snapshots.png",
                                   baselines={name: ratings[name] for name in baselines}, errors=pm)
    files.append(plot.name)
    if args.output_heatmap:
        files.append(plot_win_rate_heatmap(list(results.players), results.win_rate(),
                                           out_dir / "win_rate_heatmap.png").name)
    doc["files"] = files
    json_path.write_text(json.dumps(doc, indent=1))
    return doc


def format_table(ratings: dict[str, float], results: MatchResults, snapshots: list[Snapshot],
                 names: list[str], *, spread: Spread | None = None) -> str:
    """A plain-text table, best player first: rank, player, update, elo, (with ``spread``) ±2sd, games, score."""
    updates = {name: str(s.update) for s, name in zip(snapshots, names)}
    players = list(results.players)
    games = results.games().sum(axis=1)
    draws = results.draws if results.draws is not None else np.zeros_like(results.wins)
    points = results.wins.sum(axis=1) + 0.5 * draws.sum(axis=1)
    width = max(len(p) for p in players)
    pm_header = "" if spread is None else f"  {'±2sd':>7}"
    lines = [f"{'rank':>4}  {'player':<{width}}  {'update':>7}  {'elo':>7}{pm_header}  {'games':>6}  {'score':>5}"]
    for rank, name in enumerate(sorted(players, key=lambda p: (-ratings[p], p)), start=1):
        i = players.index(name)
        score = f"{points[i] / games[i]:.3f}" if games[i] else "-"
        pm = "" if spread is None else f"  {'±' + format(spread.pm(name), '.1f'):>7}"
        lines.append(f"{rank:>4}  {name:<{width}}  {updates.get(name, '-'):>7}  {ratings[name]:>7.1f}{pm}  "
                     f"{int(games[i]):>6}  {score:>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
