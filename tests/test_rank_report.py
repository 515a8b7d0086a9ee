"""RankReport and ReportCursor (learner/ranks/report.py): a follower rank's ingest counts since its previous report,
carried to rank 0 and merged there."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.serve.ingest import IngestStats
from learner.ranks.report import RECENT, RankReport, ReportCursor, merge_report


def _ingest(stats: IngestStats, *, env_steps: int, agent_steps: int, restarts: int, returns: list[float],
            lengths: list[int], scores: list[float], rows: int, dropped: dict[str, int],
            rejected: dict[str, int], nbytes: int, lags: list[int], host_stats: dict[str, float]) -> None:
    """What the ingest thread does to its counters for some messages."""
    with stats.lock:
        stats.env_steps += env_steps
        stats.agent_steps += agent_steps
        stats.env_restarts += restarts
        stats.episodes += len(returns)
        stats.recent_returns.extend(returns)
        stats.recent_lengths.extend(lengths)
        stats.recent_stats.setdefault("score", type(stats.recent_returns)(maxlen=RECENT)).extend(scores)
        stats.host_stats.update(host_stats)
        stats.rows_received += rows
        stats.rows_dropped.update(dropped)
        stats.messages_dropped.update(rejected)
        stats.bytes_received += nbytes
        stats.lag_sum += sum(lags)
        stats.lag_max = max([stats.lag_max, *lags])
        stats.lag_rows += len(lags)


FIRST = {"env_steps": 40, "agent_steps": 80, "restarts": 1, "returns": [1.0, 2.5, -3.0], "lengths": [10, 11, 12],
         "scores": [0.1, 0.2, 0.3], "rows": 64, "dropped": {"stale": 3}, "rejected": {"not_registered": 2},
         "nbytes": 5000, "lags": [0, 1, 2, 1], "host_stats": {"infer_s": 0.5, "steps": 7.0}}
SECOND = {"env_steps": 25, "agent_steps": 50, "restarts": 0, "returns": [9.0], "lengths": [30], "scores": [0.9],
          "rows": 32, "dropped": {"stale": 1, "future": 4}, "rejected": {}, "nbytes": 1200, "lags": [3, 0],
          "host_stats": {"infer_s": 0.25}}


def _expected(part: dict, rows_wait_s: float) -> RankReport:
    """The report of exactly the counts in ``part`` (independent of the cursor's bookkeeping)."""
    return RankReport(rows_wait_s=rows_wait_s, env_steps=part["env_steps"], agent_steps=part["agent_steps"],
                      env_restarts=part["restarts"], episodes=len(part["returns"]), returns=part["returns"],
                      lengths=part["lengths"], named_stats={"score": part["scores"]}, host_stats=part["host_stats"],
                      rows_received=part["rows"], rows_dropped=part["dropped"], messages_dropped=part["rejected"],
                      bytes_received=part["nbytes"], lag_sum=sum(part["lags"]), lag_max=max(part["lags"]),
                      lag_rows=len(part["lags"]))


def test_two_takes_report_what_was_counted_since_the_previous_one() -> None:
    stats, cursor = IngestStats(), ReportCursor()
    _ingest(stats, **FIRST)
    assert cursor.take(stats, rows_wait_s=0.5) == _expected(FIRST, 0.5)
    assert (stats.lag_sum, stats.lag_max, stats.lag_rows) == (0, 0, 0)
    assert not stats.host_stats
    assert stats.env_steps == 40 and stats.episodes == 3, "cumulative counters stay"
    _ingest(stats, **SECOND)
    assert cursor.take(stats, rows_wait_s=0.125) == _expected(SECOND, 0.125)
    assert (stats.lag_sum, stats.lag_max, stats.lag_rows) == (0, 0, 0)
    empty = cursor.take(stats, rows_wait_s=0.0)
    assert empty == RankReport(rows_wait_s=0.0, named_stats={"score": []})


def test_a_take_carries_at_most_the_recent_episodes() -> None:
    stats, cursor = IngestStats(), ReportCursor()
    returns = [float(value) for value in range(RECENT + 30)]
    _ingest(stats, **{**FIRST, "returns": returns, "lengths": list(range(len(returns))), "scores": returns})
    report = cursor.take(stats, rows_wait_s=0.0)
    assert report.episodes == RECENT + 30
    assert report.returns == returns[-RECENT:]
    assert report.lengths == list(range(len(returns)))[-RECENT:]
    assert report.named_stats == {"score": returns[-RECENT:]}


def test_merging_reports_adds_them_to_rank_zeros_counters() -> None:
    leader = IngestStats()
    _ingest(leader, **SECOND)
    merge_report(leader, _expected(FIRST, 0.5))
    merge_report(leader, _expected(SECOND, 0.25))
    assert leader.env_steps == 25 + 40 + 25
    assert leader.agent_steps == 50 + 80 + 50
    assert leader.env_restarts == 1
    assert leader.episodes == 1 + 3 + 1
    assert list(leader.recent_returns) == [9.0, 1.0, 2.5, -3.0, 9.0]
    assert list(leader.recent_lengths) == [30, 10, 11, 12, 30]
    assert list(leader.recent_stats["score"]) == [0.9, 0.1, 0.2, 0.3, 0.9]
    assert dict(leader.host_stats) == {"infer_s": 1.0, "steps": 7.0}
    assert leader.rows_received == 32 + 64 + 32
    assert dict(leader.rows_dropped) == {"stale": 5, "future": 8}
    assert dict(leader.messages_dropped) == {"not_registered": 2}
    assert leader.bytes_received == 1200 + 5000 + 1200
    assert (leader.lag_sum, leader.lag_max, leader.lag_rows) == (3 + 4 + 3, 3, 2 + 4 + 2)


def test_a_fresh_ingest_merging_a_report_holds_exactly_it() -> None:
    follower, leader = IngestStats(), IngestStats()
    _ingest(follower, **FIRST)
    merge_report(leader, ReportCursor().take(follower, rows_wait_s=1.0))
    for name in ("env_steps", "agent_steps", "env_restarts", "episodes", "rows_received", "bytes_received"):
        assert getattr(leader, name) == getattr(follower, name), name
    assert list(leader.recent_returns) == list(follower.recent_returns)
    assert leader.rows_dropped == follower.rows_dropped
    assert (leader.lag_sum, leader.lag_max, leader.lag_rows) == (4, 2, 4)


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
    report = RankReport(rows_wait_s=wait, env_steps=counts[0], agent_steps=counts[1], env_restarts=counts[2],
                        episodes=counts[3], returns=returns, lengths=lengths, named_stats=named, host_stats=host,
                        rows_received=counts[4], rows_dropped=dropped, messages_dropped=rejected,
                        bytes_received=counts[5], lag_sum=counts[6], lag_max=counts[7], lag_rows=counts[8])
    assert RankReport.decode(report.encode()) == report


@pytest.mark.parametrize("value, kind", [([1, 2], "list"), (3, "int"), ("text", "str"), (None, "NoneType")])
def test_decode_refuses_a_payload_that_is_not_a_map(value: object, kind: str) -> None:
    with pytest.raises(ValueError, match=f"rank report must be a map, got {kind}"):
        RankReport.decode(msgpack.packb(value))


def test_decode_names_an_unknown_field() -> None:
    payload = msgpack.packb({"rows_wait_s": 0.0, "surprise": 1})
    with pytest.raises(ValueError, match="rank report: .*'surprise'"):
        RankReport.decode(payload)


def test_decode_names_a_missing_field() -> None:
    payload = msgpack.packb({"env_steps": 3})
    with pytest.raises(ValueError, match="rank report: .*'rows_wait_s'"):
        RankReport.decode(payload)
