"""MetricsLog's TensorBoard scalars (read back with tensorboard's EventAccumulator, purged on resume) and the
run provenance files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from learner.monitor.metrics_log import MetricsLog
from learner.run.run_record import write_run_record


def record(update: int, value: float) -> dict:
    """A few of the learner's keys, plus a nested dict and a None."""
    return {"update": update, "agent_steps": 100 * update, "sps": 10.0, "episode_return_mean": value,
            "policy_lag_mean": 1.0, "policy_loss": 0.1, "value_loss": 0.2, "entropy": 0.3, "approx_kl": 0.01,
            "clipfrac": 0.1, "explained_variance": 0.5, "win_rate": None,
            "messages_dropped_by_reason": {"stale": update, "bad_rows": 0}}


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_records_become_tensorboard_scalars_at_agent_steps(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for update in (1, 2, 3):
        log.write(record(update, 10.0 * update))
    log.close()
    board = tmp_path / "tensorboard"
    assert scalars(board, "episode_return_mean") == [(100, 10.0), (200, 20.0), (300, 30.0)]
    assert scalars(board, "messages_dropped_by_reason/stale") == [(100, 1.0), (200, 2.0), (300, 3.0)]
    accumulator = EventAccumulator(str(board))
    accumulator.Reload()
    assert "win_rate" not in accumulator.Tags()["scalars"]


def test_resume_purges_the_events_after_the_checkpoint(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for update in (1, 2, 3, 4):
        log.write(record(update, 10.0 * update))
    log.close()
    resumed = MetricsLog(tmp_path / "metrics.jsonl", resumed_at_update=2)
    for update in (3, 4, 5):
        resumed.write(record(update, -1.0 * update))
    resumed.close()
    assert scalars(tmp_path / "tensorboard", "episode_return_mean") == [
        (100, 10.0), (200, 20.0), (300, -3.0), (400, -4.0), (500, -5.0)]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1, 2, 3, 4, 5]


def test_run_record_writes_the_provenance_files(tmp_path: Path, capsys) -> None:
    copy = write_run_record(tmp_path, ["python", "-m", "learner", "--run-dir", "runs/x y"])
    try:
        print("a console line")
    finally:
        copy.close()
    assert (tmp_path / "command.txt").read_text() == "python -m learner --run-dir 'runs/x y'\n"
    git = (tmp_path / "git.txt").read_text()
    assert git.startswith("commit ") or git == "not a git checkout\n"
    versions = json.loads((tmp_path / "versions.json").read_text())
    assert set(versions) == {"python", "torch", "numpy", "pyzmq", "sluice"} and versions["torch"]
    assert (tmp_path / "console.log").read_text() == "a console line\n"
    assert capsys.readouterr().out == "a console line\n"
    assert sys.stdout is not None and not hasattr(sys.stdout, "copy")
