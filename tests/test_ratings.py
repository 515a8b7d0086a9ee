"""Bradley-Terry Elo: recovery of known ratings, order independence, finite extremes, plots and tables."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from evaluation.ratings import (MatchResults, bootstrap_ratings, fit_ratings, plot_elo_over_snapshots,
                                plot_win_rate_heatmap, win_probability, win_rate_matrix, write_tables)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TRUE = np.array([700.0, 900.0, 1000.0, 1100.0, 1250.0, 1500.0])
NAMES = [f"snap_{i}" for i in range(len(TRUE))]


def simulate(ratings: np.ndarray, games: int, seed: int, with_draws: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Every pair plays ``games`` games; draws (when on) keep each side's expected score at win_probability."""
    rng = np.random.default_rng(seed)
    n = len(ratings)
    wins, draws = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            p = float(win_probability(ratings[i], ratings[j]))
            d = 0.5 * min(p, 1 - p) if with_draws else 0.0
            won, lost, drawn = rng.multinomial(games, [p - d / 2, 1 - p - d / 2, d])
            wins[i, j], wins[j, i], draws[i, j], draws[j, i] = won, lost, drawn, drawn
    return wins, draws


def test_win_probability():
    assert win_probability(1000, 1000) == 0.5
    assert win_probability(1400, 1000) == pytest.approx(10 / 11)
    assert win_probability(1000, 1400) == pytest.approx(1 / 11)
    np.testing.assert_allclose(win_probability(np.array([1000.0, 1400.0]), 1000.0), [0.5, 10 / 11])
    assert win_probability(0.0, 1e6) == 0.0  # no overflow error for absurd gaps


@pytest.mark.parametrize("with_draws", [True, False])
def test_recovers_known_ratings(with_draws):
    wins, draws = simulate(TRUE, 400, seed=3, with_draws=with_draws)
    fitted = fit_ratings(NAMES, wins, draws if with_draws else None, anchor_rating=float(TRUE.mean()))
    errors = np.array([fitted[name] for name in NAMES]) - TRUE
    # Each rating's standard error is ~20 Elo here (2000 games per player).
    assert np.max(np.abs(errors)) < 40, errors
    assert np.mean([fitted[name] for name in NAMES]) == pytest.approx(TRUE.mean())
    anchored = fit_ratings(NAMES, wins, draws, anchor="snap_0", anchor_rating=700.0)
    assert anchored["snap_0"] == 700.0
    gaps = [anchored[name] - fitted[name] for name in NAMES]  # anchoring only shifts
    np.testing.assert_allclose(gaps, gaps[0], atol=1e-8)


def test_exact_for_a_two_player_table():
    """Two players, 30-10 (+ the default virtual draw): the gap is 400 * log10(30.5 / 10.5)."""
    wins = np.array([[0, 30], [10, 0]])
    fitted = fit_ratings(["a", "b"], wins, anchor="b", anchor_rating=0.0)
    assert fitted["a"] == pytest.approx(400 * np.log10(30.5 / 10.5), abs=1e-8)
    unregularised = fit_ratings(["a", "b"], wins, anchor="b", anchor_rating=0.0, prior_draws=0.0)
    assert unregularised["a"] == pytest.approx(400 * np.log10(3.0), abs=1e-8)


def test_bootstrap_spread_of_a_two_player_gap_matches_a_numpy_reference():
    """Two players, 140-20-40 in 200 games: the bootstrap's spread of the gap against the closed form of the gap
    (400 * log10 of the two scores, each with the virtual half draw) on independent multinomial redraws."""
    wins, draws = np.array([[0, 140], [40, 0]]), np.array([[0, 20], [20, 0]])
    samples = bootstrap_ratings(["a", "b"], wins, draws, anchor="b", samples=400, seed=1)
    assert samples.shape == (400, 2) and np.all(samples[:, 1] == 1000.0)  # the anchor stays put
    won, drawn, lost = np.random.default_rng(2).multinomial(200, [0.7, 0.1, 0.2], size=20000).T
    reference = 400 * np.log10((won + drawn / 2 + 0.5) / (lost + drawn / 2 + 0.5))
    gap = samples[:, 0] - samples[:, 1]
    assert gap.std() == pytest.approx(reference.std(), rel=0.15)
    assert gap.mean() == pytest.approx(reference.mean(), abs=3 * reference.std() / np.sqrt(400))
    again = bootstrap_ratings(["a", "b"], wins, draws, anchor="b", samples=400, seed=1)
    assert np.array_equal(samples, again)  # seeded


def test_bootstrap_spread_shrinks_with_more_games():
    spreads = []
    for games in (50, 800):
        wins, draws = simulate(TRUE[:4], games, seed=3)
        samples = bootstrap_ratings(NAMES[:4], wins, draws, anchor=NAMES[0], samples=60, seed=0)
        spreads.append((samples[:, 3] - samples[:, 2]).std())
    assert spreads[1] < spreads[0] / 2  # ~ 1 / sqrt(games): a factor 4 expected


def test_order_independent():
    wins, draws = simulate(TRUE, 50, seed=5)
    base = fit_ratings(NAMES, wins, draws)
    rng = np.random.default_rng(0)
    for _ in range(5):
        perm = rng.permutation(len(NAMES))
        permuted = fit_ratings([NAMES[i] for i in perm], wins[np.ix_(perm, perm)], draws[np.ix_(perm, perm)])
        for name in NAMES:
            assert permuted[name] == pytest.approx(base[name], abs=1e-6)


def test_all_win_and_all_loss_players_are_finite():
    wins, draws = simulate(TRUE[:4], 40, seed=9)
    n = 5  # add a champion who won every game and keep the rest
    table = np.zeros((n, n))
    table[:4, :4] = wins
    table[4, :4] = 40
    big_draws = np.zeros((n, n))
    big_draws[:4, :4] = draws
    names = [*NAMES[:4], "champion"]
    fitted = fit_ratings(names, table, big_draws)
    assert all(np.isfinite(list(fitted.values())))
    assert max(fitted, key=fitted.get) == "champion"
    assert fitted["champion"] - max(fitted[name] for name in NAMES[:4]) < 1500
    # and a player who lost everything is finite and at the bottom
    fitted = fit_ratings(names, table.T.copy(), big_draws)
    assert all(np.isfinite(list(fitted.values()))) and min(fitted, key=fitted.get) == "champion"


def test_disconnected_groups_and_players_without_games():
    wins = np.zeros((4, 4))
    wins[0, 1], wins[1, 0] = 8, 2  # a and b played; c and d played; nobody else met
    wins[2, 3], wins[3, 2] = 5, 5
    fitted = fit_ratings(["a", "b", "c", "d"], wins)
    assert fitted["a"] > fitted["b"] and fitted["c"] == pytest.approx(fitted["d"])
    assert fitted["a"] + fitted["b"] == pytest.approx(2000.0) and fitted["c"] == pytest.approx(1000.0)
    alone = fit_ratings(["x", "y"], np.zeros((2, 2)))
    assert alone == {"x": 1000.0, "y": 1000.0}


@pytest.mark.parametrize("kwargs,message", [
    (dict(players=["a", "a"]), "players must be unique"),
    (dict(wins=np.zeros((3, 3))), r"wins must have shape \(2, 2\)"),
    (dict(wins=np.array([[0, -1], [1, 0]])), "finite counts >= 0"),
    (dict(wins=np.array([[1, 0], [0, 0]])), "zero diagonal"),
    (dict(draws=np.array([[0, 2], [1, 0]])), "draws must be symmetric"),
    (dict(anchor="zed"), "anchor 'zed' is not one of the players"),
    (dict(prior_draws=-1.0), "prior_draws must be"),
])
def test_argument_errors(kwargs, message):
    args = dict(players=["a", "b"], wins=np.array([[0, 3], [1, 0]]), draws=None) | kwargs
    with pytest.raises(ValueError, match=message):
        fit_ratings(args.pop("players"), args.pop("wins"), args.pop("draws"), **args)


def test_plots_are_png(tmp_path):
    wins, draws = simulate(TRUE, 20, seed=1)
    ratings = fit_ratings(NAMES, wins, draws)
    elo_png = plot_elo_over_snapshots(ratings, NAMES, tmp_path / "plots" / "elo.png",
                                      baselines={"random": 600.0, "scripted": 1200.0})
    heat_png = plot_win_rate_heatmap(NAMES, win_rate_matrix(wins, draws), tmp_path / "heatmap.png")
    for path in (elo_png, heat_png):
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    rates = win_rate_matrix(wins, draws)
    rates[0, 1] = rates[1, 0] = np.nan  # never played: drawn grey, not an error
    plot_win_rate_heatmap(NAMES, rates, tmp_path / "gaps.png")
    assert (tmp_path / "gaps.png").read_bytes()[:8] == PNG_SIGNATURE
    plot_elo_over_snapshots(ratings, NAMES, tmp_path / "no_baselines.png", None)
    with pytest.raises(ValueError, match="no rating for snapshots: ghost"):
        plot_elo_over_snapshots(ratings, [*NAMES, "ghost"], tmp_path / "x.png", None)
    with pytest.raises(ValueError, match="must have shape"):
        plot_win_rate_heatmap(NAMES, np.zeros((2, 2)), tmp_path / "y.png")


def test_win_rate_matrix_and_results():
    results = MatchResults(players=("a", "b", "c"), wins=np.array([[0, 3, 0], [1, 0, 0], [0, 0, 0]]),
                           draws=np.array([[0, 2, 0], [2, 0, 0], [0, 0, 0]]))
    rates = results.win_rate()
    assert rates[0, 1] == pytest.approx(4 / 6) and rates[1, 0] == pytest.approx(2 / 6)
    assert np.isnan(rates[0, 2]) and np.isnan(rates[0, 0])
    np.testing.assert_array_equal(results.games()[0], [0, 6, 0])
    with pytest.raises(ValueError, match="draws must be symmetric"):
        MatchResults(players=("a", "b"), wins=np.zeros((2, 2)), draws=np.array([[0, 1], [0, 0]]))


def test_tables_parse_back(tmp_path):
    wins, draws = simulate(TRUE, 30, seed=2)
    results = MatchResults(players=tuple(NAMES), wins=wins, draws=draws)
    ratings = fit_ratings(NAMES, wins, draws)
    json_path, csv_path = write_tables(ratings, results, tmp_path / "eval")
    doc = json.loads(json_path.read_text())
    assert doc["players"] == NAMES
    assert doc["ratings"] == pytest.approx(ratings)
    np.testing.assert_array_equal(doc["wins"], wins)
    np.testing.assert_array_equal(doc["draws"], draws)
    assert doc["win_rate"][0][0] is None and doc["win_rate"][0][1] == pytest.approx(results.win_rate()[0, 1])
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [row["player"] for row in rows] == sorted(NAMES, key=lambda n: -ratings[n])
    assert [int(row["rank"]) for row in rows] == list(range(1, len(NAMES) + 1))
    for row in rows:
        i = NAMES.index(row["player"])
        assert float(row["elo"]) == pytest.approx(ratings[row["player"]], abs=0.05)
        assert int(row["games"]) == 30 * (len(NAMES) - 1)
        assert int(row["wins"]) + int(row["draws"]) + int(row["losses"]) == int(row["games"])
        assert int(row["wins"]) == wins[i].sum()
        assert float(row["score"]) == pytest.approx((wins[i].sum() + draws[i].sum() / 2) / int(row["games"]),
                                                    abs=1e-4)
    with pytest.raises(ValueError, match="same players"):
        write_tables({"other": 1.0}, results, tmp_path)
