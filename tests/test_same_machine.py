"""Rows over ipc:// on the learner's machine (protocol/same_machine.py): when a host may use a learner rank's unix
socket, the learner's side of the socket (bound beside TCP, CURVE alike, its file removed), and the host's link
choosing it. Sockets in this process only: the end-to-end case is tests/test_integration.py's SIGTERM test."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from actors.learner_link import LearnerLink, Registration
from protocol import Limits, Message, MessageType, decode, encode
from protocol.curve import load_client_curve
from protocol.endpoints import parse_endpoint
from protocol.same_machine import (IpcRoute, bind_ipc, data_ipc_path, file_identity, ipc_routes, machine_identity,
                                   remove_ipc_file, remove_stale_ipc_files, usable_ipc)
from tests.test_ingest import curve_ingest, full_slot, rows_message
from tests.processes import wait_for


@pytest.fixture
def short_dir():
    """A directory with a short path (a unix socket path holds at most 107 bytes; pytest's tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def unix_socket_file(path: Path) -> socket.socket:
    """A bound (not listening) unix socket at ``path``: the kind of file a learner's data socket leaves."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def route_at(path: Path, **changes: str) -> IpcRoute:
    identity = machine_identity()
    assert identity is not None, "these tests need Linux's /proc"
    fields = {"endpoint": f"ipc://{path}", "machine": identity, "file": file_identity(path) or "", **changes}
    return IpcRoute(**fields)


def test_the_machine_identity_is_this_boot_and_network_namespace():
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert machine_identity() == f"{boot}/net:{os.stat('/proc/self/ns/net').st_ino}"


def test_a_host_on_the_learners_machine_and_namespace_uses_its_socket_file(short_dir):
    path = short_dir / "sluice_1_data0"
    with unix_socket_file(path):
        route = route_at(path)
        assert usable_ipc(route, machine=machine_identity())
        assert ipc_routes({"tcp://127.0.0.1:5556": route.to_field()}, machine=machine_identity()) == {
            "tcp://127.0.0.1:5556": f"ipc://{path}"}


def test_another_machine_namespace_or_socket_file_keeps_tcp(short_dir):
    path = short_dir / "sluice_1_data0"
    boot, _, net = (machine_identity() or "").partition("/net:")
    with unix_socket_file(path):
        route = route_at(path)
        assert not usable_ipc(route, machine=f"{boot}/net:{int(net) + 1}")  # another network namespace
        assert not usable_ipc(route, machine=f"0{boot[1:]}/net:{net}")  # another machine (or boot)
        assert not usable_ipc(route, machine=None)  # a host that cannot tell (not Linux)
        assert not usable_ipc(route_at(path, file="1:2"), machine=machine_identity())  # another /tmp, same path
        assert ipc_routes({"tcp://127.0.0.1:5556": route.to_field()}, machine=f"{boot}/net:{int(net) + 1}") == {}
    path.unlink()
    assert not usable_ipc(route, machine=machine_identity())  # the file is gone (a learner that stopped)
    path.write_text("not a socket")
    assert not usable_ipc(route_at(path, file=route.file), machine=machine_identity())


@pytest.mark.parametrize("value", [["ipc:///tmp/x"], {"tcp://127.0.0.1:5556": {"endpoint": "tcp://127.0.0.1:1",
                                                                                 "machine": "m", "file": "1:2"}},
                                   {"tcp://127.0.0.1:5556": {"endpoint": "ipc:///tmp/x"}},
                                   {"not an endpoint": {"endpoint": "ipc:///tmp/x", "machine": "m", "file": "1:2"}}])
def test_a_malformed_data_ipc_field_keeps_tcp(value):
    assert ipc_routes(value, machine=machine_identity()) == {}
    assert ipc_routes(None, machine=machine_identity()) == {}  # a learner that offers no route


def test_stale_socket_files_of_dead_owners_are_removed_and_nothing_else(short_dir):
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have this pid
    stale, own, not_ours = short_dir / f"sluice_{dead}_data0", data_ipc_path(os.getpid(), 0, short_dir), \
        short_dir / f"sluice_{dead}_data1"
    with unix_socket_file(stale), unix_socket_file(own):
        not_ours.write_text("a regular file: not a socket this project made")
        assert remove_stale_ipc_files(short_dir) == [stale]
        assert not stale.exists() and own.exists() and not_ours.exists()


def test_bind_ipc_binds_beside_tcp_and_its_file_goes_when_removed(short_dir):
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    push = context.socket(zmq.PUSH)
    try:
        pull.bind("tcp://127.0.0.1:*")
        route = bind_ipc(pull, data_ipc_path(os.getpid(), 3, short_dir))
        assert route is not None and route.endpoint == f"ipc://{short_dir}/sluice_{os.getpid()}_data3"
        push.connect(route.endpoint)
        push.send(b"rows")
        assert pull.poll(5000) and pull.recv() == b"rows"
        pull.close(linger=0)
        assert Path(route.path).exists(), "libzmq 4.3 leaves the file when the socket closes"
        remove_ipc_file(route)
        assert not Path(route.path).exists()
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        context.term()


def test_rows_over_ipc_need_the_same_curve_key_and_the_file_goes_with_the_ingest(short_dir):
    keys = short_dir / "keys"
    context, stop, guard, thread = curve_ingest(keys, ("host",), ipc_path=data_ipc_path(os.getpid(), 0, short_dir))
    assert thread.ipc is not None
    plain, keyed = context.socket(zmq.PUSH), context.socket(zmq.PUSH)
    try:
        thread.start()
        load_client_curve(keys / "server.key", keys / "host.key_secret").apply(keyed)
        for push in (plain, keyed):
            push.setsockopt(zmq.LINGER, 0)
            push.connect(thread.ipc.endpoint)
        plain.send_multipart(encode(rows_message([10] * 3, marker=1.0)), flags=zmq.NOBLOCK)  # no keys: refused
        keyed.send_multipart(encode(rows_message([10] * 3, marker=5.0)))
        keyed.send_multipart(encode(rows_message([10] * 3, marker=8.0)))
        index = full_slot(thread)
        assert thread.slots.buffers[index].arrays["rewards"][:, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
        assert thread.counters.take_snapshot().messages_dropped == 0
    finally:
        stop.set()
        thread.join(timeout=5)
        plain.close(linger=0)
        keyed.close(linger=0)
        guard.stop()
        context.term()
    assert not Path(thread.ipc.path).exists(), "the ingest removes its socket file when it stops"


@dataclass
class IpcRank:
    """A learner rank's data socket bound at ipc only (a message arrives only if the host chose ipc), and a host's
    link to the learner whose registrations offer that socket."""

    context: zmq.Context
    learner: zmq.Socket
    route: IpcRoute
    link: LearnerLink
    data_endpoint: str = "tcp://127.0.0.1:10"

    def register(self, *, offer_ipc: bool = True, **fields: object) -> None:
        """The link opens the streams of a registration with ``fields``, offering the ipc route if ``offer_ipc``."""
        offered = {self.data_endpoint: self.route.to_field()} if offer_ipc else {}
        routes = ipc_routes(offered, machine=machine_identity())
        fields = {"data_endpoint": self.data_endpoint, "ipc_routes": routes, **fields}
        self.link.open_streams(Registration(config={}, run_id="r", version=0, weights={}, data_port=10,
                                            weights_port=11, **fields), hwm=2, buffer_bytes=65536)


@pytest.fixture
def ipc_rank(short_dir):
    context = zmq.Context()
    learner = context.socket(zmq.PULL)
    route = bind_ipc(learner, data_ipc_path(os.getpid(), 0, short_dir))
    assert route is not None
    rank = IpcRank(context=context, learner=learner, route=route,
                   link=LearnerLink(parse_endpoint("tcp://127.0.0.1:9", "--learner"), num_workers=1, limits=Limits()))
    try:
        yield rank
    finally:
        rank.link.close()
        rank.learner.close(linger=0)
        remove_ipc_file(route)
        context.term()


def test_the_link_connects_rows_over_ipc_when_the_learner_offers_it_and_tcp_otherwise(ipc_rank, capsys):
    link, route = ipc_rank.link, ipc_rank.route
    ipc_rank.register()
    assert capsys.readouterr().out == f"actors: rows go to the learner over {route.endpoint} (same machine)\n"
    assert wait_for(link.can_send_rows, 5)
    link.data.send(b"rows")
    assert ipc_rank.learner.poll(5000) and ipc_rank.learner.recv() == b"rows"
    ipc_rank.register(offer_ipc=False)
    assert capsys.readouterr().out == ""  # no route offered: TCP, as before
    assert link.data_routes == () and not link.can_send_rows()  # nothing listens at the TCP port
    ipc_rank.register(offer_ipc=False, data_endpoints=("tcp://*:10", "tcp://*:12"),
                      ipc_routes={"tcp://*:12": route.endpoint})
    assert link.resolve("tcp://*:12") == route.endpoint and link.resolve("tcp://*:10") == "tcp://127.0.0.1:10"
    assert capsys.readouterr().out == f"actors: rows go to the learner over {route.endpoint} (same machine)\n"


@pytest.mark.timeout(20)
def test_rows_for_a_rank_that_went_away_after_the_socket_said_it_had_room_are_refused_not_waited_for(ipc_rank):
    """A learner rank stops between ``can_send_rows`` and ``send_rows``: the socket has no peer left, and a blocking
    send would wait for one forever (the host then ignores SIGTERM; a Slurm job's host hung so). The send returns
    None at once; the rows go out once a rank is back."""
    link = ipc_rank.link
    rows = Message(type=MessageType.ROWS, sender=link.name, fields={
        "num_rows": 0, "episode_returns": [], "episode_lengths": [], "env_steps": 0, "agent_steps": 0})
    ipc_rank.register()
    assert wait_for(link.can_send_rows, 5)
    ipc_rank.learner.close(linger=0)  # the rank stops after the host saw room
    assert wait_for(lambda: not link.can_send_rows(), 5)
    assert link.send_rows(rows) is None
    ipc_rank.learner = ipc_rank.context.socket(zmq.PULL)  # the rank is back at the same address
    ipc_rank.learner.bind(ipc_rank.route.endpoint)
    assert wait_for(link.can_send_rows, 5)
    assert link.send_rows(rows) is not None
    assert ipc_rank.learner.poll(5000) and decode(ipc_rank.learner.recv_multipart()).type is MessageType.ROWS


def test_rows_go_through_shared_memory_only_to_a_learner_of_this_user(ipc_rank):
    """A learner opens only its own user's rows segments (protocol/shared_rows.py): a host whose learner's socket file
    is another user's (a root host beside a user's learner) keeps its rows in the messages."""
    link = ipc_rank.link
    ipc_rank.register(packed_rows=True, shared_rows=True)
    assert link.rows_through_memory
    ipc_rank.register(packed_rows=True, shared_rows=False)
    assert not link.rows_through_memory
    if os.geteuid() == 0:  # as root (CI) the socket file can be given to another user
        os.chown(ipc_rank.route.path, 65534, 65534)
        ipc_rank.register(packed_rows=True, shared_rows=True)
        assert not link.rows_through_memory and link.data_endpoint in link.ipc_routes  # ipc, rows in messages
