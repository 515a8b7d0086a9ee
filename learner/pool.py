"""Self-play opponent pool: per-env geometric opponent sampling (seeds/002) and the snapshot store.

Sampling. Every ``snapshot_interval`` updates the learner adds its current weights to the pool; snapshot 0
is the oldest. Each env draws its own opponent independently:

* with probability ``exploration`` (eps), uniformly from ALL snapshots, but only once there is history
  beyond the pool (more than ``pool_size`` snapshots; until then the geometric draw is used always);
* otherwise from the newest ``K = min(pool_size, num_snapshots)`` snapshots with ``P(age = k) ∝ beta**k``,
  where age ``k = 0`` is the newest snapshot.

A SMALLER beta concentrates the draws on the newest snapshots (beta -> 0: always the newest); beta = 1 is
uniform over the pool. This is the formula that gives seeds/002's worked numbers (K=10, beta=0.7, eps=0.15,
50 snapshots: newest ~26.5%, each older pool member 0.7 times the next newer, 15% exploration draws of which
12 points land outside the pool, ~8 unique opponents among 16 envs); the seed's tuning prose ("0.85 =
strong recency") reads beta the other way round and is not what is implemented.

Store. ``SnapshotStore`` keeps snapshots under ``runs/<name>/pool/``: the weights as
``weights/<sha256>.safetensors`` (content-addressed, pickle-free) and ``index.json``, the ordered list of
snapshots, rewritten atomically (temp file, fsync, rename, fsync of the directory) after each weights file
is durable, so a crash leaves the old index or the new one and never an index entry without its weights.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from learner.checkpoint import _fsync

INDEX_NAME = "index.json"
WEIGHTS_DIR = "weights"
INDEX_FORMAT = 1
_HASH_RE = re.compile(r"[0-9a-f]{64}")
"""A sha256 hex digest; always ``fullmatch`` it (``$`` would let a trailing newline through)."""


def opponent_probabilities(num_snapshots: int, *, pool_size: int, beta: float, exploration: float) -> np.ndarray:
    """The exact probability of drawing each snapshot index (0 = oldest) for one env; sums to 1."""
    n, k = _check_pool_args(num_snapshots, pool_size, beta, exploration)
    probs = np.zeros(n, dtype=np.float64)
    probs[n - k:] = _age_weights(k, beta)[::-1]
    if n > pool_size:
        probs = (1.0 - exploration) * probs + exploration / n
    return probs


def sample_opponents(num_snapshots: int, num_envs: int, *, pool_size: int, beta: float, exploration: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Draw one opponent snapshot index (int64, 0 = oldest) per env, independently; see the module docstring."""
    n, k = _check_pool_args(num_snapshots, pool_size, beta, exploration)
    num_envs = _as_int("num_envs", num_envs)
    if num_envs < 0:
        raise ValueError(f"num_envs must be >= 0, got {num_envs}")
    cdf = np.cumsum(_age_weights(k, beta))
    ages = np.searchsorted(cdf, rng.random(num_envs) * cdf[-1], side="right")
    picks = (n - 1 - np.minimum(ages, k - 1)).astype(np.int64)
    if n > pool_size and exploration > 0.0:
        explore = rng.random(num_envs) < exploration
        picks[explore] = rng.integers(0, n, size=int(explore.sum()), dtype=np.int64)
    return picks


def sample_baselines(num_envs: int, chances: Sequence[float], *, rng: np.random.Generator) -> np.ndarray:
    """Per env, which fixed baseline it plays instead of a pool snapshot (selfplay.baseline_opponents): int64
    positions into ``chances`` (baseline ``j`` drawn with probability ``chances[j]``), ``len(chances)`` for "a
    pool snapshot" (probability ``1 - sum(chances)``)."""
    cumulative = np.cumsum(np.asarray(chances, dtype=np.float64))
    if len(cumulative) and (np.any(np.diff(cumulative, prepend=0.0) < 0) or cumulative[-1] > 1 + 1e-9):
        raise ValueError(f"baseline chances must be >= 0 and add up to at most 1, got {list(chances)}")
    return np.searchsorted(cumulative, rng.random(num_envs), side="right").astype(np.int64)


def _age_weights(k: int, beta: float) -> np.ndarray:
    """Normalised beta**age for ages 0..k-1 (age 0 = newest)."""
    weights = float(beta) ** np.arange(k, dtype=np.float64)
    return weights / weights.sum()


def _check_pool_args(num_snapshots: int, pool_size: int, beta: float, exploration: float) -> tuple[int, int]:
    n = _as_int("num_snapshots", num_snapshots)
    size = _as_int("pool_size", pool_size)
    if n < 1:
        raise ValueError(f"num_snapshots must be >= 1 (there is nothing to draw from), got {n}")
    if size < 1:
        raise ValueError(f"pool_size must be >= 1, got {size}")
    if not 0.0 < beta <= 1.0:  # also rejects NaN
        raise ValueError(f"beta must be in (0, 1] (smaller = more weight on the newest), got {beta!r}")
    if not 0.0 <= exploration <= 1.0:
        raise ValueError(f"exploration must be in [0, 1], got {exploration!r}")
    return n, min(size, n)


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """One entry of the pool index."""

    index: int
    """Position in the pool: 0 is the oldest snapshot."""
    hash: str
    """sha256 (hex) of the safetensors file bytes; also the file's name under weights/."""
    update: int
    """Learner update after which the weights were taken."""
    policy_version: int
    """Policy version of the weights."""
    created: float
    """Unix time the snapshot was added."""
    num_bytes: int
    """Size of the safetensors file (what a server sends over the wire)."""


class SnapshotStoreError(RuntimeError):
    """The pool directory is unusable: a corrupted or missing weights file, or an unreadable index."""


class SnapshotStore:
    """Content-addressed, pickle-free snapshot store under ``root`` (``runs/<name>/pool/``).

    Adding weights identical to an earlier snapshot (same arrays, names and dtypes, hence the same
    safetensors bytes) writes no second file but still appends a new index entry with its own update and
    policy_version: the index is the history of when snapshots were taken, the weights directory is
    deduplicated storage. So ``len(store)`` counts entries, and two entries may share one hash.

    One process (the learner) writes; any number may read. Reopening the directory (a resumed run) sees
    every snapshot whose index entry was written; a weights file without an entry (a crash between the two
    writes) is harmless and is reused if the same weights are added again.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.weights_dir = self.root / WEIGHTS_DIR
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self._snapshots: list[Snapshot] = self._read_index()
        self._verified: dict[str, tuple[int, int, int]] = {}
        """Digest -> (inode, size, mtime_ns) of a weights file whose hash was checked: while the file keeps that
        stamp, serving it again reads it but does not hash it again (hashing a 26 MB file took ~20 ms)."""

    def __len__(self) -> int:
        return len(self._snapshots)

    def reload(self) -> None:
        """Read the index again (a standalone pool server follows the learner that appends to it)."""
        self._snapshots = self._read_index()

    @property
    def snapshots(self) -> tuple[Snapshot, ...]:
        """Every snapshot, oldest first."""
        return tuple(self._snapshots)

    def snapshot(self, index: int) -> Snapshot:
        """The snapshot at ``index`` (0 = oldest; negative counts from the newest, as for a list)."""
        i = _as_int("index", index)
        if not -len(self._snapshots) <= i < len(self._snapshots):
            raise IndexError(f"snapshot index {i} is out of range: the pool at {self.root} holds "
                             f"{len(self._snapshots)} snapshots")
        return self._snapshots[i]

    def path_of(self, digest: str) -> Path:
        """Where the weights with this sha256 live."""
        return self.weights_dir / f"{_check_hash(digest)}.safetensors"

    def add(self, arrays: dict[str, np.ndarray], *, update: int, policy_version: int) -> Snapshot:
        """Store ``arrays`` as the newest snapshot and return its entry (see the class docstring on duplicates)."""
        update = _as_int("update", update)
        policy_version = _as_int("policy_version", policy_version)
        if update < 0 or policy_version < 0:
            raise ValueError(f"update and policy_version must be >= 0, got {update} and {policy_version}")
        if not arrays:
            raise ValueError("a snapshot needs at least one array")
        data = save_safetensors({str(k): np.ascontiguousarray(v) for k, v in arrays.items()})
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_of(digest)
        if not self._is_intact(path, digest):
            _atomic_write(path, data)
        entry = Snapshot(index=len(self._snapshots), hash=digest, update=update, policy_version=policy_version,
                         created=time.time(), num_bytes=len(data))
        self._write_index([*self._snapshots, entry])
        self._snapshots.append(entry)
        return entry

    def truncate_after(self, update: int) -> int:
        """Forget snapshots taken after ``update`` (a run resumed from an earlier checkpoint retakes them);
        returns how many were dropped. Their weights files stay (content-addressed, possibly shared)."""
        keep = [entry for entry in self._snapshots if entry.update <= update]
        dropped = len(self._snapshots) - len(keep)
        if dropped:
            self._write_index(keep)
            self._snapshots = keep
        return dropped

    def read_bytes(self, digest: str) -> bytes:
        """The verified safetensors bytes of the weights with this sha256 (what a server sends)."""
        path = self.path_of(digest)
        try:
            with path.open("rb") as file:
                stat = os.fstat(file.fileno())
                data = file.read()
        except FileNotFoundError:
            raise SnapshotStoreError(f"snapshot weights {path} are missing") from None
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._verified.get(digest) == stamp:
            return data
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            self._verified.pop(digest, None)
            raise SnapshotStoreError(f"snapshot weights {path} are corrupted: sha256 is {actual}, "
                                     f"expected {digest}")
        self._verified[digest] = stamp
        return data

    def load(self, key: int | str) -> dict[str, np.ndarray]:
        """The arrays of a snapshot, by index (int) or sha256 (str); the file's hash is verified."""
        digest = key if isinstance(key, str) else self.snapshot(key).hash
        return load_safetensors(self.read_bytes(digest))

    def _is_intact(self, path: Path, digest: str) -> bool:
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest() == digest
        except FileNotFoundError:
            return False

    def _read_index(self) -> list[Snapshot]:
        path = self.root / INDEX_NAME
        if not path.exists():
            return []
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {INDEX_FORMAT}")
            entries = [Snapshot(**entry) for entry in doc["snapshots"]]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SnapshotStoreError(f"pool index {path} is unreadable: {err}") from err
        for position, entry in enumerate(entries):
            if entry.index != position or not _HASH_RE.fullmatch(entry.hash):
                raise SnapshotStoreError(f"pool index {path}: entry {position} is inconsistent: {entry}")
        return entries

    def _write_index(self, entries: list[Snapshot]) -> None:
        doc = {"format": INDEX_FORMAT, "snapshots": [asdict(entry) for entry in entries]}
        _atomic_write(self.root / INDEX_NAME, json.dumps(doc, indent=1).encode())


def _check_hash(digest: str) -> str:
    if not isinstance(digest, str) or not _HASH_RE.fullmatch(digest):
        raise ValueError(f"a snapshot hash is 64 lowercase hex digits (sha256), got {digest!r:.80}")
    return digest


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a hidden temp file in the same directory: fsync, rename, fsync the dir."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync(path.parent)
