"""protocol.zmtp_greeting: the mechanism a real ZeroMQ server announces (NULL, CURVE), None where nothing can be
read, and the parser's refusals."""

from __future__ import annotations

import socket

import pytest
import zmq

from protocol.endpoints import parse_endpoint
from protocol.zmtp_greeting import parse_mechanism, peer_mechanism


@pytest.mark.parametrize("curve", [False, True])
def test_a_zeromq_server_names_its_mechanism(curve: bool) -> None:
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    try:
        if curve:
            public, secret = zmq.curve_keypair()
            server.curve_secretkey, server.curve_publickey, server.curve_server = secret, public, True
        port = server.bind_to_random_port("tcp://127.0.0.1")
        assert peer_mechanism(parse_endpoint(f"tcp://127.0.0.1:{port}")) == ("CURVE" if curve else "NULL")
    finally:
        server.close(linger=0)
        context.term()


def test_nothing_to_read_gives_none(tmp_path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: the connection is refused
        assert peer_mechanism(parse_endpoint(f"tcp://127.0.0.1:{port}"), timeout_s=1.0) is None
    assert peer_mechanism(parse_endpoint(f"ipc://{tmp_path}/learner.sock")) is None
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert peer_mechanism(parse_endpoint(f"tcp://127.0.0.1:{silent.getsockname()[1]}"), timeout_s=0.3) is None


def test_the_parser_reads_only_a_zmtp3_greeting() -> None:
    signature = b"\xff" + b"\x00" * 7 + b"\x01\x7f"
    good = signature + bytes([3, 1]) + b"CURVE".ljust(20, b"\x00") + b"\x00" * 32
    assert parse_mechanism(good) == "CURVE"
    assert parse_mechanism(good[:31]) is None  # cut short
    assert parse_mechanism(b"HTTP/1.1 400 Bad Request\r\n" + b"\x00" * 40) is None  # not ZeroMQ
    assert parse_mechanism(signature + bytes([2, 0]) + good[12:]) is None  # ZMTP 2: no mechanism
    assert parse_mechanism(signature + bytes([3, 0]) + b"\x00" * 52) is None  # no name
    assert parse_mechanism(signature + bytes([3, 0]) + b"NU LL".ljust(20, b"\x00") + b"\x00" * 32) is None
