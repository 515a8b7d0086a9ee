"""python -m evaluation.plot: grouping runs by config, mean and spread over seeds, the PNG, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from evaluation.plot import group_curve, group_runs, load_run, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(root: Path, name: str, *, seed: int, lr: float, returns: list[float]) -> Path:
    """A run directory with a config.yaml and one metrics.jsonl record per return (1000 agent steps apart)."""
    directory = root / name
    directory.mkdir()
    config = {"run": {"name": name, "seed": seed}, "trainer": {"learning_rate": lr}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"update": i + 1, "agent_steps": 1000 * (i + 1), "elapsed_s": 0.5 * (i + 1),
                "episode_return_mean": value, "entropy": 0.5} for i, value in enumerate(returns)]
    records[0]["episode_return_mean"] = None
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def three_runs(root: Path) -> list[Path]:
    return [fake_run(root, "a", seed=1, lr=3e-4, returns=[0, 10, 20, 30]),
            fake_run(root, "b", seed=2, lr=3e-4, returns=[0, 30, 40, 50]),
            fake_run(root, "c", seed=1, lr=1e-3, returns=[0, 5, 5, 5])]


def test_runs_differing_only_in_seed_and_name_are_one_group(tmp_path: Path) -> None:
    runs = [load_run(d, metric="episode_return_mean", x_axis="agent_steps") for d in three_runs(tmp_path)]
    groups = group_runs(runs)
    assert [[run.directory.name for run in group] for group in groups] == [["a", "b"], ["c"]]


def test_group_curve_is_the_mean_with_a_min_max_or_std_band(tmp_path: Path) -> None:
    runs = [load_run(d, metric="episode_return_mean", x_axis="agent_steps") for d in three_runs(tmp_path)[:2]]
    minmax = group_curve(runs, band="minmax")
    assert minmax.x[0] == 2000 and minmax.x[-1] == 4000  # the None of update 1 is skipped
    assert np.allclose([minmax.mean[0], minmax.mean[-1]], [20, 40])
    assert np.allclose([minmax.low[0], minmax.high[0]], [10, 30])
    std = group_curve(runs, band="std")
    assert np.allclose([std.low[-1], std.high[-1]], [30, 50])
    single = group_curve(runs[:1], band="minmax")
    assert single.low is None and list(single.mean) == [10, 20, 30]


def test_cli_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "out" / "plot.png"
    assert main([*map(str, three_runs(tmp_path)), "--x", "elapsed_s", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.integration
def test_a_directory_without_metrics_is_an_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "evaluation.plot", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2
    expected = f"python -m evaluation.plot: error: {tmp_path} has no metrics.jsonl (is it a run directory?)"
    assert result.stderr.strip() == expected


def test_an_unknown_metric_lists_the_available_ones(tmp_path: Path, capsys) -> None:
    run = three_runs(tmp_path)[0]
    assert main([str(run), "--metric", "nope", "--out", str(tmp_path / "p.png")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("python -m evaluation.plot: error: unknown metric 'nope'")
    assert error.endswith("available: agent_steps, elapsed_s, entropy, episode_return_mean, update")
    assert not (tmp_path / "p.png").exists()
