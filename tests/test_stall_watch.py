"""The learner's stall detector: the rule (no update for stall_factor usual intervals, at least stall_min_s, while
hosts are registered), the cause it names from the ingest's counts, and a real stall: a host whose env workers are
all SIGSTOPped keeps heartbeating but sends no rows."""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import pytest

from learner.serve.ingest_counters import IngestTotals
from learner.monitor.stall_watch import StallRule, StallWatch, describe_cause
from tests.processes import Run, metrics, wait_for


def totals(*, rows: int = 0, stale: int = 0, refused: dict | None = None, nbytes: int = 0) -> IngestTotals:
    return IngestTotals(env_steps=0, agent_steps=0, episodes=0, env_restarts=0, rows_received=rows,
                        rows_dropped={"stale": stale}, messages_dropped=refused or {}, bytes_received=nbytes)


class Fake:
    """The loop's side of a StallWatch: a clock, the hosts, the ingest's totals, and what it said."""

    def __init__(self, rule: StallRule) -> None:
        self.now, self.host_count, self.counts, self.lines, self.gauge = 0.0, 0, totals(), [], []
        self.watch = StallWatch(rule, totals=lambda: self.counts, hosts=lambda: self.host_count,
                                filling=lambda: 0.25, say=self.lines.append,
                                gauges=lambda **values: self.gauge.append(values), clock=lambda: self.now)

    def at(self, now: float) -> None:
        self.now = now
        self.watch.waiting()

    def update_at(self, now: float) -> None:
        self.now = now
        self.watch.updated()


def test_a_stall_is_said_once_after_factor_usual_intervals_and_its_end_once():
    fake = Fake(StallRule(factor=10.0, min_s=5.0))
    fake.host_count = 1
    for t in range(1, 6):  # one update a second: the usual interval is 1 s
        fake.update_at(float(t))
    fake.counts = totals(nbytes=100, refused={"not_registered": 40})
    fake.at(14.9)
    assert fake.lines == []
    fake.at(15.1)
    fake.at(30.0)
    assert fake.lines == ["learner: stalled: no update for 10 s (usually every 1.0 s) with 1 actor host registered: "
                          "every ROWS message was refused (not_registered 40): rows from a registration the learner "
                          "no longer holds; such hosts register again at their next heartbeat"]
    assert fake.gauge[-1] == {"stalled": True, "seconds_since_update": 25.0}
    fake.update_at(31.0)
    assert fake.lines[-1].startswith("learner: updates resumed after 26 s without one (stalled: every ROWS message")
    assert fake.gauge[-1] == {"stalled": False, "seconds_since_update": 0.0}


def test_no_hosts_is_waiting_not_a_stall_and_the_first_update_gets_five_times_the_minimum():
    fake = Fake(StallRule(factor=10.0, min_s=2.0))
    fake.at(100.0)
    assert fake.lines == []
    fake.host_count = 2
    fake.at(200.0)  # hosts arrive: the first update's bound (5 x 2 s) counts from here
    fake.at(209.0)
    assert fake.lines == []
    fake.at(210.5)
    assert fake.lines == ["learner: stalled: no update for 10 s (none yet) with 2 actor hosts registered: no rows "
                          "arrived from the 2 registered actor hosts (hosts paused or stuck, envs hanging, or the data "
                          "port unreachable)"]


def test_the_cause_names_refusals_stale_rows_or_a_slow_trickle():
    before = totals(rows=10, stale=1, refused={"non_finite": 3, "bad_field": 1}, nbytes=1000)
    refused = totals(rows=10, stale=1, refused={"non_finite": 50, "bad_field": 2, "not_registered": 1}, nbytes=9000)
    assert describe_cause(before, refused, hosts=1, filling=0.0, waited_s=60) == (
        "every ROWS message was refused (non_finite 47, bad_field 1, not_registered 1): an env or policy emits NaN "
        "or inf")
    stale = totals(rows=12, stale=90, nbytes=9000)
    assert describe_cause(before, stale, hosts=1, filling=0.0, waited_s=60) == (
        "rows arrive too old to train on (89 dropped as stale, 2 accepted; see max_policy_lag)")
    slow = totals(rows=40, stale=1, nbytes=9000)
    assert describe_cause(before, slow, hosts=1, filling=0.3, waited_s=61) == (
        "rows arrive slowly: the batch is 30% full after 61 s (30 rows accepted)")


def test_rows_that_stopped_early_in_the_wait_are_no_rows_not_a_slow_trickle():
    """A host whose envs stop still ships the rows it had queued, just after the last update: then nothing."""
    fake = Fake(StallRule(factor=10.0, min_s=5.0))
    fake.host_count = 1
    for t in range(1, 6):
        fake.update_at(float(t))
    fake.counts = totals(rows=256, nbytes=100)
    fake.at(5.2)  # the queued rows arrive
    fake.at(15.1)
    assert fake.lines == ["learner: stalled: no update for 10 s (usually every 1.0 s) with 1 actor host registered: no "
                          "rows arrived from the 1 registered actor host (hosts paused or stuck, envs hanging, or the "
                          "data port unreachable); the last came 9.9 s ago, 256 rows accepted before"]
    slow = Fake(StallRule(factor=10.0, min_s=5.0))
    slow.host_count = 1
    for t in range(1, 6):
        slow.update_at(float(t))
    for k, t in enumerate((7.0, 10.0, 14.0)):  # still coming in the second half of the wait: a slow trickle
        slow.counts = totals(rows=10 * (k + 1), nbytes=100 * (k + 1))
        slow.at(t)
    slow.at(15.1)
    assert slow.lines[-1].endswith("rows arrive slowly: the batch is 25% full after 10 s (30 rows accepted)")


def _metric(url: str, name: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


@pytest.mark.integration
def test_a_host_whose_workers_are_all_stopped_is_a_stall_said_in_one_line_and_a_gauge(tmp_path):
    run = Run(tmp_path, "--set", "trainer.target_episode_return=null", "--set", "run.stall_min_s=1",
              "--set", "run.stall_factor=3", "--set", "env.step_timeout_s=600")
    try:
        learner = run.learner()
        host = run.actors(1)
        workers = run.note_workers(host)
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 5, 120), run.log("learner.log")
        url = re.search(r"Prometheus metrics at (\S+/metrics)", run.log("learner.log")).group(1)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert wait_for(lambda: "learner: stalled" in run.log("learner.log"), 30), run.log("learner.log")
            assert wait_for(lambda: _metric(url, "sluice_learner_stalled") == 1.0, 10)
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        line = [text for text in run.log("learner.log").splitlines() if "learner: stalled" in text]
        assert len(line) == 1 and ("with 1 actor host registered: no rows arrived from the 1 registered actor host "
                                   "(hosts paused or stuck, envs hanging, or the data port unreachable)") in line[0], line
        assert wait_for(lambda: "learner: updates resumed after" in run.log("learner.log"), 30), run.log("learner.log")
        assert wait_for(lambda: _metric(url, "sluice_learner_stalled") == 0.0, 10)
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 143
        assert host.wait(timeout=30) == 0
        run.assert_clean()
    finally:
        run.close()
