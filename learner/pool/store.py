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

Trust. The directory is read as untrusted input, and every read is bounded before it starts: a weights file is
``os.stat``-ed first and refused unread (one warning naming it) when it is larger than ``max_snapshot_bytes`` (by
default what one SNAPSHOT reply may carry, ``Limits.max_message_bytes`` less MiB of header room); a file is hashed
once per (inode, size, mtime_ns) stamp; ``index.json`` is read only when its stamp changed and only up to
MAX_INDEX_BYTES. A bad index never raises: garbled JSON, a wrong format or an oversized file is one warning and
the index is rebuilt from the weights files present (oldest mtime first, update and policy_version 0, since the
files do not record them); entries with wrong types, a bad hash, or naming a missing, oversized or
different-sized file are skipped with one warning. The rebuilt index lives in memory; the learner's next
``add`` writes it out. So one pool request does at most: one stat of the index, and when it changed a read of
at most MAX_INDEX_BYTES plus one stat per entry (GET_OPPONENTS); or one stat, a read of at most
``max_snapshot_bytes`` and at most one sha256 of it (GET_SNAPSHOT).
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from learner.run.atomic import atomic_write_bytes
from protocol import Limits

LOG = logging.getLogger(__name__)
INDEX_NAME = "index.json"
WEIGHTS_DIR = "weights"
INDEX_FORMAT = 1
MAX_SNAPSHOT_BYTES = Limits().max_message_bytes - (1 << 20)
"""Largest weights file a store reads by default: a SNAPSHOT reply carries the whole file (1 MiB header room)."""
MAX_INDEX_BYTES = 16 << 20
"""Largest index.json a store reads (an entry is ~200 bytes: ~80000 snapshots)."""
_INT_FIELDS = ("index", "update", "policy_version", "num_bytes")
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

    def __init__(self, root: Path, *, max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES) -> None:
        self.root = Path(root)
        self.weights_dir = self.root / WEIGHTS_DIR
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.max_snapshot_bytes = max_snapshot_bytes
        """Largest weights file read (module docstring, "Trust")."""
        self._verified: dict[str, tuple[int, int, int]] = {}
        """Digest -> (inode, size, mtime_ns) of a weights file whose hash was checked: while the file keeps that
        stamp, serving it again reads it but does not hash it again (hashing a 26 MB file took ~20 ms)."""
        self._warned: set[tuple[object, ...]] = set()
        """What was already warned about (a path and its stamp): a standalone server re-reads on every request."""
        self._index_stamp: tuple[int, int, int] | None = None
        self._snapshots: list[Snapshot] = self._read_index()

    def __len__(self) -> int:
        return len(self._snapshots)

    def reload(self) -> None:
        """Read the index again if it changed (a standalone pool server follows the learner that appends to it)."""
        if self._stamp(self.root / INDEX_NAME) != self._index_stamp:
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
            atomic_write_bytes(path, data)
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
                if stat.st_size > self.max_snapshot_bytes:
                    raise self._oversized(path, stat.st_size)
                data = file.read(self.max_snapshot_bytes + 1)  # bounded even if the file grew since the stat
        except FileNotFoundError:
            raise SnapshotStoreError(f"snapshot weights {path} are missing") from None
        if len(data) > self.max_snapshot_bytes:
            raise self._oversized(path, len(data))
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
        """Whether ``path`` holds the bytes with this sha256 (a file over the size limit is not read: not intact)."""
        try:
            if path.stat().st_size > self.max_snapshot_bytes:
                return False
            return hashlib.sha256(path.read_bytes()).hexdigest() == digest
        except FileNotFoundError:
            return False

    def _oversized(self, path: Path, size: int) -> SnapshotStoreError:
        text = (f"snapshot weights {path} are {size} bytes, more than the {self.max_snapshot_bytes} a snapshot may "
                f"hold; not read")
        self._warn_once(("oversized", str(path), size), text)
        return SnapshotStoreError(text)

    def _warn_once(self, key: tuple[object, ...], text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            LOG.warning("%s", text)

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int, int] | None:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def _read_index(self) -> list[Snapshot]:
        """The index's entries (module docstring, "Trust": never raises for what the file holds)."""
        path = self.root / INDEX_NAME
        self._index_stamp = stamp = self._stamp(path)
        if stamp is None:
            return []
        if stamp[1] > MAX_INDEX_BYTES:
            return self._rebuilt(stamp, f"pool index {path} is {stamp[1]} bytes, more than {MAX_INDEX_BYTES}")
        try:
            doc = json.loads(path.read_bytes()[:MAX_INDEX_BYTES])
            if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, "
                                 f"expected {INDEX_FORMAT}")
            if not isinstance(doc.get("snapshots"), list):
                raise ValueError("'snapshots' is not a list")
        except (ValueError, OSError) as err:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            return self._rebuilt(stamp, f"pool index {path} is unreadable ({str(err)[:200]})")
        entries, skipped = [], []
        for position, raw in enumerate(doc["snapshots"]):
            entry = self._entry(raw, len(entries))
            if entry is None:
                skipped.append(position)
            else:
                entries.append(entry)
        if skipped:
            self._warn_once(("index", stamp), f"pool index {path}: skipped {len(skipped)} bad entries (positions "
                                              f"{skipped[:10]}{' ...' if len(skipped) > 10 else ''}): wrong types, "
                                              f"a bad hash, or a weights file missing, oversized or resized")
        return entries

    def _entry(self, raw: object, index: int) -> Snapshot | None:
        """One index entry as the snapshot at ``index``, or None when it is malformed or its file is not servable."""
        if not isinstance(raw, dict) or set(raw) != {f for f in Snapshot.__dataclass_fields__}:
            return None
        if not all(isinstance(raw[f], int) and not isinstance(raw[f], bool) and raw[f] >= 0 for f in _INT_FIELDS):
            return None
        digest, created = raw["hash"], raw["created"]
        if not isinstance(digest, str) or not _HASH_RE.fullmatch(digest):
            return None
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            return None
        stamp = self._stamp(self.weights_dir / f"{digest}.safetensors")
        if stamp is None or stamp[1] != raw["num_bytes"] or stamp[1] > self.max_snapshot_bytes:
            return None
        return Snapshot(index=index, hash=digest, update=raw["update"], policy_version=raw["policy_version"],
                        created=float(created), num_bytes=raw["num_bytes"])

    def _rebuilt(self, stamp: tuple[int, int, int], problem: str) -> list[Snapshot]:
        """An index of the weights files present, oldest first (update and policy_version unknown: 0)."""
        files = []
        try:
            with os.scandir(self.weights_dir) as found:
                for item in found:
                    digest = item.name.removesuffix(".safetensors")
                    if item.name.endswith(".safetensors") and _HASH_RE.fullmatch(digest) and item.is_file():
                        stat = item.stat()
                        if stat.st_size <= self.max_snapshot_bytes:
                            files.append((stat.st_mtime_ns, digest, stat.st_size))
        except OSError as err:
            problem = f"{problem}; listing {self.weights_dir} failed too ({err})"
        files.sort()
        self._warn_once(("index", stamp), f"{problem}; rebuilt it from the {len(files)} weights files in "
                                          f"{self.weights_dir}")
        return [Snapshot(index=i, hash=digest, update=0, policy_version=0, created=mtime_ns / 1e9, num_bytes=size)
                for i, (mtime_ns, digest, size) in enumerate(files)]

    def _write_index(self, entries: list[Snapshot]) -> None:
        doc = {"format": INDEX_FORMAT, "snapshots": [asdict(entry) for entry in entries]}
        atomic_write_bytes(self.root / INDEX_NAME, json.dumps(doc, indent=1).encode())


def _check_hash(digest: str) -> str:
    if not isinstance(digest, str) or not _HASH_RE.fullmatch(digest):
        raise ValueError(f"a snapshot hash is 64 lowercase hex digits (sha256), got {digest!r:.80}")
    return digest
