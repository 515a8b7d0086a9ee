"""python -m evaluation.elo --bootstrap N (issue 32): each rating's ± (2 bootstrap standard deviations) in the
table, elo.json, elo.csv and the plot; 0 skips it; a negative N is an error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from evaluation import elo
from evaluation.ratings import MatchResults, bootstrap_ratings
from tests.test_elo import make_run

FAST = ["--episodes", "20", "--window-size", "1", "--baselines", "random,one_ply"]
ROW = re.compile(r"^\s+(\d+)  (\S+)\s+(\S+)\s+(\d+\.\d)\s+±(\d+\.\d)\s+(\d+)\s+(\S+)$")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("elo-bootstrap") / "run", 2)


def test_default_bootstrap_shows_a_pm_in_the_table_json_and_csv(run_dir: Path, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "out"
    assert elo.main(["--run-dir", str(run_dir), *FAST, "--output-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank"))
    assert lines[header].split() == ["rank", "player", "update", "elo", "±2sd", "games", "score"]
    rows = [ROW.match(line) for line in lines[header + 1:header + 5]]
    assert all(rows), lines
    doc = json.loads((out_dir / "elo.json").read_text())
    uncertainty = doc["uncertainty"]
    assert uncertainty["samples"] == elo.DEFAULT_BOOTSTRAP == 200 and doc["settings"]["bootstrap"] == 200
    assert uncertainty["shown"] == "±2 standard deviations" and uncertainty["seed"] == 0
    assert uncertainty["method"] == "parametric bootstrap (evaluation.ratings.bootstrap_ratings)"
    for row in rows:
        name, pm = row.group(2), float(row.group(5))
        assert pm == pytest.approx(uncertainty["pm"][name], abs=0.05)
        assert uncertainty["pm"][name] == pytest.approx(2 * uncertainty["sd"][name])
        assert uncertainty["p2.5"][name] <= uncertainty["p97.5"][name]
    assert uncertainty["pm"]["random"] == 0.0 and uncertainty["pm"]["one_ply"] > 0
    assert [s["elo_pm"] for s in doc["snapshots"]] == [uncertainty["pm"][s["name"]] for s in doc["snapshots"]]
    assert lines[header + 5] == ("±2sd: 2 standard deviations of each rating over 200 bootstrap resamples of the "
                                 "games (about a 95% interval; random is the anchor, ±0)")
    assert "bootstrap: 200 resampled tournaments (" in captured.err
    csv_rows = [line.split(",") for line in (out_dir / "elo.csv").read_text().splitlines()]
    assert csv_rows[0] == ["rank", "player", "elo", "games", "wins", "draws", "losses", "score", "elo_2sd"]
    assert {row[1]: float(row[-1]) for row in csv_rows[1:]} == pytest.approx(uncertainty["pm"], abs=0.05)
    assert (out_dir / "elo_over_snapshots.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pm_is_the_spread_of_bootstrap_ratings_with_the_run_seed(run_dir: Path, tmp_path: Path) -> None:
    doc = elo.run(elo.build_parser().parse_args(["--run-dir", str(run_dir), *FAST, "--bootstrap", "50", "--seed",
                                                 "3", "--output-dir", str(tmp_path / "a")]))
    players = doc["players"]
    resampled = bootstrap_ratings(players, np.array(doc["wins"]), np.array(doc["draws"]), anchor="random",
                                  samples=50, seed=3)
    assert doc["uncertainty"]["samples"] == 50 and doc["uncertainty"]["seed"] == 3
    assert [doc["uncertainty"]["sd"][p] for p in players] == pytest.approx(resampled.std(axis=0).tolist())
    assert [doc["uncertainty"]["p2.5"][p] for p in players] == pytest.approx(
        np.percentile(resampled, 2.5, axis=0).tolist())


def test_bootstrap_0_skips_it_and_leaves_the_old_outputs(run_dir: Path, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "out"
    assert elo.main(["--run-dir", str(run_dir), *FAST, "--bootstrap", "0", "--output-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    assert "±" not in captured.out and "bootstrap" not in captured.err
    header = next(line for line in captured.out.splitlines() if line.lstrip().startswith("rank"))
    assert header.split() == ["rank", "player", "update", "elo", "games", "score"]
    doc = json.loads((out_dir / "elo.json").read_text())
    assert doc["uncertainty"] is None and doc["settings"]["bootstrap"] == 0
    assert all("elo_pm" not in s for s in doc["snapshots"])
    assert (out_dir / "elo.csv").read_text().splitlines()[0] == "rank,player,elo,games,wins,draws,losses,score"


def test_a_negative_bootstrap_is_an_error(run_dir: Path, capsys) -> None:
    assert elo.main(["--run-dir", str(run_dir), "--bootstrap", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m evaluation.elo: error: --bootstrap must be >= 0 (0 skips the bootstrap), got -1"]


def test_a_bootstrap_that_is_not_a_number_is_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        elo.main(["--run-dir", "x", "--bootstrap", "many"])
    assert exc.value.code == 2
    assert "python -m evaluation.elo: error: argument --bootstrap: invalid int value: 'many'" in capsys.readouterr().err


def test_format_table_columns() -> None:
    results = MatchResults(players=("random", "one_ply"), wins=np.array([[0, 1], [9, 0]]))
    ratings = {"random": 1000.0, "one_ply": 1300.25}
    spread = elo.Spread(samples=10, sd={"random": 0.0, "one_ply": 40.04}, low={"random": 1000.0, "one_ply": 1220.0},
                        high={"random": 1000.0, "one_ply": 1380.0})
    assert elo.format_table(ratings, results, [], [], spread=spread).splitlines() == [
        "rank  player    update      elo     ±2sd   games  score",
        "   1  one_ply        -   1300.2    ±80.1      10  0.900",
        "   2  random         -   1000.0     ±0.0      10  0.100"]
    assert elo.format_table(ratings, results, [], []).splitlines()[0] == (
        "rank  player    update      elo   games  score")
