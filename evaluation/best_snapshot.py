"""The best snapshot a run's evaluation during training kept: ``<run-dir>/best/`` (evaluation/during_training.py).

``best/`` holds the snapshot's weights as ``<sha256>.safetensors`` (the pool file's bytes; load them like a pool
snapshot, e.g. ``safetensors.numpy.load_file``) and ``best.json``: update, policy version, the weights file's name,
the score against each baseline and their mean, games per baseline and the source pool snapshot. Both are written
atomically (temp file, fsync, rename), the weights first, so ``best.json`` never names a file that is not there;
older weights files are removed after.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from learner.run.jsonl import json_records
from learner.run.atomic import atomic_write_bytes, atomic_write_text
from learner.pool.store import Snapshot

BEST_DIR = "best"
"""The folder of the kept best snapshot, in the run directory."""
BEST_NAME = "best.json"
"""The best snapshot's description, in BEST_DIR."""


@dataclass(frozen=True, kw_only=True)
class KeptBest:
    """A snapshot that was (or is) the kept best."""

    update: int
    """Learner update of the snapshot."""
    policy_version: int
    """Its policy version."""
    hash: str
    """sha256 of its weights in the pool (pool/weights/<hash>.safetensors)."""


def write_best(best_dir: Path, snapshot: Snapshot, weights: bytes, *, scores: dict[str, float],
               games: dict[str, int]) -> dict:
    """Keep ``snapshot`` (its safetensors bytes ``weights``, its score and games per baseline) as the best: the
    weights file, then best.json (both atomic), then the older weights files go; returns the best.json document."""
    best_dir.mkdir(parents=True, exist_ok=True)
    weights_name = f"{snapshot.hash}.safetensors"
    atomic_write_bytes(best_dir / weights_name, weights)
    doc = {"update": snapshot.update, "policy_version": snapshot.policy_version, "weights": weights_name,
           "scores": scores, "mean_score": sum(scores.values()) / len(scores), "games": games,
           "source": {"pool_index": snapshot.index, "hash": snapshot.hash,
                      "path": f"pool/weights/{snapshot.hash}.safetensors"}}
    atomic_write_text(best_dir / BEST_NAME, json.dumps(doc, indent=1) + "\n")
    for old in best_dir.glob("*.safetensors"):
        if old.name != weights_name:
            old.unlink(missing_ok=True)
    return doc


def read_best(run_dir: Path) -> dict | None:
    """The run's ``best/best.json`` document, None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((run_dir / BEST_DIR / BEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def kept_best_lineage(results_path: Path, best: dict | None = None) -> list[KeptBest]:
    """Every snapshot that became the kept best, oldest first: each evaluation.jsonl line (``results_path``) whose
    own update is its ``best_update``, then ``best`` (best.json's document) if it is newer than all of them (a
    stop between writing best/ and the line); [] when there is neither."""
    try:
        records = json_records(results_path.read_text(errors="replace").splitlines())
    except OSError:
        records = []
    lineage: dict[int, KeptBest] = {}
    for r in records:
        update, digest = r.get("update"), r.get("hash")
        if isinstance(update, int) and update == r.get("best_update") and isinstance(digest, str):
            lineage.setdefault(update, KeptBest(update=update, policy_version=_version(r), hash=digest))
    kept = list(lineage.values())
    if best is not None and isinstance(best.get("update"), int) and all(k.update < best["update"] for k in kept):
        source = best.get("source") if isinstance(best.get("source"), dict) else {}
        if isinstance(source.get("hash"), str):
            kept.append(KeptBest(update=best["update"], policy_version=_version(best), hash=source["hash"]))
    return kept


def _version(doc: dict) -> int:
    """A document's policy_version, 0 when it has none (or not an integer)."""
    version = doc.get("policy_version")
    return version if isinstance(version, int) else 0
