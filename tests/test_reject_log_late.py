"""Issue 32: normal events must not look like attacks. A ZeroMQ identity shows as ``peer <hex>``; rows a host sent
before it left are counted under host_left (not as a refusal) and logged at INFO, rate-limited, with how many were
dropped; a token never registered is still a refusal (WARNING)."""

from __future__ import annotations

import logging

from protocol import encode
from protocol.reject_log import RejectLog, peer_identity
from tests.processes import wait_for
from tests.test_ingest import TOKEN, ingest, rows_message  # noqa: F401 (ingest: the fixture)
from tests.test_reject_log import Clock


def test_a_zeromq_identity_shows_as_short_hex():
    assert peer_identity(b"\x00k\x8bEg") == "peer 006b8b4567"
    assert peer_identity(bytes(range(40))) == "peer " + bytes(range(16)).hex() + "..."


def test_expected_drops_are_info_lines_rate_limited_with_how_many_were_dropped(caplog):
    caplog.set_level(logging.INFO, logger="test.reject_log")
    clock = Clock()
    log = RejectLog(logging.getLogger("test.reject_log"), what="ROWS message", interval_s=10.0, clock=clock)
    assert log.expected("host-a", "late rows from actor host 'a', which left")
    assert not log.expected("host-a", "late rows from actor host 'a', which left")
    assert not log.expected("host-a", "late rows from actor host 'a', which left")
    assert log.reject("not_registered", "no token", peer=b"\x00k\x8bEg")  # refusals keep their own interval
    clock.now += 10.0
    assert log.expected("host-a", "late rows from actor host 'a', which left")
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "test.reject_log"]
    assert records == [("INFO", "late rows from actor host 'a', which left (1 message dropped)"),
                       ("WARNING", "refused a ROWS message from peer 006b8b4567 (not_registered): no token"),
                       ("INFO", "late rows from actor host 'a', which left (3 messages dropped)")]


def test_late_rows_of_a_host_that_left_are_counted_but_logged_as_a_normal_event(ingest, caplog):  # noqa: F811
    thread, push = ingest
    caplog.set_level(logging.INFO, logger="sluice.learner")
    push.send_multipart(encode(rows_message([10, 10], marker=1.0)))
    assert wait_for(lambda: thread.counters.totals().rows_received == 2, 10)
    thread.registry.remove(TOKEN)  # the host said BYE; rows it sent before are still on their way
    for _ in range(3):
        push.send_multipart(encode(rows_message([10, 10], marker=1.0)))
    push.send_multipart(encode(rows_message([10, 10], marker=1.0, token="b" * 32)))  # never registered
    assert wait_for(lambda: sum(thread.counters.totals().messages_dropped.values()) == 4, 10)
    assert thread.counters.totals().messages_dropped == {"host_left": 3, "not_registered": 1}
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sluice.learner"]
    assert ("INFO", "late rows from actor host 'test', which left (1 message dropped)") in lines
    refused = [text for level, text in lines if level == "WARNING"]
    assert len(refused) == 1 and "refused a ROWS message from 'test' (not_registered)" in refused[0]
