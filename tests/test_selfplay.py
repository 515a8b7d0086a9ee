"""Self-play plumbing: the pool server's answers, the actor host's snapshot cache (each unique snapshot
downloaded once), seats, one forward pass per unique opponent, only the learner's seats recorded, and
opponents switching at episode ends."""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import pytest
import torch

from actors.assembler import RowAssembler
from envs.base import StepBuffers
from envs.builtin.connect_four.game import ConnectFourVec
from actors.inference import Inference
from actors.opponent_batch import SnapshotBatch
from actors.opponents import OpponentAssignment, OpponentCache, Opponents, learner_seats, policy_from_file
from actors.pool_client import PoolClient
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import SlotLayout
from actors.stepper import GroupStepper
from configs.schema import ModelSection, SelfPlaySection
from learner.pool.store import SnapshotStore
from learner.pool.server import MAX_ENVS_PER_REQUEST, PoolService, serve
from policies.factory import make_policy, state_arrays
from protocol import Limits, Message, MessageType, ProtocolError, encode
from protocol.endpoints import parse_endpoint
from tests.processes import free_port_triple

SPEC = ConnectFourVec.SPEC
MODEL = ModelSection(hidden_size=16, num_layers=1)


def random_weights(seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return state_arrays(make_policy(SPEC, MODEL))


@pytest.fixture
def service(tmp_path):
    store = SnapshotStore(tmp_path / "pool")
    for k in range(12):
        store.add(random_weights(k), update=10 * k, policy_version=10 * k)
    return PoolService(store, SelfPlaySection(enabled=True), seed=0)


def ask(service: PoolService, kind: MessageType, **fields) -> Message:
    return service.handle(Message(type=kind, sender="test", fields=fields))


def test_pool_server_draws_one_snapshot_per_env_and_serves_verified_files(service):
    reply = ask(service, MessageType.GET_OPPONENTS, num_envs=16)
    positions = reply.arrays["env_opponent"].tolist()
    digests = [reply.fields["digests"][p] for p in positions]
    indices = [reply.fields["indices"][p] for p in positions]
    assert len(digests) == 16 and reply.fields["num_snapshots"] == 12 and reply.fields["alternation"] == 1
    assert all(service.store.snapshot(i).hash == d for i, d in zip(indices, digests))
    assert all(0 <= i < 12 for i in indices)
    snapshot = ask(service, MessageType.GET_SNAPSHOT, digest=digests[0])
    data = snapshot.arrays["file"].tobytes()
    assert hashlib.sha256(data).hexdigest() == digests[0]
    arrays = policy_from_file(data, digests[0])
    assert set(arrays) == set(random_weights(0))
    stats = service.take_stats()
    assert stats["pool_snapshots"] == 12 and stats["opponents_unique_mean"] == len(set(digests))


def test_pool_server_shared_draw_and_errors(service, tmp_path):
    service.section = SelfPlaySection(enabled=True, per_env_opponent_sampling=False)
    shared = ask(service, MessageType.GET_OPPONENTS, num_envs=32)
    assert len(shared.fields["digests"]) == 1 and shared.arrays["env_opponent"].tolist() == [0] * 32
    with pytest.raises(ProtocolError, match="num_envs must be in"):
        ask(service, MessageType.GET_OPPONENTS, num_envs=0)
    with pytest.raises(ProtocolError, match="64 lowercase hex"):
        ask(service, MessageType.GET_SNAPSHOT, digest="nope")
    with pytest.raises(ProtocolError, match="missing"):
        ask(service, MessageType.GET_SNAPSHOT, digest="0" * 64)
    empty = PoolService(SnapshotStore(tmp_path / "empty"), SelfPlaySection(enabled=True), seed=0)
    with pytest.raises(ProtocolError, match="no snapshot yet"):
        ask(empty, MessageType.GET_OPPONENTS, num_envs=4)


class CountingFetch:
    """Serves files from a store and counts downloads per digest."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store, self.calls = store, []

    def __call__(self, digest: str) -> bytes:
        self.calls.append(digest)
        return self.store.read_bytes(digest)


def test_cache_downloads_each_unique_snapshot_once_and_stays_bounded(service):
    fetch = CountingFetch(service.store)
    cache = OpponentCache(SPEC, MODEL, capacity=4, fetch=fetch, seed=0)
    opponents = Opponents(num_envs=16, num_agents=2, cache=cache)
    reply = ask(service, MessageType.GET_OPPONENTS, num_envs=16)
    first = [reply.fields["digests"][p] for p in reply.arrays["env_opponent"].tolist()]
    opponents.assign(OpponentAssignment(alternation=1, digests=tuple(first), indices=(0,) * 16))
    assert sorted(fetch.calls) == sorted(set(first))  # unique ones, once each
    opponents.assign(OpponentAssignment(alternation=2, digests=tuple(first), indices=(0,) * 16))
    assert len(fetch.calls) == len(set(first))  # all cached: nothing downloaded again
    for k in range(5):  # alternations over other snapshots: the cache keeps what is in use plus <= capacity
        digests = (service.store.snapshot(k).hash,) * 16
        in_use = set(opponents.env_digests.tolist()) | set(digests)
        opponents.assign(OpponentAssignment(alternation=3 + k, digests=digests, indices=(k,) * 16))
        assert len(cache.policies) <= max(4, len(in_use))  # what is in use stays, beyond that at most 4
        opponents.episodes_ended(np.arange(32))
    assert len(cache.policies) <= 4 and len(fetch.calls) == len(set(first) | {service.store.snapshot(k).hash
                                                                              for k in range(5)})
    with pytest.raises(ValueError, match="refusing them"):
        policy_from_file(b"not the file", first[0])


def test_seats_alternate_between_envs():
    seats = learner_seats(4, 2).reshape(4, 2)
    assert seats.tolist() == [[True, False], [False, True], [True, False], [False, True]]
    assert learner_seats(3, 3).reshape(3, 3).tolist() == [[True, False, False], [False, True, False],
                                                          [False, False, True]]


def test_one_batched_forward_pass_for_all_snapshots_and_only_learner_seats_recorded(service, monkeypatch):
    num_envs = 16
    cache = OpponentCache(SPEC, MODEL, capacity=16, fetch=CountingFetch(service.store), seed=0)
    opponents = Opponents(num_envs=num_envs, num_agents=2, cache=cache)
    digests = tuple(service.store.snapshot(k % 10).hash for k in range(num_envs))  # 10 unique among 16 envs
    opponents.assign(OpponentAssignment(alternation=1, digests=digests, indices=tuple(k % 10 for k in range(16))))
    passes, batched = [], []
    original, original_batch = Inference.decide, SnapshotBatch.act
    monkeypatch.setattr(Inference, "decide", lambda self, obs, *a: passes.append((id(self), len(obs)))
                        or original(self, obs, *a))
    monkeypatch.setattr(SnapshotBatch, "act", lambda self, stacked, chosen, obs_groups, masks: batched.append(
        [len(group) for group in obs_groups]) or original_batch(self, stacked, chosen, obs_groups, masks))
    learner = Inference(SPEC, MODEL, seed=1)
    total = num_envs * 2
    assembler = RowAssembler(num_agents=total, num_rows=64 * total, horizon=5, obs_shape=SPEC.obs_shape,
                             obs_dtype=SPEC.obs_dtype, state_size=0, action_shape=(), action_dtype="int32",
                             mask_size=SPEC.mask_size)
    layout = SlotLayout(workers=1, groups=1, envs_per_group=num_envs, agents_per_env=2)
    stepper = GroupStepper(env_spec=SPEC, layout=layout, inference=learner, assembler=assembler,
                           states=AgentStates(total, 0), opponents=opponents)
    env = ConnectFourVec(num_envs)
    buffers = StepBuffers.allocate(SPEC, num_envs)
    env.reset(buffers, seed=0)
    report = RowsReport.for_stats(SPEC.episode_stats)
    group = layout.group_view(0, 0, buffers)
    stepper.act([group], report)
    # first move: slot 0 of each env is active; the learner sits there in even envs, opponents in odd ones
    learner_passes = [n for who, n in passes if who == id(learner)]
    assert learner_passes == [8] and report.agent_steps == 8 and len(passes) == 1
    odd_unique = len({digests[e] for e in range(1, num_envs, 2)})
    assert len(batched) == 1 and len(batched[0]) == odd_unique and sum(batched[0]) == 8  # one pass, every snapshot
    legal = buffers.action_mask[np.arange(0, 2 * num_envs, 2), buffers.actions[::2]]
    assert legal.all()
    # play many moves: every recorded agent is a learner seat; returns come from learner seats only
    for _ in range(200):
        env.step(buffers)
        stepper.act([group], report)
    seats = learner_seats(num_envs, 2)
    recorded = np.flatnonzero(assembler.ep_lengths > 0)
    assert len(recorded) and seats[recorded].all()
    assert report.returns and set(report.returns) <= {-1.0, 0.0, 1.0}
    assert cache.downloads == 10


def test_opponents_switch_at_each_envs_episode_end(service):
    cache = OpponentCache(SPEC, MODEL, capacity=16, fetch=CountingFetch(service.store), seed=0)
    opponents = Opponents(num_envs=4, num_agents=2, cache=cache)
    a, b = service.store.snapshot(0).hash, service.store.snapshot(1).hash
    opponents.assign(OpponentAssignment(alternation=1, digests=(a,) * 4, indices=(0,) * 4))
    opponents.assign(OpponentAssignment(alternation=2, digests=(b,) * 4, indices=(1,) * 4))
    assert opponents.env_digests.tolist() == [a] * 4  # nobody switches mid-game
    assert list(opponents._snapshots_in_use()) == sorted([a, b])  # the batch's stack holds both until all switch
    opponents.episodes_ended(np.array([2, 3, 7]))  # env 1 (slots 2, 3) and env 3 (slot 7) ended
    assert opponents.env_digests.tolist() == [a, b, a, b]
    opponents.episodes_ended(np.array([0, 4]))
    assert opponents.env_digests.tolist() == [b] * 4 and opponents.next_digests is None
    assert list(opponents._snapshots_in_use()) == [b]


def test_opponents_reply_is_compact_each_distinct_snapshot_once(service):
    reply = ask(service, MessageType.GET_OPPONENTS, num_envs=MAX_ENVS_PER_REQUEST)
    digests, indices = reply.fields["digests"], reply.fields["indices"]
    env_opponent = reply.arrays["env_opponent"]
    assert env_opponent.dtype == np.uint16 and env_opponent.shape == (MAX_ENVS_PER_REQUEST,)
    assert len(digests) == len(set(digests)) == len(indices) <= 12  # 12 snapshots: at most 12 names in the reply
    assert all(service.store.snapshot(i).hash == d for i, d in zip(indices, digests))
    assert sorted(set(env_opponent.tolist())) == list(range(len(digests)))
    assert sum(len(frame) for frame in encode(reply)) < 64 * 12 * 2 + 2 * MAX_ENVS_PER_REQUEST + 1024
    with pytest.raises(ProtocolError, match=f"num_envs must be in \\[1, {MAX_ENVS_PER_REQUEST}\\]"):
        ask(service, MessageType.GET_OPPONENTS, num_envs=MAX_ENVS_PER_REQUEST + 1)


def test_the_largest_opponents_reply_reaches_a_pool_client(tmp_path):
    """Every env draws a different snapshot from a huge pool: the biggest reply the server can produce still
    decodes within the client's limits, and the client hands each env its own snapshot."""
    count = 8 * MAX_ENVS_PER_REQUEST
    entries = [{"index": i, "hash": hashlib.sha256(str(i).encode()).hexdigest(), "update": i, "policy_version": i,
                "created": 0.0, "num_bytes": 1} for i in range(count)]
    (tmp_path / "index.json").write_text(json.dumps({"format": 1, "snapshots": entries}))
    (tmp_path / "weights").mkdir()
    for entry in entries:  # the store skips entries whose weights file is missing
        (tmp_path / "weights" / f"{entry['hash']}.safetensors").write_bytes(b"x")
    service = PoolService(SnapshotStore(tmp_path), SelfPlaySection(enabled=True, opponent_pool_exploration=1.0),
                          seed=0)
    port, stop = free_port_triple(), threading.Event()
    server = threading.Thread(target=serve, args=(service, f"tcp://127.0.0.1:{port}", stop))
    server.start()
    client = PoolClient(parse_endpoint(f"tcp://127.0.0.1:{port}"), limits=Limits(), timeout_s=30, sender="t")
    try:
        assignment = client.opponents(MAX_ENVS_PER_REQUEST)
    finally:
        client.close()
        stop.set()
        server.join(timeout=10)
    assert len(assignment.digests) == len(assignment.indices) == MAX_ENVS_PER_REQUEST
    assert all(entries[i]["hash"] == d for i, d in zip(assignment.indices, assignment.digests))
    assert len(set(assignment.digests)) > MAX_ENVS_PER_REQUEST // 2
