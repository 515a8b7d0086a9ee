"""Bradley-Terry ratings on the Elo scale from a table of game results, plus plots and tables (seeds/002).

Model: player i beats player j with probability ``1 / (1 + 10 ** ((r_j - r_i) / 400))``, i.e. logistic in
the rating gap with 400 Elo = a factor 10 in odds. ``fit_ratings`` finds the maximum a-posteriori ratings by
damped Newton iterations on the (concave) log-likelihood.

Regularisation, so that a player who won (or lost) every game still gets a finite rating:

* ``prior_draws`` (default 1.0) virtual drawn games are added to every pair that played at least once
  (half a win each). With 400 real games it moves a pair's score rate by at most 1/802; a 10-0 record
  becomes 10.5 : 0.5, a gap of 529 Elo instead of infinity. Pairs that never met get nothing, so a
  sequential tournament (each snapshot against its neighbours) is not shrunk along the chain.
* the likelihood only sees rating gaps, so each group of players connected by games is centred, then the
  whole table is shifted so the mean rating (or the ``anchor``'s rating) is ``anchor_rating``. Groups that
  never played each other are not comparable; a player with no games gets the mean.

matplotlib is imported inside the plot functions and drives the Agg canvas directly (no pyplot, no global
backend switch), so importing this module costs nothing and works on headless machines.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ELO_PER_NAT = 400.0 / math.log(10.0)
_MAX_ITERS = 200
_TOL = 1e-10


def win_probability(r_a: float | np.ndarray, r_b: float | np.ndarray) -> float | np.ndarray:
    """Expected score of a player rated ``r_a`` against one rated ``r_b``: 1 / (1 + 10 ** ((r_b - r_a) / 400))."""
    with np.errstate(over="ignore"):
        result = 1.0 / (1.0 + 10.0 ** ((np.asarray(r_b, dtype=np.float64) - r_a) / 400.0))
    return float(result) if result.ndim == 0 else result


@dataclass(frozen=True, kw_only=True, eq=False)
class MatchResults:
    """A results table: who played whom and how it went."""

    players: tuple[str, ...]
    """Player names, in the order of the matrix rows and columns."""
    wins: np.ndarray
    """wins[i, j]: games player i won against player j."""
    draws: np.ndarray | None = None
    """draws[i, j] = draws[j, i]: games between i and j that were drawn (None = no draws)."""

    def __post_init__(self) -> None:
        wins, draws = _check_table(list(self.players), self.wins, self.draws)
        object.__setattr__(self, "players", tuple(self.players))
        object.__setattr__(self, "wins", wins)
        object.__setattr__(self, "draws", draws)

    def games(self) -> np.ndarray:
        """games[i, j]: games played between i and j (symmetric)."""
        return self.wins + self.wins.T + self.draws  # type: ignore[operator]

    def win_rate(self) -> np.ndarray:
        """win_rate[i, j]: player i's score rate against j (draws count half); NaN where they never played."""
        return win_rate_matrix(self.wins, self.draws)


def win_rate_matrix(wins: np.ndarray, draws: np.ndarray | None = None) -> np.ndarray:
    """Score rate of row player against column player, (wins + draws / 2) / games; NaN where no games."""
    wins = np.asarray(wins, dtype=np.float64)
    draws = np.zeros_like(wins) if draws is None else np.asarray(draws, dtype=np.float64)
    games = wins + wins.T + draws
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, (wins + 0.5 * draws) / games, np.nan)


def fit_ratings(players: list[str], wins: np.ndarray, draws: np.ndarray | None = None, *,
                anchor: str | None = None, anchor_rating: float = 1000.0,
                prior_draws: float = 1.0) -> dict[str, float]:
    """Bradley-Terry ratings (Elo scale) of ``players`` from ``wins[i, j]`` (games i won against j) and the
    symmetric ``draws`` (each draw half a win for each side).

    The result does not depend on the order of the players. ``anchor`` (a player name) gets exactly
    ``anchor_rating``; without one, the mean rating is ``anchor_rating``. ``prior_draws`` virtual drawn
    games per pair that played keep all-win and all-loss records finite (see the module docstring).
    """
    players = list(players)
    win_table, draw_table = _check_table(players, wins, draws)
    if anchor is not None and anchor not in players:
        raise ValueError(f"anchor {anchor!r} is not one of the players")
    if not (math.isfinite(prior_draws) and prior_draws >= 0):
        raise ValueError(f"prior_draws must be a finite number >= 0, got {prior_draws!r}")
    if not math.isfinite(anchor_rating):
        raise ValueError(f"anchor_rating must be finite, got {anchor_rating!r}")
    games = win_table + win_table.T + draw_table
    met = games > 0
    score = win_table + 0.5 * draw_table + 0.5 * prior_draws * met  # score[i, j]: i's points against j
    theta = _newton(score, score + score.T)
    elo = theta * ELO_PER_NAT
    centre = elo[players.index(anchor)] if anchor is not None else elo.mean()
    return {name: float(anchor_rating + (value - centre)) for name, value in zip(players, elo)}  # anchor: exact


def bootstrap_ratings(players: list[str], wins: np.ndarray, draws: np.ndarray | None = None, *,
                      anchor: str | None = None, samples: int = 200, seed: int = 0) -> np.ndarray:
    """Ratings [samples, players] of ``fit_ratings`` on resampled tables: each pair's games are redrawn from a
    multinomial over its observed (win, draw, loss) rates, the pair's game count kept (a parametric bootstrap).
    The spread of a column, or of the difference of two, is how much of a rating the games drawn decide."""
    players = list(players)
    win_table, draw_table = _check_table(players, wins, draws)
    rng = np.random.default_rng(seed)
    upper = [(i, j) for i in range(len(players)) for j in range(i + 1, len(players))
             if win_table[i, j] + win_table[j, i] + draw_table[i, j] > 0]
    out = np.empty((samples, len(players)))
    for k in range(samples):
        resampled_wins, resampled_draws = np.zeros_like(win_table), np.zeros_like(draw_table)
        for i, j in upper:
            outcomes = np.array([win_table[i, j], draw_table[i, j], win_table[j, i]])
            total = outcomes.sum()
            won, drawn, lost = rng.multinomial(int(round(total)), outcomes / total)
            resampled_wins[i, j], resampled_wins[j, i] = won, lost
            resampled_draws[i, j] = resampled_draws[j, i] = drawn
        ratings = fit_ratings(players, resampled_wins, resampled_draws, anchor=anchor)
        out[k] = [ratings[name] for name in players]
    return out


def _newton(score: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Maximise sum_ij score_ij log sigmoid(t_i - t_j) by damped Newton steps; each group of players
    connected by games is centred (the likelihood cannot see a common shift of a group)."""
    groups = _components(total > 0)
    gauge = np.zeros_like(total)  # sum of u u^T over groups, u = indicator / sqrt(size): pins each group's mean
    for members in groups:
        gauge[np.ix_(members, members)] = 1.0 / len(members)
    theta = np.zeros(score.shape[0])

    def objective(t: np.ndarray) -> float:
        return float(-(score * np.logaddexp(0.0, t[None, :] - t[:, None])).sum())

    current = objective(theta)
    for _ in range(_MAX_ITERS):
        gap = theta[:, None] - theta[None, :]
        p = 0.5 * (1.0 + np.tanh(0.5 * gap))  # sigmoid(gap), overflow-free
        grad = (score - total * p).sum(axis=1)
        weights = total * p * (1.0 - p)
        laplacian = np.diag(weights.sum(axis=1)) - weights  # minus the Hessian
        step = np.linalg.solve(laplacian + gauge, grad)  # grad sums to 0 per group, so step does too
        scale = 1.0
        while True:  # backtracking: never accept a step that lowers the log-likelihood
            candidate = theta + scale * step
            value = objective(candidate)
            if value >= current - 1e-12 * abs(current) or scale < 1e-6:
                break
            scale *= 0.5
        theta, current = candidate, value
        if np.max(np.abs(scale * step), initial=0.0) < _TOL:
            for members in groups:
                theta[members] -= theta[members].mean()
            return theta
    raise RuntimeError(f"Bradley-Terry fit did not converge in {_MAX_ITERS} Newton iterations (with "
                       f"prior_draws=0 a player who won or lost every game has no finite rating)")


def _components(adjacency: np.ndarray) -> list[list[int]]:
    """Connected groups of players (index lists, ascending) of a symmetric boolean adjacency matrix."""
    unseen = set(range(adjacency.shape[0]))
    groups = []
    while unseen:
        frontier = [min(unseen)]
        unseen.discard(frontier[0])
        members = []
        while frontier:
            i = frontier.pop()
            members.append(i)
            found = [int(j) for j in np.flatnonzero(adjacency[i]) if j in unseen]
            unseen.difference_update(found)
            frontier.extend(found)
        groups.append(sorted(members))
    return groups


def _check_table(players: list[str], wins: Any, draws: Any) -> tuple[np.ndarray, np.ndarray]:
    if not all(isinstance(p, str) for p in players):
        raise ValueError("players must be strings")
    if len(set(players)) != len(players):
        dupes = sorted({p for p in players if players.count(p) > 1})
        raise ValueError(f"players must be unique; repeated: {', '.join(dupes)}")
    n = len(players)
    tables = []
    for name, table in (("wins", wins), ("draws", draws)):
        if table is None:
            tables.append(np.zeros((n, n)))
            continue
        array = np.asarray(table, dtype=np.float64)
        if array.shape != (n, n):
            raise ValueError(f"{name} must have shape ({n}, {n}) for {n} players, got {array.shape}")
        if not np.all(np.isfinite(array)) or np.any(array < 0):
            raise ValueError(f"{name} must hold finite counts >= 0")
        if np.any(np.diag(array) != 0):
            raise ValueError(f"{name} must have a zero diagonal (a player does not play itself)")
        tables.append(array)
    if not np.array_equal(tables[1], tables[1].T):
        raise ValueError("draws must be symmetric: draws[i, j] = draws[j, i] = drawn games between i and j")
    return tables[0], tables[1]


def plot_elo_over_snapshots(ratings: dict[str, float], snapshot_names: list[str], path: Path,
                            baselines: dict[str, float] | None = None, errors: dict[str, float] | None = None) -> Path:
    """Line plot of the snapshots' ratings in order, with ``baselines`` (name -> rating) as dashed lines and, given
    ``errors`` (name -> ±), each snapshot's ± as an error bar."""
    missing = [name for name in snapshot_names if name not in ratings]
    if missing:
        raise ValueError(f"no rating for snapshots: {', '.join(missing)}")
    fig, canvas = _figure((max(6.0, min(16.0, 0.25 * len(snapshot_names))), 4.5))
    ax = fig.add_subplot()
    x = np.arange(len(snapshot_names))
    values = [ratings[name] for name in snapshot_names]
    if errors is not None:
        ax.errorbar(x, values, yerr=[errors.get(name, 0.0) for name in snapshot_names], marker="o", markersize=3,
                    capsize=2, elinewidth=1, label="snapshots (± bootstrap 2 sd)")
    else:
        ax.plot(x, values, marker="o", markersize=3, label="snapshots")
    for i, (name, rating) in enumerate(sorted((baselines or {}).items())):
        ax.axhline(rating, linestyle="--", linewidth=1, color=f"C{i + 1}", label=name)
    margins = [errors.get(name, 0.0) for name in snapshot_names] if errors is not None else [0.0] * len(values)
    everything = [*(v - m for v, m in zip(values, margins)), *(v + m for v, m in zip(values, margins)),
                  *(baselines or {}).values()]
    if everything:  # keep baselines off the frame's edge
        low, high = min(everything), max(everything)
        pad = 0.05 * (high - low) or 50.0
        ax.set_ylim(low - pad, high + pad)
    step = max(1, len(snapshot_names) // 20)
    ax.set_xticks(x[::step], [snapshot_names[i] for i in x[::step]], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("snapshot")
    ax.set_ylabel("Elo")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, canvas, path)


def plot_win_rate_heatmap(players: list[str], win_rate_matrix: np.ndarray, path: Path) -> Path:
    """Heatmap of win_rate_matrix[i, j] (row player's score against column player; NaN = never played)."""
    rates = np.asarray(win_rate_matrix, dtype=np.float64)
    n = len(players)
    if rates.shape != (n, n):
        raise ValueError(f"win_rate_matrix must have shape ({n}, {n}) for {n} players, got {rates.shape}")
    import matplotlib

    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")
    size = max(4.0, min(20.0, 0.45 * n + 2.5))
    fig, canvas = _figure((size + 1.0, size))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(rates), cmap=cmap, vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="row player's score rate")
    ticks = np.arange(n)
    ax.set_xticks(ticks, players, rotation=90, fontsize=7)
    ax.set_yticks(ticks, players, fontsize=7)
    ax.set_xlabel("opponent")
    ax.set_ylabel("player")
    if n <= 16:
        for i in range(n):
            for j in range(n):
                if math.isfinite(rates[i, j]):
                    ax.text(j, i, f"{rates[i, j]:.2f}", ha="center", va="center", fontsize=7)
    return _save(fig, canvas, path)


def _figure(size: tuple[float, float]) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, FigureCanvasAgg(fig)


def _save(fig: Any, canvas: Any, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.print_png(str(path))
    return path


def write_tables(ratings: dict[str, float], results: MatchResults, out_dir: Path,
                 spread: dict[str, float] | None = None) -> tuple[Path, Path]:
    """Write ``elo.json`` (ratings, results matrices, score rates) and ``elo.csv`` (one row per player,
    best first: rank, player, elo, games, wins, draws, losses, score, and with ``spread`` (name -> ± of the
    rating, 2 bootstrap standard deviations in ``evaluation.elo``) a last column ``elo_2sd``) into ``out_dir``;
    returns both paths."""
    players = list(results.players)
    if set(ratings) != set(players):
        raise ValueError("ratings and results must name the same players; differ in: "
                         + ", ".join(sorted(set(ratings) ^ set(players))))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    draws = results.draws if results.draws is not None else np.zeros_like(results.wins)
    rates = results.win_rate()
    doc = {
        "ratings": {name: ratings[name] for name in players},
        "players": players,
        "wins": results.wins.tolist(),
        "draws": draws.tolist(),
        "win_rate": [[None if math.isnan(v) else float(v) for v in row] for row in rates],
    }
    json_path = out_dir / "elo.json"
    json_path.write_text(json.dumps(doc, indent=1))
    games, won, drawn = results.games().sum(axis=1), results.wins.sum(axis=1), draws.sum(axis=1)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["rank", "player", "elo", "games", "wins", "draws", "losses", "score",
                     *([] if spread is None else ["elo_2sd"])])
    order = sorted(range(len(players)), key=lambda i: (-ratings[players[i]], players[i]))
    for rank, i in enumerate(order, start=1):
        score = f"{(won[i] + 0.5 * drawn[i]) / games[i]:.4f}" if games[i] > 0 else ""
        writer.writerow([rank, players[i], f"{ratings[players[i]]:.1f}", _num(games[i]), _num(won[i]),
                         _num(drawn[i]), _num(games[i] - won[i] - drawn[i]), score,
                         *([] if spread is None else [f"{spread[players[i]]:.1f}"])])
    csv_path = out_dir / "elo.csv"
    csv_path.write_text(buffer.getvalue())
    return json_path, csv_path


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
