"""The rate-limited log of refused messages: one line per reason per interval, the next line says how many were
left out, and whatever a peer sent is shown as a short repr."""

from __future__ import annotations

import logging

import pytest

from protocol.reject_log import DETAIL_CHARS, PEER_TEXT_CHARS, RejectLog, clip, peer_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.WARNING, logger="test.reject_log")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "test.reject_log"]


def test_one_line_per_reason_per_interval_then_the_count_of_those_left_out(logged):
    clock = Clock()
    log = RejectLog(logging.getLogger("test.reject_log"), what="ROWS message", interval_s=10.0, clock=clock)
    assert log.reject("bad_flag", "dones has 2", sender="host-a")
    assert log.reject("bad_action", "action 7")  # another reason has its own interval
    for _ in range(5):
        clock.now += 1.0
        assert not log.reject("bad_flag", "dones has 2", sender="host-a")
    clock.now = 100.0 + 10.0
    assert log.reject("bad_flag", "dones has 3", sender="host-b")
    assert not log.reject("bad_flag", "again")
    lines = logged()
    assert lines == [
        "refused a ROWS message from 'host-a' (bad_flag): dones has 2",
        "refused a ROWS message (bad_action): action 7",
        "refused a ROWS message from 'host-b' (bad_flag): dones has 3 (5 more refused for this reason since its "
        "last line, not logged)",
    ]


def test_peer_supplied_text_is_a_short_repr_and_details_are_cut(logged):
    log = RejectLog(logging.getLogger("test.reject_log"), what="control message", interval_s=0.0, clock=Clock())
    log.reject("bad_field", "x" * 5000, sender="\x1b[2J" + "n" * 500)
    (line,) = logged()
    assert "\x1b" not in line and "'\\x1b[2J" in line
    assert len(line) < PEER_TEXT_CHARS + DETAIL_CHARS + 80
    assert peer_text("a" * 200).endswith("...") and len(peer_text("a" * 200)) == PEER_TEXT_CHARS
    assert peer_text(b"\x00") == "b'\\x00'" and clip("short", 10) == "short"
    assert clip("bell\x07", 20) == "bell\\x07" and clip("a" * 20, 10) == "aaaaaaa..."
    with pytest.raises(ValueError, match="interval_s must be a number >= 0"):
        RejectLog(logging.getLogger("test.reject_log"), what="x", interval_s=-1.0)
