"""python -m evaluation.plot's messages (issue 32): a run with no update recorded yet, and where the PNG went."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evaluation.plot import NO_UPDATES_EXIT, main
from tests.test_plot import PNG_MAGIC, three_runs

PROG = "python -m evaluation.plot"


def started_run(root: Path, name: str, *, metrics: str | None) -> Path:
    """A run directory whose learner has not finished an update: a config.yaml and ``metrics`` (None: no file)."""
    directory = root / name
    directory.mkdir()
    (directory / "config.yaml").write_text(yaml.safe_dump({"run": {"name": name, "seed": 1}}))
    if metrics is not None:
        (directory / "metrics.jsonl").write_text(metrics)
    return directory


@pytest.mark.parametrize("metrics", ["", '{"update": 1, "agent_st'], ids=["empty", "torn-first-line"])
def test_an_empty_metrics_file_says_no_updates_yet(metrics: str, tmp_path: Path, capsys) -> None:
    run = started_run(tmp_path, "fresh", metrics=metrics)
    out = tmp_path / "p.png"
    assert main([str(run), "--out", str(out)]) == NO_UPDATES_EXIT == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [f"{PROG}: no updates recorded yet in {run / 'metrics.jsonl'}"]
    assert not out.exists()


def test_a_run_without_metrics_file_yet_says_no_updates_yet(tmp_path: Path, capsys) -> None:
    run = started_run(tmp_path, "fresh", metrics=None)
    assert main([str(run), "--out", str(tmp_path / "p.png")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"{PROG}: no updates recorded yet in {run} (it has a config.yaml but no metrics.jsonl)"]


def test_one_empty_run_among_others_stops_the_plot(tmp_path: Path, capsys) -> None:
    runs = [*three_runs(tmp_path), started_run(tmp_path, "fresh", metrics="")]
    assert main([*map(str, runs), "--out", str(tmp_path / "p.png")]) == 1
    assert capsys.readouterr().err.strip() == f"{PROG}: no updates recorded yet in {runs[-1] / 'metrics.jsonl'}"
    assert not (tmp_path / "p.png").exists()


def test_after_writing_one_line_names_the_png(tmp_path: Path, capsys, monkeypatch) -> None:
    runs = three_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main([*map(str, runs), "--out", "plots/curve.png"]) == 0
    captured = capsys.readouterr()
    png = tmp_path / "plots" / "curve.png"
    assert captured.out.splitlines() == [f"{PROG}: wrote {png} (3 runs, 2 curves)"]
    assert captured.err == ""
    assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.integration
def test_the_command_exits_1_for_a_run_with_no_updates(tmp_path: Path) -> None:
    run = started_run(tmp_path, "fresh", metrics="")
    done = subprocess.run([sys.executable, "-m", "evaluation.plot", str(run)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                          timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == f"{PROG}: no updates recorded yet in {run / 'metrics.jsonl'}"
