"""The hostile-input soak harness (ops/soak) in the normal suite: a bounded run against real processes must pass
every check, and the same observations held against expectations that cannot hold must fail. Then a registered
host that lies (log-probabilities no policy gives, a flood of perfect episodes in no step) against a real
CartPole learner: each lie refused with its reason and counted, training goes on, the run is not "solved"."""

from __future__ import annotations

import importlib
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zmq

from protocol import encode
from tests.processes import descendants

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
MESSAGES_PER_SOCKET = 150
LIAR = "registered-liar"
TARGET_RETURN = 490.0
"""trainer.target_episode_return of the CartPole case: 100 episodes of 500 would "solve" it (the last 100 episodes'
mean), and the liar's valid blocks carry no episodes, so taking the flood would end the run at the next update."""
SMALL_CARTPOLE = ("trainer.num_workers=1", "trainer.batch_size=1024", "trainer.minibatch_size=512",
                  "trainer.forward_pass_minibatch_target_size=16", "trainer.update_epochs=1",
                  "trainer.total_timesteps=1000000000", "run.checkpoint_interval=1000", "network.rows_per_message=8",
                  "network.message_bytes=0",
                  f"trainer.target_episode_return={TARGET_RETURN}")
"""configs/cartpole.yaml scaled down: an update every 64 rows (8 blocks of 8 rows), its plan's envs fitting that."""


def harness_modules(*names: str) -> list:
    """Modules of ops/soak (a script folder), imported with it on sys.path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO / "ops" / "soak"))
        return [importlib.import_module(name) for name in names]


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    """The harness's modules and one bounded run's result."""
    fuzz, report, mutations = harness_modules("fuzz", "report", "mutations")
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


def test_a_registered_host_that_lies_is_refused_counted_and_never_solves_the_run(tmp_path):
    """The liar is the learner's only host: its valid blocks (no episodes) are all the learner trains on, so the
    100 perfect episodes, had they been taken, would be the last 100 and end the run as solved at the next update,
    and a poisoned log-prob taken into a batch would show as rows_dropped_nonfinite."""
    stack_module, genuine = harness_modules("stack", "genuine")
    stack = stack_module.Stack(stack_module.StackOptions(config="configs/cartpole.yaml", overrides=SMALL_CARTPOLE,
                                                         host_workers=0, pool_server=False, work_dir=tmp_path))
    context = zmq.Context()
    sender = None
    rng = np.random.default_rng(0)

    def last() -> dict:
        records = stack_module.read_metrics(stack.run_dir)
        return records[-1] if records else {}

    def feed_until(predicate, timeout_s: float) -> bool:
        """Send the liar's valid blocks, keeping it registered, until ``predicate`` holds."""
        def fed() -> bool:
            sender.keep_alive()
            if sender.data.poll(0, zmq.POLLOUT):
                sender.send(encode(sender.rows_message(sender.shape.sizing.rows, rng)), timeout_s=0)
            return predicate()
        return stack_module.wait_until(fed, timeout_s, interval_s=0.02)

    try:
        stack.start(first_updates=0, timeout_s=120)
        sender = genuine.RegisteredSender(context, control_url=stack.control_url, name=LIAR)
        assert feed_until(lambda: last().get("update", 0) >= 1, 60), stack.log("learner")
        before = last()
        control = sender.rows_message(4, rng)  # the same sender's block unchanged is taken
        below_floor = sender.rows_message(4, rng)
        below_floor.arrays["logprobs"][0, 2] = -100.0  # the floor of one action's log-prob is about -87.34
        absurd = sender.rows_message(4, rng)
        absurd.arrays["logprobs"][...] = -1e6  # within network.max_abs_value, so only the log-prob bound refuses it
        flood = sender.rows_message(4, rng)  # 100 perfect episodes in a message that counts no agent step
        flood.fields.update(agent_steps=0, env_steps=100, episode_returns=[500.0] * 100, episode_lengths=[500] * 100)
        for message in (control, below_floor, absurd, flood):
            assert sender.send(encode(message), timeout_s=30), "the learner's data socket took nothing"
        assert feed_until(lambda: last()["messages_dropped"] - before["messages_dropped"] >= 3, 30), \
            stack.log("learner")
        counted = last()["update"]
        assert feed_until(lambda: last()["update"] >= counted + 2, 30), stack.log("learner")
        after = last()
        by_reason = Counter(after["messages_dropped_by_reason"]) - Counter(before["messages_dropped_by_reason"])
        assert dict(by_reason) == {"bad_logprob": 2, "bad_counter": 1}
        assert after["messages_dropped"] - before["messages_dropped"] == 3  # the control block was not dropped
        since = [r for r in stack_module.read_metrics(stack.run_dir) if r["update"] > before["update"]]
        assert len(since) >= 3
        assert [(r["skipped_steps"], r["rows_dropped_nonfinite"]) for r in since] == [(0, 0)] * len(since)
        assert stack.learner().poll() is None, stack.log("learner")  # not ended as solved
        assert after["episodes"] == 0 and after.get("episode_return_mean") is None
        log = stack.log("learner")
        assert "solved" not in log and "target return reached" not in log
        assert re.search(rf"refused a ROWS message from '{LIAR}' \(bad_logprob\): array 'logprobs' has -100\.0 at "
                         rf"index \(0, 2\); a policy over .+ gives log-probabilities in \[-87\.3375, 0\.001\]",
                         log), log
        assert re.search(rf"refused a ROWS message from '{LIAR}' \(bad_counter\): ROWS field 'episode_returns' is "
                         rf"100, more than (\d+) \(agent_steps 0 plus \1 agent slots", log), log
        sender.keep_alive()
        assert sender.replies_refused == {}  # still registered: no heartbeat was refused
        assert stack.dead() == []
    finally:
        if sender is not None:
            sender.close()
        context.destroy(linger=0)
        leftovers = stack.close()
    assert leftovers.processes == () and leftovers.shm_segments == ()
