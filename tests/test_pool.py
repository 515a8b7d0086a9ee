"""Opponent pool: exact probabilities, sampling goodness of fit, seeds/002's worked numbers, the snapshot store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import socket
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
import zmq

from configs.loader import ConfigError, load_config
from configs.schema import SelfPlaySection
from learner.pool import store as pool
from learner.pool.store import (SnapshotStore, SnapshotStoreError, opponent_probabilities,
                          sample_opponents)
from learner.pool.server import PoolService, serve
from protocol import Message, MessageType, decode, encode

CASES = [  # (num_snapshots, pool_size, beta, exploration)
    (5, 10, 0.7, 0.15),   # n < K: geometric only, eps unused
    (10, 10, 0.7, 0.15),  # n == K: still nothing beyond the pool
    (50, 10, 0.7, 0.15),  # n > K: the seed's mid-training case
    (30, 8, 0.5, 0.0),    # eps = 0: never beyond the pool
    (12, 4, 0.9, 1.0),    # eps = 1: uniform over everything
    (20, 6, 1.0, 0.3),    # beta = 1: uniform within the pool
    (1, 3, 0.7, 0.5),     # a single snapshot
    (7, 1, 0.7, 0.2),     # K = 1: newest, or exploration
]


def brute_force(n: int, k: int, beta: float, eps: float) -> list[float]:
    """Independent computation: enumerate each snapshot by name and add up the two ways to draw it."""
    beta_f, eps_f = Fraction(beta), Fraction(eps)
    pool = list(range(max(0, n - k), n))
    newest_first = pool[::-1]
    total_weight = sum(beta_f ** age for age in range(len(pool)))
    use_eps = eps_f if n > k else Fraction(0)
    out = []
    for snap in range(n):
        p = Fraction(0)
        if snap in pool:
            p += (1 - use_eps) * beta_f ** newest_first.index(snap) / total_weight
        p += use_eps / n
        out.append(float(p))
    return out


def unique_count_distribution(probs: np.ndarray, draws: int) -> np.ndarray:
    """Exact P(#distinct = d) for ``draws`` independent draws, by dynamic programming over snapshots:
    P(counts c) = draws! * prod p_i**c_i / c_i!, summed by (draws used, distinct so far)."""
    table = np.zeros((draws + 1, draws + 1))
    table[0, 0] = 1.0
    for p in probs:
        new = table.copy()
        for used in range(draws + 1):
            for c in range(1, draws - used + 1):
                new[used + c, 1:] += table[used, :-1] * p ** c / math.factorial(c)
        table = new
    return table[draws] * math.factorial(draws)


def chi2_quantile(df: int, z: float) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at standard-normal quantile z."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("n,k,beta,eps", CASES)
def test_probabilities_match_brute_force(n, k, beta, eps):
    probs = opponent_probabilities(n, pool_size=k, beta=beta, exploration=eps)
    assert probs.shape == (n,)
    np.testing.assert_allclose(probs, brute_force(n, k, beta, eps), rtol=1e-12, atol=1e-15)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n,k,beta,eps", CASES)
def test_sampling_goodness_of_fit(n, k, beta, eps):
    draws = 200_000
    probs = opponent_probabilities(n, pool_size=k, beta=beta, exploration=eps)
    picks = sample_opponents(n, draws, pool_size=k, beta=beta, exploration=eps,
                             rng=np.random.default_rng(1000 + n))
    assert picks.dtype == np.int64 and picks.shape == (draws,)
    assert picks.min() >= 0 and picks.max() < n
    counts = np.bincount(picks, minlength=n)
    assert np.all(counts[probs == 0] == 0)  # never outside the support
    support = probs > 0
    if support.sum() == 1:
        assert counts[support][0] == draws
        return
    expected = probs[support] * draws
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    # Reject at p = 1e-4: a correct sampler fails this once in 10k runs (and the seeds are fixed).
    assert chi2 < chi2_quantile(int(support.sum()) - 1, 3.719), (chi2, counts, expected)


def test_seed_worked_example_mid_training():
    """seeds/002: K=10, beta=0.7, eps=0.15 with 50 snapshots and 16 envs."""
    probs = opponent_probabilities(50, pool_size=10, beta=0.7, exploration=0.15)
    newest_first = probs[::-1]
    assert newest_first[0] == pytest.approx(0.2654, abs=1e-4)  # the seed says ~28%; eps/n also lands here
    pool_part = newest_first[:10] - 0.15 / 50  # strip the exploration share each snapshot also gets
    np.testing.assert_allclose(pool_part[1:] / pool_part[:-1], 0.7, rtol=1e-12)
    assert probs[:40].sum() == pytest.approx(0.12)  # outside the pool: 15% * 40/50
    # "about 15% from all history": the exploration draws themselves, checked by sampling.
    rng = np.random.default_rng(7)
    picks = sample_opponents(50, 200_000, pool_size=10, beta=0.7, exploration=0.0, rng=rng)
    assert picks.min() >= 40  # with eps = 0 the draw never leaves the pool
    # Unique opponents among 16 envs: exact distribution (mean 7.92; 5%/95% quantiles 6 and 10;
    # P(6 <= unique <= 11) = 0.945). The seed's "8-12" / "9-11" are a little high; the mean is ~8.
    dist = unique_count_distribution(probs, 16)
    assert dist.sum() == pytest.approx(1.0, abs=1e-12)
    mean = float((np.arange(17) * dist).sum())
    cdf = np.cumsum(dist)
    assert mean == pytest.approx(7.925, abs=0.001)
    assert (int(np.searchsorted(cdf, 0.05)), int(np.searchsorted(cdf, 0.95))) == (6, 10)
    assert dist[6:12].sum() == pytest.approx(0.945, abs=0.001)
    # The same from 20k simulated alternations of 16 envs.
    alternations = sample_opponents(50, 20_000 * 16, pool_size=10, beta=0.7, exploration=0.15,
                                    rng=np.random.default_rng(11)).reshape(20_000, 16)
    unique = np.array([len(np.unique(row)) for row in alternations])
    assert unique.mean() == pytest.approx(mean, abs=0.05)
    assert np.quantile(unique, 0.05) == 6 and np.quantile(unique, 0.95) == 10
    assert np.mean((unique >= 6) & (unique <= 11)) > 0.93


def test_seed_early_training_case():
    """5 snapshots, K=10, beta=0.7, 16 envs. The seed's "~50% / 30% / 15% / 5%" is not what
    beta**age gives: the exact shares are 36.1%, 25.2%, 17.7%, 12.4% and 8.7%. Its "4-5 unique" holds:
    P(3) = 0.034, P(4) = 0.341, P(5) = 0.625 (mean 4.59)."""
    probs = opponent_probabilities(5, pool_size=10, beta=0.7, exploration=0.15)
    np.testing.assert_allclose(probs[::-1], [0.3606, 0.2524, 0.1767, 0.1237, 0.0866], atol=1e-4)
    dist = unique_count_distribution(probs, 16)
    np.testing.assert_allclose(dist[3:6], [0.034, 0.341, 0.625], atol=1e-3)
    assert dist[:3].sum() < 1e-3  # P(2 unique) = 0.00046
    assert float((np.arange(17) * dist).sum()) == pytest.approx(4.589, abs=0.001)
    assert dist[4:6].sum() == pytest.approx(0.965, abs=0.001)


def test_smaller_beta_favours_the_newest():
    newest = [opponent_probabilities(20, pool_size=10, beta=b, exploration=0.0)[-1] for b in (0.3, 0.7, 0.95)]
    assert newest[0] > newest[1] > newest[2]


def test_zero_envs_and_reproducibility():
    kwargs = dict(pool_size=10, beta=0.7, exploration=0.15)
    assert sample_opponents(50, 0, rng=np.random.default_rng(0), **kwargs).shape == (0,)
    a = sample_opponents(50, 64, rng=np.random.default_rng(3), **kwargs)
    b = sample_opponents(50, 64, rng=np.random.default_rng(3), **kwargs)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_snapshots=0), "num_snapshots must be >= 1"),
    (dict(num_snapshots=2.5), "num_snapshots must be an integer"),
    (dict(num_envs=-1), "num_envs must be >= 0"),
    (dict(pool_size=0), "pool_size must be >= 1"),
    (dict(beta=0.0), r"beta must be in \(0, 1\]"),
    (dict(beta=1.5), r"beta must be in \(0, 1\]"),
    (dict(beta=float("nan")), r"beta must be in \(0, 1\]"),
    (dict(exploration=-0.1), r"exploration must be in \[0, 1\]"),
    (dict(exploration=1.01), r"exploration must be in \[0, 1\]"),
])
def test_argument_errors(kwargs, message):
    args = dict(num_snapshots=5, num_envs=4, pool_size=3, beta=0.7, exploration=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        sample_opponents(args.pop("num_snapshots"), args.pop("num_envs"), rng=np.random.default_rng(0), **args)
    if "num_envs" not in kwargs:
        args = dict(num_snapshots=5, pool_size=3, beta=0.7, exploration=0.1) | kwargs
        with pytest.raises(ValueError, match=message):
            opponent_probabilities(args.pop("num_snapshots"), **args)


def test_selfplay_section_has_the_seed_defaults_and_bounds():
    section = SelfPlaySection()
    assert (section.opponent_pool_size, section.opponent_pool_beta, section.opponent_pool_exploration) == (
        10, 0.7, 0.15)
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.cache_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        SelfPlaySection(True)  # type: ignore[misc]
    assert "SMALLER beta" in (pool.__doc__ or "")
    with pytest.raises(ConfigError, match=r"selfplay.opponent_pool_beta"):
        load_config(None, ["selfplay.opponent_pool_beta=0"])
    with pytest.raises(ConfigError, match=r"did you mean 'opponent_pool_size'"):
        load_config(None, ["selfplay.opponent_pool_sise=3"])


# ---- the snapshot store ----

def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"torso.0.weight": rng.standard_normal((8, 4)).astype(np.float32),
            "torso.0.bias": rng.standard_normal(8).astype(np.float32),
            "steps": np.array([seed], dtype=np.int64)}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype
        np.testing.assert_array_equal(a[key], b[key])


def no_temp_files(root) -> bool:
    return not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


def test_store_add_reopen_load(tmp_path):
    root = tmp_path / "runs" / "demo" / "pool"
    store = SnapshotStore(root)
    assert len(store) == 0
    added = [store.add(weights(i), update=10 * (i + 1), policy_version=10 * (i + 1)) for i in range(3)]
    assert [s.index for s in added] == [0, 1, 2] and len(store) == 3
    assert store.snapshot(-1) == added[2] and store.snapshot(1) == added[1]
    reopened = SnapshotStore(root)  # a resumed run
    assert reopened.snapshots == store.snapshots
    for i, snap in enumerate(added):
        assert_same(reopened.load(i), weights(i))
        assert_same(reopened.load(snap.hash), weights(i))
        data = reopened.read_bytes(snap.hash)
        assert hashlib.sha256(data).hexdigest() == snap.hash and len(data) == snap.num_bytes
    index = json.loads((root / "index.json").read_text())
    assert [e["update"] for e in index["snapshots"]] == [10, 20, 30]
    assert set(index["snapshots"][0]) == {"index", "hash", "update", "policy_version", "created", "num_bytes"}
    assert no_temp_files(root)
    assert b"pickle" not in (root / "index.json").read_bytes()
    reopened.add(weights(9), update=40, policy_version=40)
    assert len(SnapshotStore(root)) == 4


def test_store_truncates_snapshots_newer_than_a_resumed_checkpoint(tmp_path):
    store = SnapshotStore(tmp_path)
    for i in range(4):
        store.add(weights(i), update=10 * i, policy_version=10 * i)
    assert store.truncate_after(15) == 2  # the run resumes from update 15: snapshots 20 and 30 are retaken
    reopened = SnapshotStore(tmp_path)
    assert [s.update for s in reopened.snapshots] == [0, 10] and reopened.truncate_after(15) == 0
    assert reopened.add(weights(7), update=20, policy_version=20).index == 2
    assert_same(reopened.load(2), weights(7)) and no_temp_files(tmp_path)


def test_store_dedupes_files_but_keeps_entries(tmp_path):
    store = SnapshotStore(tmp_path)
    first = store.add(weights(1), update=10, policy_version=10)
    reordered = dict(reversed(list(weights(1).items())))  # same arrays, other insertion order
    second = store.add(reordered, update=20, policy_version=20)
    assert first.hash == second.hash and (first.index, second.index) == (0, 1)
    assert (second.update, second.policy_version) == (20, 20)
    assert len(list((tmp_path / "weights").iterdir())) == 1
    assert len(store) == 2
    assert no_temp_files(tmp_path)


def test_store_detects_corruption_and_repairs_on_add(tmp_path):
    store = SnapshotStore(tmp_path)
    snap = store.add(weights(2), update=1, policy_version=1)
    path = store.path_of(snap.hash)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotStoreError, match="corrupted"):
        store.load(0)
    with pytest.raises(SnapshotStoreError, match="corrupted"):
        SnapshotStore(tmp_path).read_bytes(snap.hash)
    store.add(weights(2), update=2, policy_version=2)  # adding the same weights rewrites the damaged file
    assert_same(store.load(0), weights(2))
    path.unlink()
    with pytest.raises(SnapshotStoreError, match="missing"):
        store.load(snap.hash)


def test_store_errors(tmp_path):
    store = SnapshotStore(tmp_path)
    with pytest.raises(IndexError, match="holds 0 snapshots"):
        store.snapshot(0)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.read_bytes("../../etc/passwd")
    with pytest.raises(ValueError, match="at least one array"):
        store.add({}, update=0, policy_version=0)
    with pytest.raises(ValueError, match=">= 0"):
        store.add(weights(0), update=-1, policy_version=0)
    (tmp_path / "index.json").write_text("{not json")
    assert len(SnapshotStore(tmp_path)) == 0  # a garbled index is rebuilt from the (no) weights files


def test_store_index_write_is_atomic(tmp_path, monkeypatch):
    """A crash while writing the index leaves the previous index intact and no temp file behind."""
    store = SnapshotStore(tmp_path)
    store.add(weights(0), update=1, policy_version=1)
    before = (tmp_path / "index.json").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("learner.pool.store.os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        store.add(weights(0), update=2, policy_version=2)  # same weights: only the index is written
    monkeypatch.undo()
    assert (tmp_path / "index.json").read_bytes() == before
    assert no_temp_files(tmp_path)
    assert len(store) == 1 and len(SnapshotStore(tmp_path)) == 1


@pytest.mark.parametrize("spoil", [lambda d: d + "\n", lambda d: d + "\r\n", lambda d: " " + d, lambda d: d + "0",
                                   str.upper])
def test_a_digest_must_be_exactly_64_lowercase_hex_digits(tmp_path, spoil):
    store = SnapshotStore(tmp_path)
    snap = store.add(weights(0), update=1, policy_version=1)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.read_bytes(spoil(snap.hash))
    index = json.loads((tmp_path / "index.json").read_text())
    index["snapshots"][0]["hash"] = snap.hash + "\n"
    (tmp_path / "index.json").write_text(json.dumps(index))
    assert len(SnapshotStore(tmp_path)) == 0  # the bad entry is skipped


def test_serving_a_snapshot_again_reads_but_does_not_rehash_an_unchanged_file(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path)
    snap = store.add(weights(3), update=1, policy_version=1)
    hashed = []
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(pool.hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or real_sha256(data))
    first = store.read_bytes(snap.hash)
    assert store.read_bytes(snap.hash) == first and hashed == [snap.num_bytes]  # hashed once
    path = store.path_of(snap.hash)
    path.write_bytes(first[:-1])  # damaged after it was checked: another size, so it is hashed again
    with pytest.raises(SnapshotStoreError, match="corrupted"):
        store.read_bytes(snap.hash)
    path.unlink()
    with pytest.raises(SnapshotStoreError, match="missing"):
        store.read_bytes(snap.hash)
    store.add(weights(3), update=2, policy_version=2)  # rewritten (a new file): checked again when served
    before = len(hashed)
    assert store.read_bytes(snap.hash) == first and len(hashed) == before + 1


def test_a_huge_sparse_weights_file_is_refused_unread_and_fast(tmp_path, caplog, monkeypatch):
    store = SnapshotStore(tmp_path)
    digest = "ab" * 32
    path = store.path_of(digest)
    with path.open("wb") as file:
        file.truncate(5 * 2 ** 30)  # sparse: no disk used
    reads = []
    monkeypatch.setattr(pool.hashlib, "sha256", lambda data=b"": reads.append(len(data)))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="learner.pool.store"):
        for _ in range(3):
            with pytest.raises(SnapshotStoreError, match="not read"):
                store.read_bytes(digest)
    assert time.monotonic() - started < 2.0 and reads == []
    expected = (f"snapshot weights {path} are {5 * 2 ** 30} bytes, more than the {pool.MAX_SNAPSHOT_BYTES} a snapshot "
                f"may hold; not read")
    assert [r.getMessage() for r in caplog.records] == [expected]  # once, not per request
    assert not store._is_intact(path, digest)


def test_a_garbled_index_is_a_warning_and_is_rebuilt_from_the_weights_files(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    first = store.add(weights(0), update=5, policy_version=5)
    time.sleep(0.01)
    second = store.add(weights(1), update=10, policy_version=10)
    (tmp_path / "index.json").write_bytes(b"\xff{garbled")
    with caplog.at_level(logging.WARNING, logger="learner.pool.store"):
        rebuilt = SnapshotStore(tmp_path)
    assert [s.hash for s in rebuilt.snapshots] == [first.hash, second.hash]  # oldest file first
    assert [(s.index, s.update) for s in rebuilt.snapshots] == [(0, 0), (1, 0)]
    [record] = caplog.records
    assert record.getMessage().startswith(f"pool index {tmp_path / 'index.json'} is unreadable (")
    assert record.getMessage().endswith(f"rebuilt it from the 2 weights files in {tmp_path / 'weights'}")
    assert_same(rebuilt.load(1), weights(1))
    rebuilt.add(weights(2), update=20, policy_version=20)  # the learner's next add writes the rebuilt index out
    assert [s.update for s in SnapshotStore(tmp_path).snapshots] == [0, 0, 20]


def test_bad_index_entries_are_skipped_with_one_warning(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    snaps = [store.add(weights(i), update=i, policy_version=i) for i in range(4)]
    index = json.loads((tmp_path / "index.json").read_text())
    index["snapshots"][0]["update"] = "ten"  # wrong type
    index["snapshots"][2]["hash"] = "cd" * 32  # names a missing file
    index["snapshots"].append(["not", "an", "entry"])
    (tmp_path / "index.json").write_text(json.dumps(index))
    with caplog.at_level(logging.WARNING, logger="learner.pool.store"):
        kept = SnapshotStore(tmp_path)
        kept.reload()  # unchanged index: not read again, not warned again
    assert [(s.index, s.hash) for s in kept.snapshots] == [(0, snaps[1].hash), (1, snaps[3].hash)]
    assert [r.getMessage() for r in caplog.records] == [
        f"pool index {tmp_path / 'index.json'}: skipped 3 bad entries (positions [0, 2, 4]): wrong types, a bad "
        f"hash, or a weights file missing, oversized or resized"]


def test_the_standalone_server_keeps_answering_with_a_garbled_index(tmp_path):
    store = SnapshotStore(tmp_path)
    snap = store.add(weights(0), update=1, policy_version=1)
    service = PoolService(SnapshotStore(tmp_path), SelfPlaySection(enabled=True), seed=0, reload_index=True)
    with socket.socket() as probe:  # serve() binds its own context's socket: a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop, endpoint = threading.Event(), f"tcp://127.0.0.1:{port}"
    server = threading.Thread(target=serve, args=(service, endpoint, stop), daemon=True)
    context = zmq.Context()
    server.start()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        time.sleep(0.2)
        client.connect(endpoint)

        def ask(message_type: MessageType, fields: dict) -> Message:
            client.send_multipart(encode(Message(type=message_type, sender="test", fields=fields)))
            return decode(client.recv_multipart(copy=False))

        for garbage in (b"{not json", b"[1, 2]", b'{"format": 1, "snapshots": {"a": 1}}'):
            (tmp_path / "index.json").write_bytes(garbage)
            reply = ask(MessageType.GET_OPPONENTS, {"num_envs": 4})
            assert reply.type is MessageType.OPPONENTS and reply.fields["digests"] == [snap.hash]
        assert ask(MessageType.GET_SNAPSHOT, {"digest": snap.hash}).type is MessageType.SNAPSHOT
        assert server.is_alive()
    finally:
        stop.set()
        server.join(timeout=5)
        client.close()
        context.term()
