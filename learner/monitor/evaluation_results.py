"""Reading ``<run-dir>/evaluation.jsonl`` as the evaluator child process appends to it (evaluation/during_training.py).

``ResultsTail`` keeps its byte offset and returns only whole new lines: a last line without its newline is being
written and is read on a later call. It starts at the file's end, so a resumed run reports only new evaluations.
``evaluation_line`` is the console line of one evaluation, ``evaluation_metrics`` its figures for metrics.jsonl
(and TensorBoard, which takes every numeric key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from learner.run.jsonl import json_records

EVALUATION_RESULTS = "evaluation.jsonl"
"""The evaluator's results file, one JSON object per evaluation, in the run directory."""


class ResultsTail:
    """Whole new lines of a JSON-lines file that another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.is_file() else 0
        """Bytes already read (or skipped: what the file held when the tail was made)."""

    def read_new(self) -> list[dict[str, Any]]:
        """The objects of the whole lines appended since the last call (lines that are not a JSON object are
        skipped); a partial last line stays for the next call."""
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return json_records(data[:end].splitlines())


def baseline_scores(record: dict[str, Any]) -> dict[str, float]:
    """Baseline name -> the snapshot's score in one evaluation record."""
    return {name: float(result["score"]) for name, result in record.get("baselines", {}).items()}


def evaluation_line(record: dict[str, Any]) -> str:
    """The console line of one evaluation, e.g. ``eval upd 250: one_ply 0.83, negamax-2 0.41 (best: upd 250)``."""
    scores = ", ".join(f"{name} {score:.2f}" for name, score in baseline_scores(record).items())
    return f"eval upd {record.get('update')}: {scores} (best: upd {record.get('best_update')})"


def evaluation_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The figures one evaluation adds to the update's metrics record: ``eval_score_<baseline>`` and the best
    snapshot's update, ``eval_best_update``."""
    metrics: dict[str, float] = {f"eval_score_{name}": score for name, score in baseline_scores(record).items()}
    if isinstance(record.get("best_update"), int):
        metrics["eval_best_update"] = record["best_update"]
    return metrics
