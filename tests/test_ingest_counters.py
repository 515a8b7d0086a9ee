"""IngestDelta (learner/serve/ingest_counters.py): a follower rank's ingest counts since its previous delta, carried
to rank 0 and merged into rank 0's counters there."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.serve.ingest_counters import RECENT, IngestCounters, IngestDelta
from learner.serve.row_checks import HostReport


def _ingest(counters: IngestCounters, *, env_steps: int, agent_steps: int, restarts: int, returns: list[float],
            lengths: list[int], scores: list[float], dropped: dict[str, int], rejected: dict[str, int],
            nbytes: int, lags: list[int], host_stats: dict[str, float]) -> None:
    """What the ingest thread tells its counters for some messages: the refused ones (one byte each), then one
    accepted message carrying the rest."""
    for reason, count in rejected.items():
        for _ in range(count):
            counters.refused(reason, 1)
    report = HostReport(env_steps=env_steps, agent_steps=agent_steps, env_restarts=restarts, returns=returns,
                        lengths=lengths, named_stats={"score": scores}, host_stats=host_stats)
    counters.accepted(report, nbytes=nbytes - sum(rejected.values()), fresh_lags=np.array(lags, dtype=np.int64),
                      stale=dropped.get("stale", 0), future=dropped.get("future", 0))


FIRST = {"env_steps": 40, "agent_steps": 80, "restarts": 1, "returns": [1.0, 2.5, -3.0], "lengths": [10, 11, 12],
         "scores": [0.1, 0.2, 0.3], "dropped": {"stale": 3}, "rejected": {"not_registered": 2},
         "nbytes": 5000, "lags": [0, 1, 2, 1] + [0] * 60, "host_stats": {"infer_s": 0.5, "steps": 7.0}}
SECOND = {"env_steps": 25, "agent_steps": 50, "restarts": 0, "returns": [9.0], "lengths": [30], "scores": [0.9],
          "dropped": {"stale": 1, "future": 4}, "rejected": {}, "nbytes": 1200, "lags": [3, 0] + [0] * 30,
          "host_stats": {"infer_s": 0.25}}


def _expected(part: dict, rows_wait_s: float) -> IngestDelta:
    """The delta of exactly the counts in ``part`` (independent of the counters' bookkeeping)."""
    return IngestDelta(rows_wait_s=rows_wait_s, env_steps=part["env_steps"], agent_steps=part["agent_steps"],
                      env_restarts=part["restarts"], episodes=len(part["returns"]), returns=part["returns"],
                      lengths=part["lengths"], named_stats={"score": part["scores"]}, host_stats=part["host_stats"],
                      rows_received=len(part["lags"]), rows_dropped=part["dropped"], messages_dropped=part["rejected"],
                      bytes_received=part["nbytes"], lag_sum=sum(part["lags"]), lag_max=max(part["lags"]),
                      lag_rows=len(part["lags"]))


def test_two_takes_report_what_was_counted_since_the_previous_one() -> None:
    counters = IngestCounters()
    _ingest(counters, **FIRST)
    assert counters.take_delta(rows_wait_s=0.5) == _expected(FIRST, 0.5)
    totals = counters.totals()
    assert (totals.lag_sum, totals.lag_max, totals.lag_rows) == (0, 0, 0)
    assert not totals.host_stats
    assert totals.env_steps == 40 and totals.episodes == 3, "cumulative counters stay"
    _ingest(counters, **SECOND)
    assert counters.take_delta(rows_wait_s=0.125) == _expected(SECOND, 0.125)
    totals = counters.totals()
    assert (totals.lag_sum, totals.lag_max, totals.lag_rows) == (0, 0, 0)
    empty = counters.take_delta(rows_wait_s=0.0)
    assert empty == IngestDelta(rows_wait_s=0.0, named_stats={"score": []})


def test_a_take_carries_at_most_the_recent_episodes() -> None:
    counters = IngestCounters()
    returns = [float(value) for value in range(RECENT + 30)]
    _ingest(counters, **{**FIRST, "returns": returns, "lengths": list(range(len(returns))), "scores": returns})
    report = counters.take_delta(rows_wait_s=0.0)
    assert report.episodes == RECENT + 30
    assert report.returns == returns[-RECENT:]
    assert report.lengths == list(range(len(returns)))[-RECENT:]
    assert report.named_stats == {"score": returns[-RECENT:]}


def test_merging_reports_adds_them_to_rank_zeros_counters() -> None:
    leader = IngestCounters()
    _ingest(leader, **SECOND)
    leader.merge(_expected(FIRST, 0.5))
    leader.merge(_expected(SECOND, 0.25))
    totals, snapshot = leader.totals(), leader.take_snapshot()
    assert totals.env_steps == 25 + 40 + 25
    assert totals.agent_steps == 50 + 80 + 50
    assert totals.env_restarts == 1
    assert totals.episodes == 1 + 3 + 1
    assert list(snapshot.recent_returns) == [9.0, 1.0, 2.5, -3.0, 9.0]
    assert list(snapshot.recent_lengths) == [30, 10, 11, 12, 30]
    assert snapshot.episode_stat_means["score"] == pytest.approx(np.mean([0.9, 0.1, 0.2, 0.3, 0.9]))
    assert totals.host_stats == {"infer_s": 1.0, "steps": 7.0}
    assert totals.rows_received == 32 + 64 + 32
    assert totals.rows_dropped == {"stale": 5, "future": 8}
    assert totals.messages_dropped == {"not_registered": 2}
    assert totals.bytes_received == 1200 + 5000 + 1200
    assert (totals.lag_sum, totals.lag_max, totals.lag_rows) == (3 + 4 + 3, 3, 32 + 64 + 32)


def test_a_fresh_ingest_merging_a_report_holds_exactly_it() -> None:
    follower, leader = IngestCounters(), IngestCounters()
    _ingest(follower, **FIRST)
    before = follower.totals()
    leader.merge(follower.take_delta(rows_wait_s=1.0))
    merged = leader.totals()
    for name in ("env_steps", "agent_steps", "env_restarts", "episodes", "rows_received", "bytes_received",
                 "messages_dropped"):
        assert getattr(merged, name) == getattr(before, name), name
    assert leader.take_snapshot().recent_returns == follower.take_snapshot().recent_returns
    assert merged.rows_dropped == {"stale": 3}
    assert (merged.lag_sum, merged.lag_max, merged.lag_rows) == (4, 2, 64)


COUNT = st.integers(min_value=0, max_value=2**62)
FLOAT = st.floats(allow_nan=False, allow_infinity=False)
NAME = st.text(min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(wait=FLOAT, counts=st.lists(COUNT, min_size=9, max_size=9), returns=st.lists(FLOAT, max_size=5),
       lengths=st.lists(COUNT, max_size=5), named=st.dictionaries(NAME, st.lists(FLOAT, max_size=3), max_size=3),
       host=st.dictionaries(NAME, FLOAT, max_size=3), dropped=st.dictionaries(NAME, COUNT, max_size=3),
       rejected=st.dictionaries(NAME, COUNT, max_size=3))
def test_encode_decode_round_trip(wait: float, counts: list[int], returns: list[float], lengths: list[int],
                                  named: dict[str, list[float]], host: dict[str, float], dropped: dict[str, int],
                                  rejected: dict[str, int]) -> None:
    report = IngestDelta(rows_wait_s=wait, env_steps=counts[0], agent_steps=counts[1], env_restarts=counts[2],
                         episodes=counts[3], returns=returns, lengths=lengths, named_stats=named, host_stats=host,
                         rows_received=counts[4], rows_dropped=dropped, messages_dropped=rejected,
                         bytes_received=counts[5], lag_sum=counts[6], lag_max=counts[7], lag_rows=counts[8])
    assert IngestDelta.decode(report.encode()) == report


@pytest.mark.parametrize("value, kind", [([1, 2], "list"), (3, "int"), ("text", "str"), (None, "NoneType")])
def test_decode_refuses_a_payload_that_is_not_a_map(value: object, kind: str) -> None:
    with pytest.raises(ValueError, match=f"rank report must be a map, got {kind}"):
        IngestDelta.decode(msgpack.packb(value))


def test_decode_names_an_unknown_field() -> None:
    payload = msgpack.packb({"rows_wait_s": 0.0, "surprise": 1})
    with pytest.raises(ValueError, match="rank report: .*'surprise'"):
        IngestDelta.decode(payload)


def test_decode_names_a_missing_field() -> None:
    payload = msgpack.packb({"env_steps": 3})
    with pytest.raises(ValueError, match="rank report: .*'rows_wait_s'"):
        IngestDelta.decode(payload)


def test_every_type_that_carries_the_counts_has_a_field_for_each_entry_of_the_table() -> None:
    """COUNTS and STEP_COUNTS are the one table of report counters: a counter added there and forgotten in one of
    the types that carry it fails here instead of vanishing on the way from the host to rank 0's metrics."""
    from dataclasses import fields

    from actors.rows_report import RowsReport
    from learner.serve.ingest_counters import COUNTS, COUNTS_BY_REASON, IngestSnapshot, IngestTotals
    from protocol.rows import STEP_COUNTS

    def names(cls: type) -> set[str]:
        return {f.name for f in fields(cls)}

    assert set(STEP_COUNTS) <= names(RowsReport) & names(HostReport)
    assert set(COUNTS) | set(COUNTS_BY_REASON) <= names(IngestTotals) & names(IngestDelta)
    assert set(STEP_COUNTS) | {"episodes", "rows_received"} <= names(IngestSnapshot)
