"""What makes a checkpoint trustworthy: its manifest, finite weights and a trainer state that makes sense.

``manifest.json``, the last file written into a checkpoint, holds the size and sha256 of every other file in it.
Loading checks it first (a missing, cut or changed file is damage), then that every float tensor is finite and
that trainer_state.json's counters are integers >= 0, its elapsed time a finite number >= 0 and its recent
returns a list of finite numbers. Each failure is a ``CheckpointDamaged`` naming the file and the reason.
Checkpoints written before manifests existed are read without the checksums (the other checks still apply).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
COUNTERS = ("update", "policy_version", "env_steps", "agent_steps", "episodes")
"""trainer_state.json's integer fields (each >= 0)."""
STATE_FIELDS = (*COUNTERS, "elapsed_s", "recent_returns")


class CheckpointDamaged(ValueError):
    """A checkpoint file is missing, cut, changed or holds values a run cannot continue from."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason


def file_digest(path: Path) -> dict[str, Any]:
    """The manifest entry of one file: its size in bytes and its sha256 (hex)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def write_manifest(directory: Path) -> Path:
    """Write ``directory``/manifest.json listing every other file there (call it after the last of them)."""
    files = {path.name: file_digest(path) for path in sorted(directory.iterdir()) if path.name != MANIFEST}
    path = directory / MANIFEST
    path.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1) + "\n")
    return path


def verify_manifest(directory: Path) -> bool:
    """Check every file against ``directory``'s manifest (CheckpointDamaged on the first that differs); False for a
    checkpoint without a manifest (written by older code), True when all match."""
    path = directory / MANIFEST
    if not path.exists():
        return False
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        entries = [(str(name), int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CheckpointDamaged(MANIFEST, f"unreadable ({type(err).__name__})") from err
    if not entries:
        raise CheckpointDamaged(MANIFEST, "lists no files")
    for name, size, sha256 in entries:
        file = directory / name
        if not file.is_file():
            raise CheckpointDamaged(name, "missing")
        found = file_digest(file)
        if found["size"] != size:
            raise CheckpointDamaged(name, f"{found['size']} bytes, the manifest says {size} (cut short?)")
        if found["sha256"] != sha256:
            raise CheckpointDamaged(name, "sha256 mismatch")
    return True


def check_finite(file: str, arrays: dict[str, np.ndarray]) -> None:
    """CheckpointDamaged naming the first float tensor of ``file`` that holds NaN or inf."""
    for key, array in arrays.items():
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            raise CheckpointDamaged(file, f"tensor {key!r} holds NaN or inf values")


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file, CheckpointDamaged when it is missing or not JSON."""
    if not path.is_file():
        raise CheckpointDamaged(path.name, "missing")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointDamaged(path.name, "not valid JSON (cut short?)") from err


def checked_trainer_state(raw: Any, file: str) -> dict[str, Any]:
    """trainer_state.json's fields after checking them (CheckpointDamaged naming the first bad one)."""
    if not isinstance(raw, dict):
        raise CheckpointDamaged(file, f"expected a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(STATE_FIELDS))
    missing = [name for name in STATE_FIELDS if name not in raw]
    if unknown or missing:
        raise CheckpointDamaged(file, f"fields missing: {missing}, unknown: {unknown}")
    for name in COUNTERS:
        value = raw[name]
        if not _is_int(value) or value < 0:
            raise CheckpointDamaged(file, f"{name!r} is {value!r}, must be an integer >= 0")
    elapsed = raw["elapsed_s"]
    if not _is_number(elapsed) or not math.isfinite(elapsed) or elapsed < 0:
        raise CheckpointDamaged(file, f"'elapsed_s' is {elapsed!r}, must be a finite number >= 0")
    returns = raw["recent_returns"]
    if not isinstance(returns, list) or not all(_is_number(x) and math.isfinite(x) for x in returns):
        raise CheckpointDamaged(file, "'recent_returns' must be a list of finite numbers")
    return {**raw, "elapsed_s": float(elapsed), "recent_returns": [float(x) for x in returns]}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
