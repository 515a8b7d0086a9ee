"""The hostile-input soak harness (ops/soak) in the normal suite: a bounded run against real processes must pass
every check, and the same observations held against expectations that cannot hold must fail."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tests.processes import descendants

REPO = Path(__file__).resolve().parents[1]
MESSAGES_PER_SOCKET = 150


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    """The harness's modules (ops/soak is a script folder, like ops/bench) and one bounded run's result."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO / "ops" / "soak"))
        fuzz = importlib.import_module("fuzz")
        report = importlib.import_module("report")
        mutations = importlib.import_module("mutations")
    before = set(Path("/dev/shm").glob("sluice_*"))
    children_before = descendants(os.getpid())
    result = fuzz.run_fuzz(fuzz.FuzzOptions(messages_per_socket=MESSAGES_PER_SOCKET, seed=1,
                                            work_dir=tmp_path_factory.mktemp("soak")))
    leaked = set(Path("/dev/shm").glob("sluice_*")) - before
    leaked |= {f"pid {pid}" for pid in descendants(os.getpid()) - children_before}
    return fuzz, report, mutations, result, leaked


def test_bounded_soak_passes_every_check_and_leaves_nothing_behind(soak):
    _, _, _, result, leaked = soak
    assert result.passed, result.table()
    seen = result.observations
    sockets = {r.socket for r in seen.classes}
    assert sockets == {"data", "control", "pool_control", "pool_server"}
    for socket in sockets:
        assert sum(r.sent for r in seen.classes if r.socket == socket) >= MESSAGES_PER_SOCKET
    assert seen.control_rejected_by_reason, "the learner's metrics count control rejections by reason"
    assert all(r.dropped_by_reason is not None for r in seen.classes if r.socket == "data")
    assert not leaked


def test_the_same_run_fails_against_expectations_that_cannot_hold(soak):
    _, report, _, result, _ = soak
    impossible = report.Expectations(extra_data_drops=1, max_rss_growth_mib=-1.0, min_updates_after=10 ** 9,
                                     max_reply_bytes=0)
    checks = report.run_checks(result.observations, impossible)
    failed = {check.name for check in checks if not check.passed}
    assert "data/random_bytes: every message dropped exactly once" in failed
    assert {"learner memory bounded", "training goes on afterwards"} <= failed
    assert "control/random_bytes: answers bounded" in failed
    assert "FAIL" in report.table(result.observations, checks)


def test_a_hostile_message_the_learner_took_fails_the_accounting(soak):
    _, report, mutations, _, _ = soak
    accepted = report.ClassResult(socket="data", name="semantic", outcome=mutations.Outcome.REJECTED, sent=10,
                                  dropped_messages=9, dropped_by_reason={"bad_action": 9})
    unanswered = report.ClassResult(socket="control", name="random_bytes", outcome=mutations.Outcome.REJECTED,
                                    sent=10, unanswered=1)
    unanswered.errors["bad_protocol"] = 9
    seen = report.Observations(classes=[accepted, unanswered], rss_before_kib=1, rss_after_kib=1, updates_after=5)
    verdicts = {check.name: check.passed for check in report.run_checks(seen, report.Expectations())}
    assert verdicts["data/semantic: every message dropped exactly once"] is False
    assert verdicts["control/random_bytes: every message answered with ERROR"] is False
    assert verdicts["training goes on afterwards"] is True
