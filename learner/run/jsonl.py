"""JSON-lines files the learner and its tools read back (metrics.jsonl, evaluation.jsonl): one JSON object a line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def json_records(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines`` (one per line, as metrics.jsonl and evaluation.jsonl hold them); a line
    that is not a JSON object (torn, or hand-edited) is skipped."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
