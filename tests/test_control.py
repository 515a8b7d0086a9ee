"""The learner's control server over real ZeroMQ sockets: registration tokens in the sender registry, leaving
(BYE, BYE with a failure, silence), refusals (unregistered, rate-limited, too many hosts, bad fields) and a
log that a flood cannot fill."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from actors.learner_link import LearnerLink, refuses_register
from configs.plan import make_plan
from configs.schema import TrainerSection
from learner.serve.control import HOST_NAME_CHARS, ControlServer
from learner.serve.host_sizing import HostSizing
from learner.serve.request_rate import PeerRateLimiter, RateLimit
from learner.serve.senders import SenderRegistry
from protocol import Limits, Message, MessageType, decode, encode, pack_arrays
from protocol.curve import ClientCurve, ServerCurve, ZapGuard
from protocol.endpoints import parse_endpoint
from tests.processes import wait_for

REGISTRATION = {"config": {}, "data_endpoint": "tcp://127.0.0.1:1", "weights_endpoint": "tcp://127.0.0.1:2",
                "run_id": "run"}
TRAINER = TrainerSection()
SIZING = HostSizing(trainer=TRAINER, num_agents=2)
WEIGHTS = {"w": np.arange(4, dtype=np.float32)}


@dataclass(frozen=True, kw_only=True)
class Served:
    """A running control server and what a test talks to it with."""

    server: ControlServer
    """The server thread."""
    registry: SenderRegistry
    """The registry it adds senders to."""
    context: zmq.Context
    """The context of its socket and the test's sockets."""
    address: str
    """Where it listens."""

    def host(self, curve: ClientCurve | None = None) -> zmq.Socket:
        """A new DEALER connected to the server (a new identity); the context closes it."""
        sock = self.context.socket(zmq.DEALER)
        if curve is not None:
            curve.apply(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        return sock


@contextmanager
def control_server(**kwargs) -> Iterator[Served]:
    """A ControlServer on a free port (``curve``: with a ZAP authenticator on its context)."""
    context = zmq.Context()
    stop = threading.Event()
    registry = SenderRegistry()
    options = {"peer_timeout_s": 60.0, "registration": REGISTRATION, **kwargs}
    with ExitStack() as cleanup:
        cleanup.callback(context.destroy, linger=0)
        if options.get("curve") is not None:
            cleanup.enter_context(ZapGuard(context, options["curve"]))
        server = ControlServer(context=context, endpoint="tcp://127.0.0.1:*", limits=Limits(), stop=stop,
                               registry=registry, sizing=SIZING, **options)
        server.set_weights(3, WEIGHTS)
        server.start()
        cleanup.callback(server.join, timeout=5)
        cleanup.callback(stop.set)
        yield Served(server=server, registry=registry, context=context,
                     address=server.socket.getsockopt(zmq.LAST_ENDPOINT).decode())


def send(sock: zmq.Socket, type_: MessageType, fields: dict | None = None) -> None:
    sock.send_multipart(encode(Message(type=type_, sender="test", fields=fields or {})))


def ask(sock: zmq.Socket, type_: MessageType, fields: dict | None = None) -> Message:
    send(sock, type_, fields)
    assert sock.poll(5000), f"no reply to {type_.value}"
    return decode(sock.recv_multipart())


def register(sock: zmq.Socket, name: str = "h", num_workers: int = 2) -> Message:
    return ask(sock, MessageType.REGISTER, {"host": name, "num_workers": num_workers})


def test_registration_hands_out_a_token_the_registry_holds_with_the_host_size() -> None:
    with control_server() as served:
        reply = register(served.host(), num_workers=2)
        assert reply.type is MessageType.REGISTERED and reply.version == 3
        assert np.array_equal(reply.arrays["w"], WEIGHTS["w"]) and reply.fields["run_id"] == "run"
        sender = served.registry.get(reply.fields["token"])
        plan = make_plan(TRAINER, num_agents=2, num_workers=2)
        assert sender is not None and sender.name == "h" and sender.curve_key is None
        assert (sender.num_envs, sender.agent_slots) == (plan.num_envs, plan.num_envs * 2)
        default = register(served.host(), name="d", num_workers=0)  # 0: the run's trainer.num_workers
        default_plan = make_plan(TRAINER, num_agents=2, num_workers=TRAINER.num_workers)
        assert served.registry.get(default.fields["token"]).num_envs == default_plan.num_envs
        assert served.server.counts().actor_hosts == 2 and len(served.registry) == 2


@pytest.mark.parametrize("num_workers", [-1, 4097])
def test_a_worker_count_out_of_range_is_refused(num_workers: int) -> None:
    with control_server() as served:
        reply = register(served.host(), num_workers=num_workers)
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "bad_field"
        assert "1..4096" in reply.fields["message"] and len(served.registry) == 0


def test_a_worker_count_the_batch_plan_cannot_take_is_refused() -> None:
    with control_server() as served:  # 4096 workers x 2 agents: more agent slots than the batch has rows
        reply = register(served.host(), num_workers=4096)
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "bad_field"
        assert "does not fit the run's batch plan" in reply.fields["message"] and len(served.registry) == 0


def test_registering_again_replaces_the_token() -> None:
    with control_server() as served:
        sock = served.host()
        first = register(sock).fields["token"]
        second = register(sock).fields["token"]
        assert first != second
        assert served.registry.get(first) is None and served.registry.get(second) is not None
        assert served.server.counts().actor_hosts == 1


def test_bye_takes_the_token_away_and_is_a_normal_leave() -> None:
    with control_server() as served:
        sock = served.host()
        token = register(sock).fields["token"]
        send(sock, MessageType.BYE)
        assert wait_for(lambda: served.registry.get(token) is None, 5)
        counts = served.server.counts()
        assert (counts.actor_hosts, counts.actor_hosts_failed, counts.actor_hosts_lost) == (0, 0, 0)


def test_bye_with_a_reason_counts_a_failed_host_and_logs_it_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sluice.learner.control")
    with control_server() as served:
        sock = served.host()
        token = register(sock, name="gpu-7").fields["token"]
        send(sock, MessageType.BYE, {"reason": "env worker 0 died 3 times in a row\x1b[2J"})
        assert wait_for(lambda: served.server.counts().actor_hosts_failed == 1, 5)
        send(sock, MessageType.BYE, {"reason": "again"})  # no longer registered: nothing more to count
        assert ask(sock, MessageType.HEARTBEAT).fields["reason"] == "not_registered"
        assert served.registry.get(token) is None and served.server.counts().actor_hosts_failed == 1
    lines = [r.getMessage() for r in caplog.records if "left" in r.getMessage()]
    assert lines == ["actor host gpu-7 left: env worker 0 died 3 times in a row[2J"]


def test_a_silent_host_is_forgotten_counted_lost_and_its_token_removed() -> None:
    with control_server(peer_timeout_s=0.5) as served:
        token = register(served.host()).fields["token"]
        assert wait_for(lambda: served.server.counts().actor_hosts_lost == 1, 10)
        assert served.registry.get(token) is None and served.server.counts().actor_hosts == 0


def test_an_unregistered_identity_may_only_register() -> None:
    with control_server() as served:
        sock = served.host()
        for type_ in (MessageType.GET_WEIGHTS, MessageType.HEARTBEAT):
            reply = ask(sock, type_)
            assert reply.type is MessageType.ERROR and reply.fields["reason"] == "not_registered"
            assert reply.fields["refused"] == type_.value and not reply.arrays
        assert served.server.counts().rejected_by_reason == {"not_registered": 2}


def test_registering_reads_a_late_refusal_of_an_earlier_heartbeat_as_that_and_registers() -> None:
    """A host whose learner restarted sends a heartbeat (refused: not registered) and then REGISTER; the
    heartbeat's refusal arrives while it waits for REGISTERED and must not read as a refused registration."""
    with control_server() as served:
        link = LearnerLink(parse_endpoint(served.address), num_workers=1, limits=Limits())
        try:
            assert wait_for(lambda: link.control.poll(0, zmq.POLLOUT), 5)
            link.send_control(MessageType.HEARTBEAT)
            assert link.control.poll(5000)  # the refusal is queued before REGISTER goes out
            registration = link.register(retry_s=1.0, should_stop=lambda: False)
            assert registration is not None and served.registry.get(registration.token) is not None
        finally:
            link.close()


def test_a_refused_register_and_an_undecodable_message_still_stop_registration() -> None:
    with control_server() as served:
        link = LearnerLink(parse_endpoint(served.address), num_workers=4097, limits=Limits())
        try:
            with pytest.raises(RuntimeError, match="learner refused registration: .*1..4096"):
                link.register(retry_s=1.0, should_stop=lambda: False)
        finally:
            link.close()
    undecodable = Message(type=MessageType.ERROR, sender="learner", fields={"reason": "bad_protocol", "message": "x"})
    late = Message(type=MessageType.ERROR, sender="learner", fields={"reason": "not_registered", "message": "x"})
    named = Message(type=MessageType.ERROR, sender="learner",
                    fields={"reason": "rate_limited", "message": "x", "refused": "get_weights"})
    assert refuses_register(undecodable) and not refuses_register(late) and not refuses_register(named)


def test_weight_requests_beyond_the_rate_limit_get_a_small_error() -> None:
    with control_server(weight_requests=RateLimit(per_second=1e-6, burst=3)) as served:
        sock = served.host()
        assert register(sock).type is MessageType.REGISTERED
        replies = [ask(sock, MessageType.GET_WEIGHTS) for _ in range(5)]
        assert [r.type for r in replies] == [MessageType.WEIGHTS] * 2 + [MessageType.ERROR] * 3
        assert all(r.fields["reason"] == "rate_limited" and not r.arrays for r in replies[2:])
        assert ask(sock, MessageType.HEARTBEAT).type is MessageType.HEARTBEAT_ACK  # cheap requests still answered
        assert register(served.host()).type is MessageType.REGISTERED  # another identity has its own budget
        assert served.server.counts().rejected_by_reason == {"rate_limited": 3}


def test_a_peer_bucket_refills_with_time_and_forgets_the_oldest_peer() -> None:
    now = [0.0]
    limiter = PeerRateLimiter(RateLimit(per_second=2.0, burst=2), max_peers=2, clock=lambda: now[0])
    assert [limiter.allow(b"a") for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert [limiter.allow(b"a") for _ in range(2)] == [True, False]
    limiter.allow(b"b")
    limiter.allow(b"c")
    assert len(limiter) == 2  # "a" was forgotten: it starts again with a full bucket
    assert [limiter.allow(b"a") for _ in range(3)] == [True, True, False]


def test_registrations_beyond_max_hosts_are_refused_until_one_leaves() -> None:
    with control_server(max_hosts=2) as served:
        first, second, third = served.host(), served.host(), served.host()
        assert register(first).type is register(second).type is MessageType.REGISTERED
        refused = register(third)
        assert refused.type is MessageType.ERROR and refused.fields["reason"] == "too_many_hosts"
        assert "max_hosts 2" in refused.fields["message"] and not refused.arrays
        assert register(first).type is MessageType.REGISTERED  # a registered identity may register again
        send(second, MessageType.BYE)
        assert wait_for(lambda: served.server.counts().actor_hosts == 1, 5)
        assert register(third).type is MessageType.REGISTERED
        assert served.server.counts().rejected_by_reason == {"too_many_hosts": 1}


def test_host_names_are_printable_and_truncated() -> None:
    with control_server() as served:
        token = register(served.host(), name="\x1b[31m" + "n" * 500 + "\n").fields["token"]
        name = served.registry.get(token).name
        assert name == "[31m" + "n" * (HOST_NAME_CHARS - 4)


def test_a_flood_of_bad_messages_logs_a_bounded_number_of_lines(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sluice.learner.control")
    flood = 10_000
    with control_server(clock=lambda: 0.0) as served:  # a stopped clock: the log's interval never passes
        sock = served.host()
        for index in range(flood):
            if index % 2:
                sock.send_multipart([b"junk", b"\xc1" * 64])
            else:
                send(sock, MessageType.GET_WEIGHTS)
            while sock.poll(0):  # replies are small errors; drain them so neither side's queue fills
                sock.recv_multipart()
        assert wait_for(lambda: sum(served.server.counts().rejected_by_reason.values()) == flood, 60)
        assert served.server.counts().rejected_by_reason == {"bad_protocol": flood // 2, "not_registered": flood // 2}
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.learner.control"]
    assert len(lines) == 2, lines  # one per reason
    assert all(len(line) < 1000 for line in lines)


def test_with_curve_the_sender_keeps_the_key_the_registration_came_under(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    (allowed / "host.key").write_text(f'metadata\ncurve\n    public-key = "{client_public.decode()}"\n')
    assert zmq.auth.load_certificate(allowed / "host.key")[0] == client_public
    curve = ServerCurve(public=server_public, secret=server_secret, allowed_clients=allowed)
    with control_server(curve=curve) as served:
        host = served.host(ClientCurve(server_public=server_public, public=client_public, secret=client_secret))
        token = register(host).fields["token"]
        assert served.registry.get(token).curve_key == client_public.decode()


def test_the_learner_link_sends_its_token_with_rows_and_says_why_it_left() -> None:
    context = zmq.Context()
    data = context.socket(zmq.PULL)
    data.setsockopt(zmq.LINGER, 0)
    registration = {**REGISTRATION, "data_endpoint": f"tcp://127.0.0.1:{data.bind_to_random_port('tcp://127.0.0.1')}"}
    try:
        with control_server(registration=registration) as served:
            link = LearnerLink(parse_endpoint(served.address), num_workers=1, limits=Limits())
            first = link.register(retry_s=1.0, should_stop=lambda: False)
            again = link.register(retry_s=1.0, should_stop=lambda: False)  # the same session: the same token
            assert again.token == first.token
            link.session = "another connection"
            second = link.register(retry_s=1.0, should_stop=lambda: False)  # a new session: a new token
            assert first.token != second.token == link.token
            assert served.registry.get(first.token) is None and served.registry.get(link.token) is not None
            link.open_streams(second, hwm=4, buffer_bytes=1 << 16)
            assert wait_for(link.can_send_rows, 5)
            link.send_rows(Message(type=MessageType.ROWS, sender=link.name, fields={
                "num_rows": 0, "episode_returns": [], "episode_lengths": [], "env_steps": 0, "agent_steps": 0}))
            assert data.poll(5000)
            assert decode(data.recv_multipart()).fields["token"] == link.token
            packed = pack_arrays([("versions", "int64", (1,)), ("values", "float32", (1, 3))])
            packed.arrays["versions"][...], packed.arrays["values"][...] = 3, 0.5
            rows = Message(type=MessageType.ROWS, sender=link.name, arrays=packed.arrays, fields={
                "num_rows": 1, "episode_returns": [], "episode_lengths": [], "env_steps": 3, "agent_steps": 3})
            for says_packed, frames_sent in ((False, 4), (True, 3)):  # packed only to a learner that reads it
                link.open_streams(dataclasses.replace(second, packed_rows=says_packed), hwm=4, buffer_bytes=1 << 16)
                assert wait_for(link.can_send_rows, 5)
                link.send_rows(rows, packed)
                assert data.poll(5000)
                frames = data.recv_multipart()
                got = decode(frames)
                assert len(frames) == frames_sent and got == dataclasses.replace(rows, fields=got.fields)
            link.close(reason="EnvFailure: env worker 0 died 3 times in a row")
            assert wait_for(lambda: served.server.counts().actor_hosts_failed == 1, 5)
            assert served.registry.get(second.token) is None
    finally:
        context.destroy(linger=0)


def test_a_repeated_register_of_one_session_gets_the_same_token_and_a_flood_of_them_no_refusal() -> None:
    """REGISTERs queued while the learner was paused are answered alike: no answer carries a token that the next
    one revokes, and those beyond the rate limit are dropped without an ERROR the host could read as a refusal."""
    with control_server() as served:
        host = served.host()
        fields = {"host": "h", "num_workers": 2, "session": "s1"}
        for _ in range(12):
            send(host, MessageType.REGISTER, fields)
        replies = []
        while host.poll(1000):
            replies.append(decode(host.recv_multipart()))
        assert {reply.type for reply in replies} == {MessageType.REGISTERED}
        assert 1 <= len(replies) < 12 and len({reply.fields["token"] for reply in replies}) == 1
        assert served.registry.get(replies[0].fields["token"]) is not None and len(served.registry) == 1
        assert served.server.counts().registrations == 1
        other = ask(host, MessageType.REGISTER, {**fields, "session": "s2"})  # a new session: a new token
        assert other.type is MessageType.REGISTERED and other.fields["token"] != replies[0].fields["token"]
        assert served.registry.get(replies[0].fields["token"]) is None and len(served.registry) == 1


def test_a_heartbeat_with_a_token_the_learner_no_longer_holds_is_refused_naming_its_seq() -> None:
    with control_server() as served:
        host = served.host()
        token = register(host).fields["token"]
        assert ask(host, MessageType.HEARTBEAT, {"token": token}).type is MessageType.HEARTBEAT_ACK
        host.send_multipart(encode(Message(type=MessageType.HEARTBEAT, sender="test", seq=41,
                                           fields={"token": "0" * 32})))
        assert host.poll(5000)
        reply = decode(host.recv_multipart())
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "not_registered"
        assert reply.fields["refused"] == "heartbeat" and reply.fields["refused_seq"] == 41
        assert "no longer its registration's" in reply.fields["message"]


def test_a_paused_learner_does_not_count_its_own_pause_as_its_hosts_silence() -> None:
    now = [100.0]
    with control_server(peer_timeout_s=5.0, clock=lambda: now[0]) as served:
        register(served.host())
        assert wait_for(lambda: served.server.counts().actor_hosts == 1, 5)
        now[0] += 30.0  # one turn of the loop 30 s after the last: this process was frozen, not its hosts
        assert not wait_for(lambda: served.server.counts().actor_hosts_lost > 0, 1.0)
        assert served.server.counts().actor_hosts == 1


def test_a_late_heartbeat_after_bye_or_silence_is_a_normal_event_and_a_stranger_a_refusal(caplog) -> None:
    """Issue 32: a host's heartbeat after its BYE, or after it was forgotten, is answered not_registered and counted
    as before, but logged at INFO as the normal event it is; an identity that never registered is still refused
    with a WARNING, which names it as ``peer <hex>``, not its raw ZeroMQ bytes."""
    caplog.set_level(logging.INFO, logger="sluice.learner.control")
    with control_server(peer_timeout_s=0.5) as served:
        left = served.host()
        register(left, name="gpu-7")
        send(left, MessageType.BYE)
        for _ in range(3):
            assert ask(left, MessageType.HEARTBEAT).fields["reason"] == "not_registered"
        silent = served.host()
        register(silent, name="gpu-8")
        assert wait_for(lambda: served.server.counts().actor_hosts_lost == 1, 10)
        assert ask(silent, MessageType.HEARTBEAT).fields["reason"] == "not_registered"
        stranger = served.host()  # an automatic identity, as after a learner restart: b'\x00k\x8bEg' as a repr
        assert ask(stranger, MessageType.HEARTBEAT).fields["reason"] == "not_registered"
        assert served.server.counts().rejected_by_reason == {"not_registered": 5}
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sluice.learner.control"]
    late = [text for level, text in lines if level == "INFO" and text.startswith("late ")]
    assert late == ["late heartbeat from actor host 'gpu-7', which left: answered not_registered (1 message dropped)",
                    "late heartbeat from actor host 'gpu-8', which was forgotten: answered not_registered "
                    "(1 message dropped)"]
    refused = [text for level, text in lines if level == "WARNING" and text.startswith("refused")]
    assert len(refused) == 1 and "b'" not in refused[0]
    assert re.fullmatch(r"refused a control message from peer 00[0-9a-f]{8} \(not_registered\): heartbeat before "
                        r"register: an unregistered identity may only send register \(or pool requests\)", refused[0])
