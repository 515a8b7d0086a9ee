"""``python -m learner.pool.server`` as a real process, serving a run directory someone else writes to: it keeps
answering GET_OPPONENTS while pool/index.json is garbled under it (the index is rebuilt from the weights files or
its bad entries are skipped, one log line each), and refuses a huge sparse snapshot file without reading it, its
ERROR arriving within a couple of seconds (learner/pool/store.py, "Trust")."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
import zmq

from configs.loader import config_to_dict, load_config
from envs.registry import env_spec
from learner.pool.store import MAX_SNAPSHOT_BYTES, SnapshotStore
from policies.factory import make_policy, state_arrays
from protocol import Message, MessageType, decode, encode
from tests.processes import free_ports, kill_tree, start, wait_for

pytestmark = pytest.mark.integration

CONFIG = "configs/selfplay_connect4.yaml"
HUGE_BYTES = 5 * 2 ** 30
"""A sparse weights file this size takes no disk; reading it would take seconds and 5 GiB."""
REPLY_WITHIN_S = 2.0
READ_ALLOWANCE = 64 << 20
"""Bytes the server may read (rchar of /proc/PID/io) while answering the oversized-file requests: small index
files, the socket traffic and Python's own reads, far below the huge file's size."""


def make_run_dir(root: Path) -> tuple[Path, list[str]]:
    """A self-play run directory as a learner leaves it: config.yaml and a pool of two snapshots."""
    config = load_config(CONFIG, ["model.hidden_size=16"])
    run_dir = root / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    store = SnapshotStore(run_dir / "pool")
    digests = []
    for seed in range(2):
        torch.manual_seed(seed)
        arrays = state_arrays(make_policy(env_spec(config.env), config.model))
        digests.append(store.add(arrays, update=seed, policy_version=seed).hash)
        time.sleep(0.01)  # distinct mtimes: a rebuilt index orders the files by them
    return run_dir, digests


def pool_digests(reply: Message) -> list[str]:
    """The pool snapshots an OPPONENTS reply drew (the config's baseline opponents, index -1, left out)."""
    return [digest for digest, index in zip(reply.fields["digests"], reply.fields["indices"]) if index >= 0]


def read_chars(pid: int) -> int:
    """Bytes the process has read through read() and similar calls (rchar of /proc/PID/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/io has no rchar line")


@pytest.fixture
def pool_server(tmp_path):
    """(run directory, the two snapshots' digests, the server process, a request function, its log)."""
    run_dir, digests = make_run_dir(tmp_path)
    port = free_ports(2)  # the ROUTER and, at port + 1, its /metrics
    log = tmp_path / "pool.log"
    server = start("learner.pool.server", "--run-dir", str(run_dir), "--bind", f"tcp://127.0.0.1:{port}", log=log)
    context = zmq.Context()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        assert wait_for(lambda: "serving on" in log.read_text(), 60), log.read_text()
        client.connect(f"tcp://127.0.0.1:{port}")

        def ask(message_type: MessageType, **fields) -> tuple[Message, float]:
            """The server's answer and how long it took."""
            started = time.monotonic()
            client.send_multipart(encode(Message(type=message_type, sender="test", fields=fields)))
            reply = decode(client.recv_multipart(copy=False))
            return reply, time.monotonic() - started

        yield run_dir, digests, server, ask, log
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=15) == 0, log.read_text()
    finally:
        client.close()
        context.term()
        if server.poll() is None:
            kill_tree(server)


def test_the_pool_server_process_keeps_answering_while_its_index_is_garbled(pool_server):
    run_dir, digests, server, ask, log = pool_server
    index_path = run_dir / "pool" / "index.json"
    reply, _ = ask(MessageType.GET_OPPONENTS, num_envs=8)
    assert reply.type is MessageType.OPPONENTS and reply.fields["num_snapshots"] == 2
    good = json.loads(index_path.read_text())
    one_bad_entry = {**good, "snapshots": [{**good["snapshots"][0], "update": "ten"}, good["snapshots"][1]]}
    garbage = {
        "not json": (b"\xff{garbled", digests),
        "a list": (b"[1, 2]", digests),
        "snapshots not a list": (b'{"format": 1, "snapshots": {"a": 1}}', digests),
        "cut short": (index_path.read_bytes()[:40], digests),
        "empty": (b"", digests),
        "one bad entry": (json.dumps(one_bad_entry).encode(), digests[1:]),
    }
    for name, (content, servable) in garbage.items():
        index_path.write_bytes(content)
        reply, took = ask(MessageType.GET_OPPONENTS, num_envs=64)
        assert reply.type is MessageType.OPPONENTS, (name, reply.fields)
        assert reply.fields["num_snapshots"] == len(servable), name
        assert set(pool_digests(reply)) <= set(servable), name
        assert took < REPLY_WITHIN_S, (name, took)
    snapshot, _ = ask(MessageType.GET_SNAPSHOT, digest=digests[1])
    assert snapshot.type is MessageType.SNAPSHOT and snapshot.fields["digest"] == digests[1]
    assert server.poll() is None
    text = log.read_text()
    assert text.count(f"pool index {index_path} is unreadable (") == 5, text
    assert f"rebuilt it from the 2 weights files in {run_dir / 'pool' / 'weights'}" in text
    assert (f"pool index {index_path}: skipped 1 bad entries (positions [0]): wrong types, a bad hash, or a "
            f"weights file missing, oversized or resized") in text
    assert "Traceback" not in text


def test_the_pool_server_process_refuses_a_huge_sparse_snapshot_unread(pool_server):
    run_dir, digests, server, ask, log = pool_server
    huge = "ab" * 32
    path = run_dir / "pool" / "weights" / f"{huge}.safetensors"
    with path.open("wb") as file:
        file.truncate(HUGE_BYTES)  # sparse: no disk used
    index_path = run_dir / "pool" / "index.json"
    index = json.loads(index_path.read_text())
    entry = {**index["snapshots"][-1], "hash": huge, "num_bytes": HUGE_BYTES, "index": 2, "update": 9}
    index_path.write_text(json.dumps({**index, "snapshots": [*index["snapshots"], entry]}))
    read_before = read_chars(server.pid)
    for _ in range(3):
        reply, took = ask(MessageType.GET_SNAPSHOT, digest=huge)
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "not_found", reply.fields
        assert reply.fields["message"] == (f"snapshot weights {path} are {HUGE_BYTES} bytes, more than the "
                                           f"{MAX_SNAPSHOT_BYTES} a snapshot may hold; not read")
        assert took < REPLY_WITHIN_S, took
    reply, took = ask(MessageType.GET_OPPONENTS, num_envs=8)  # the index entry naming it is skipped, not served
    assert reply.type is MessageType.OPPONENTS and reply.fields["num_snapshots"] == 2 and took < REPLY_WITHIN_S
    assert huge not in pool_digests(reply)
    index_path.write_bytes(b"{garbled")  # a rebuild from the weights files leaves it out too
    reply, took = ask(MessageType.GET_OPPONENTS, num_envs=8)
    assert reply.type is MessageType.OPPONENTS and reply.fields["num_snapshots"] == 2 and took < REPLY_WITHIN_S
    assert read_chars(server.pid) - read_before < READ_ALLOWANCE
    assert ask(MessageType.GET_SNAPSHOT, digest=digests[0])[0].type is MessageType.SNAPSHOT
    text = log.read_text()
    assert text.count(f"snapshot weights {path} are {HUGE_BYTES} bytes") == 1, text  # warned once, not per request
    assert f"rebuilt it from the 2 weights files in {run_dir / 'pool' / 'weights'}" in text
