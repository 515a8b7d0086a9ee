"""The learner's ingest thread over a real PUSH/PULL pair: stale rows are dropped and counted, lag stats
are kept, the batch holds exactly the fresh rows, and rows from anyone but a registered host are refused."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from envs.base import EnvSpec
from envs.spaces import ActionSpace
from envs.rows import row_layout
from learner.serve.ingest import Ingest
from learner.serve.ingest_counters import host_timing
from learner.serve import row_checks
from learner.serve.senders import Sender, SenderRegistry
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode
from protocol.curve import ZapGuard, load_client_curve, load_server_curve
from protocol.keys import main as keys_main
from tests.processes import free_port_triple, wait_for

HORIZON, OBS, SEGMENTS, ROWS_PER_MESSAGE = 5, 3, 6, 8
SPEC = EnvSpec(num_agents=1, obs_shape=(OBS,), obs_dtype="float32", action=ActionSpace.discrete(2))
LAYOUT = row_layout(SPEC, horizon=HORIZON, state_size=0)
TOKEN = "a" * 32
SENDER = Sender(name="test", token=TOKEN, curve_key=None, num_envs=4, agent_slots=4)


def rows_message(versions: list[int], marker: float, token: str | None = TOKEN) -> Message:
    n = len(versions)
    arrays = {name: np.zeros_like(array) for name, array in LAYOUT.allocate(n).items()}
    arrays["obs"][:] = marker
    arrays["rewards"][:] = np.arange(n, dtype=np.float32)[:, None] + marker
    arrays["versions"][:] = versions
    return Message(type=MessageType.ROWS, sender="test", version=max(versions),
                   fields={"num_rows": n, "episode_returns": [1.0], "episode_lengths": [3], "env_steps": n,
                           "agent_steps": n, **({} if token is None else {"token": token})},
                   arrays=arrays)


@contextlib.contextmanager
def ingest_and_push(*, start: bool):
    """An Ingest (started or not) and a PUSH socket connected to it; everything closed afterwards."""
    context = zmq.Context()
    stop = threading.Event()
    port = free_port_triple()
    registry = SenderRegistry()
    registry.add(SENDER)
    thread = Ingest(context=context, endpoint=f"tcp://127.0.0.1:{port}", segments=SEGMENTS, env=SPEC,
                    horizon=HORIZON, state_size=0, max_policy_lag=2, hwm=4, buffer_bytes=65536, limits=Limits(),
                    stop=stop, registry=registry, rows_per_message=ROWS_PER_MESSAGE, max_abs_value=1e6)
    thread.set_policy_version(10)
    if start:
        thread.start()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield thread, push
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join(timeout=5)
        else:
            thread.socket.close(linger=0)
        push.close()
        context.term()


@pytest.fixture
def ingest():
    with ingest_and_push(start=True) as pair:
        yield pair


def full_slot(thread: Ingest) -> int:
    """The index of the next filled batch buffer (the update loop's side of the ingest)."""
    index = thread.slots.next_full(timeout=10)
    assert index is not None, "no batch buffer filled within 10 s"
    return index


def test_stale_rows_are_dropped_and_counted(ingest):
    thread, push = ingest
    # lags 0, 1, 2 are kept; 3 and 7 are beyond max_policy_lag = 2
    push.send_multipart(encode(rows_message([10, 9, 7, 8, 3], marker=100.0)))
    push.send_multipart(encode(rows_message([10, 10, 10], marker=200.0)))
    index = full_slot(thread)
    batch = thread.slots.buffers[index].arrays
    assert batch["versions"].tolist() == [10, 9, 8, 10, 10, 10]
    assert batch["rewards"][:, 0].tolist() == [100.0, 101.0, 103.0, 200.0, 201.0, 202.0]
    totals = thread.counters.totals()
    assert totals.rows_dropped["stale"] == 2
    assert totals.rows_received == 6
    assert totals.lag_max == 2
    assert totals.lag_sum == 0 + 1 + 2 and totals.lag_rows == 6
    assert totals.episodes == 2 and totals.env_steps == 8


def test_message_with_only_stale_rows_still_counts_its_episodes(ingest):
    thread, push = ingest
    push.send_multipart(encode(rows_message([1, 2], marker=0.0)))
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    index = full_slot(thread)
    assert thread.slots.buffers[index].arrays["versions"].tolist() == [10] * SEGMENTS
    totals = thread.counters.totals()
    assert totals.rows_dropped["stale"] == 2
    assert totals.episodes == 2  # the stale rows' episodes still happened


def test_recurrent_state_width_is_checked(ingest):
    thread, push = ingest
    bad = rows_message([10, 10], marker=1.0)
    arrays = dict(bad.arrays)
    arrays["states"] = np.zeros((2, 4), dtype=np.float32)  # the learner's policy has no recurrent state
    push.send_multipart(encode(Message(type=bad.type, sender=bad.sender, version=bad.version,
                                       fields=bad.fields, arrays=arrays)))
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    full_slot(thread)
    totals = thread.counters.totals()
    assert sum(totals.messages_dropped.values()) == 1


def with_host_stats(message: Message, host_stats: dict) -> Message:
    return Message(type=message.type, sender=message.sender, version=message.version,
                   fields={**message.fields, "host_stats": host_stats}, arrays=message.arrays)


def test_host_stats_are_summed_and_turned_into_inference_figures(ingest):
    thread, push = ingest
    stats = {"inference_batches": 4, "inference_agents": 100, "inference_s": 0.002, "act_s": 0.004,
             "worker_wait_s": 1.0, "worker_step_s": 3.0}
    push.send_multipart(encode(with_host_stats(rows_message([10] * 3, marker=1.0), stats)))
    push.send_multipart(encode(with_host_stats(rows_message([10] * 3, marker=2.0), stats)))
    full_slot(thread)
    totals = thread.counters.totals()
    summed = dict(totals.host_stats)
    assert summed["inference_agents"] == 200 and summed["worker_step_s"] == 6.0
    timing = host_timing(summed)
    assert timing["inference_batch_agents_mean"] == 25.0
    assert timing["inference_ms_per_batch"] == pytest.approx(0.5)
    assert timing["act_ms_per_batch"] == pytest.approx(1.0)
    assert timing["worker_wait_fraction"] == pytest.approx(0.25)
    assert host_timing({}) == {"inference_batch_agents_mean": None, "inference_ms_per_batch": None,
                               "act_ms_per_batch": None, "worker_wait_fraction": None}


@pytest.mark.parametrize("host_stats, message", [
    ({"inference_batches": 1, "gpu_s": 1.0}, "host_stats has unknown keys ['gpu_s']"),
    ({"inference_s": -1.0}, "host_stats['inference_s'] must be a finite number >= 0"),
    ({"worker_wait_s": float("nan")}, "host_stats['worker_wait_s'] must be a finite number >= 0"),
    ({"act_s": True}, "host_stats['act_s'] must be a finite number >= 0"),
])
def test_bad_host_stats_reject_the_message_and_are_counted(ingest, host_stats, message):
    thread, push = ingest
    bad = with_host_stats(rows_message([10, 10], marker=1.0), host_stats)
    with pytest.raises(ProtocolError, match=re.escape(message)):
        row_checks.host_stats(decode(encode(bad)))
    push.send_multipart(encode(bad))
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    index = full_slot(thread)
    assert thread.slots.buffers[index].arrays["rewards"][:, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    totals = thread.counters.totals()
    assert totals.messages_dropped["bad_field"] == 1
    assert not totals.host_stats


def test_rows_from_a_newer_policy_than_the_learner_are_dropped_as_future(ingest):
    """A host still acting with a crashed run's newer weights after the learner resumed from an older checkpoint."""
    thread, push = ingest
    push.send_multipart(encode(rows_message([12, 11, 10], marker=1.0)))
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    index = full_slot(thread)
    assert thread.slots.buffers[index].arrays["rewards"][:, 0].tolist() == [3.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    totals = thread.counters.totals()
    assert totals.rows_dropped["future"] == 2 and totals.rows_dropped["stale"] == 0
    assert totals.lag_max == 0


def test_rows_left_over_from_a_block_start_the_next_batch_and_never_touch_the_ready_one(ingest):
    thread, push = ingest
    push.send_multipart(encode(rows_message([10] * 4, marker=0.0)))
    push.send_multipart(encode(rows_message([10] * 5, marker=10.0)))  # 2 rows fill batch one, 3 start batch two
    push.send_multipart(encode(rows_message([10] * 3, marker=20.0)))
    first = full_slot(thread)
    second = full_slot(thread)
    assert first != second
    assert thread.slots.buffers[first].arrays["rewards"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0]
    assert thread.slots.buffers[second].arrays["rewards"][:, 0].tolist() == [12.0, 13.0, 14.0, 20.0, 21.0, 22.0]


@pytest.fixture
def unstarted():
    """An ingest not started yet, and a PUSH socket to it."""
    with ingest_and_push(start=False) as pair:
        yield pair


def test_a_snapshot_hands_over_the_counters_and_restarts_the_since_last_take_figures(ingest):
    thread, push = ingest
    stats = {"inference_batches": 4, "inference_agents": 100, "inference_s": 0.002}
    push.send_multipart(encode(with_host_stats(rows_message([10, 9, 7, 8, 3], marker=1.0), stats)))
    push.send_multipart(encode(rows_message([10, 10, 10], marker=2.0)))
    full_slot(thread)
    snapshot = thread.counters.take_snapshot()
    assert (snapshot.env_steps, snapshot.agent_steps, snapshot.episodes) == (8, 8, 2)
    assert snapshot.recent_returns == (1.0, 1.0) and snapshot.recent_lengths == (3, 3)
    assert (snapshot.rows_received, snapshot.rows_dropped_stale, snapshot.rows_dropped_future) == (6, 2, 0)
    assert snapshot.policy_lag_mean == 0.5 and snapshot.policy_lag_max == 2
    assert snapshot.host_timing["inference_batch_agents_mean"] == 25.0
    assert snapshot.messages_dropped == 0 and snapshot.env_restarts == 0 and snapshot.episode_stat_means == {}
    assert snapshot.messages_dropped_by_reason == {}
    again = thread.counters.take_snapshot()
    assert (again.env_steps, again.episodes, again.recent_returns, again.rows_dropped_stale) == (8, 2, (1.0, 1.0), 2)
    assert again.policy_lag_mean == 0.0 and again.policy_lag_max == 0
    assert set(again.host_timing.values()) == {None}


def test_resume_totals_continue_a_checkpoints_counts_and_only_before_start(unstarted):
    thread, push = unstarted
    thread.resume_totals(env_steps=1000, agent_steps=3000, episodes=7, recent_returns=[5.0] * 100)
    thread.start()
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=1.0)))
    full_slot(thread)
    snapshot = thread.counters.take_snapshot()
    assert (snapshot.env_steps, snapshot.agent_steps, snapshot.episodes) == (1006, 3006, 8)
    assert snapshot.recent_returns == (5.0,) * 99 + (1.0,)
    with pytest.raises(RuntimeError, match="after start"):
        thread.resume_totals(env_steps=0, agent_steps=0, episodes=0, recent_returns=[])


def with_fields(message: Message, **fields) -> Message:
    return Message(type=message.type, sender=message.sender, version=message.version,
                   fields={**message.fields, **fields}, arrays=message.arrays)


def test_rows_without_a_registered_token_are_dropped_counted_by_reason_and_logged_once(ingest, caplog):
    thread, push = ingest
    caplog.set_level(logging.WARNING, logger="sluice.learner")
    push.send_multipart(encode(rows_message([10, 10], marker=1.0, token=None)))
    push.send_multipart(encode(rows_message([10, 10], marker=1.0, token="b" * 32)))
    push.send_multipart(encode(rows_message([10, 10], marker=1.0, token=TOKEN)))
    assert wait_for(lambda: thread.counters.totals().rows_received == 2, 10)
    thread.registry.remove(TOKEN)  # the host said BYE: its rows are dropped from now on (as rows of a host that left)
    for _ in range(2):
        push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=1.0)))
    assert wait_for(lambda: sum(thread.counters.totals().messages_dropped.values()) == 4, 10)
    thread.registry.add(SENDER)
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    index = full_slot(thread)
    assert thread.slots.buffers[index].arrays["rewards"][:, 0].tolist() == [1.0, 2.0, 5.0, 6.0, 7.0, 8.0]
    snapshot = thread.counters.take_snapshot()
    assert snapshot.messages_dropped_by_reason == {"not_registered": 2, "host_left": 2}
    assert snapshot.messages_dropped == 4
    assert snapshot.env_steps == 2 + SEGMENTS  # nothing of a refused message is counted
    lines = [r.getMessage() for r in caplog.records if "refused a ROWS message" in r.getMessage()]
    assert len(lines) == 1 and "(not_registered)" in lines[0] and "'test'" in lines[0]


def test_rows_under_another_curve_key_than_the_registration_are_dropped(ingest):
    thread, push = ingest
    thread.registry.add(Sender(name="keyed", token="k" * 32, curve_key="x" * 40, num_envs=4, agent_slots=4))
    push.send_multipart(encode(rows_message([10, 10], marker=1.0, token="k" * 32)))  # no CURVE here: no key
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    full_slot(thread)
    assert thread.counters.take_snapshot().messages_dropped_by_reason == {"identity_mismatch": 1}


@pytest.mark.parametrize("change, reason", [
    (lambda m: rows_message([10] * (ROWS_PER_MESSAGE + 1), marker=1.0), "too_large"),
    (lambda m: with_fields(m, agent_steps=2 ** 63 - 1), "bad_counter"),
    (lambda m: with_fields(m, env_steps=-1), "bad_counter"),
    (lambda m: with_fields(m, episode_returns=[500.0] * 100, episode_lengths=[1] * 100), "bad_counter"),
    (lambda m: with_fields(m, episode_lengths=[0]), "bad_episode"),
    (lambda m: with_fields(m, episode_returns=[1e30]), "bad_episode"),
], ids=["too_large", "huge_agent_steps", "negative_env_steps", "100_returns_of_500", "zero_length", "huge_return"])
def test_messages_with_impossible_counts_are_dropped_and_count_nothing(ingest, change, reason):
    thread, push = ingest
    push.send_multipart(encode(change(rows_message([10, 10], marker=1.0))))
    push.send_multipart(encode(rows_message([10] * SEGMENTS, marker=5.0)))
    full_slot(thread)
    snapshot = thread.counters.take_snapshot()
    assert snapshot.messages_dropped_by_reason == {reason: 1}
    assert (snapshot.agent_steps, snapshot.episodes) == (SEGMENTS, 1)


def curve_ingest(keys: Path, clients: tuple[str, ...], *,
                 ipc_path: Path | None = None) -> tuple[zmq.Context, threading.Event, ZapGuard, Ingest]:
    """Server keys under ``keys`` and client keys for ``clients`` (all allowed), and an Ingest (not started) under
    CURVE whose registry holds TOKEN under the first client's key: its context, stop event and ZAP guard too."""
    assert keys_main(["server", str(keys)]) == 0
    (keys / "allowed").mkdir()
    for name in clients:
        assert keys_main(["client", str(keys), name]) == 0
        shutil.copy(keys / f"{name}.key", keys / "allowed" / f"{name}.key")
    host_key = zmq.auth.load_certificate(keys / f"{clients[0]}.key")[0].decode("ascii")
    registry = SenderRegistry()
    registry.add(Sender(name=clients[0], token=TOKEN, curve_key=host_key, num_envs=4, agent_slots=4))
    context, stop = zmq.Context(), threading.Event()
    curve = load_server_curve(keys / "server.key_secret", keys / "allowed")
    guard = ZapGuard(context, curve)
    thread = Ingest(context=context, endpoint="tcp://127.0.0.1:*", segments=SEGMENTS, env=SPEC, horizon=HORIZON,
                    state_size=0, max_policy_lag=2, hwm=4, buffer_bytes=65536, limits=Limits(), stop=stop,
                    registry=registry, rows_per_message=ROWS_PER_MESSAGE, max_abs_value=1e6, curve=curve,
                    ipc_path=ipc_path)
    thread.set_policy_version(10)
    return context, stop, guard, thread


def test_with_curve_rows_must_arrive_under_the_key_their_token_registered_with(tmp_path):
    keys = tmp_path / "keys"
    context, stop, guard, thread = curve_ingest(keys, ("host", "other"))
    endpoint = thread.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
    pushes = []
    try:
        thread.start()
        for name in ("other", "host"):  # the other host is allowed to connect but holds not this token's key
            push = context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            load_client_curve(keys / "server.key", keys / f"{name}.key_secret").apply(push)
            push.connect(endpoint)
            pushes.append(push)
        pushes[0].send_multipart(encode(rows_message([10] * 3, marker=1.0)))
        assert wait_for(lambda: thread.counters.take_snapshot().messages_dropped == 1, 10)
        pushes[1].send_multipart(encode(rows_message([10] * 3, marker=5.0)))
        pushes[1].send_multipart(encode(rows_message([10] * 3, marker=8.0)))
        index = full_slot(thread)
        assert thread.slots.buffers[index].arrays["rewards"][:, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
        assert thread.counters.take_snapshot().messages_dropped_by_reason == {"identity_mismatch": 1}
    finally:
        stop.set()
        thread.join(timeout=5)
        for push in pushes:
            push.close(linger=0)
        guard.stop()
        context.term()
