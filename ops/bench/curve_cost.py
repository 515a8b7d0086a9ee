"""What CURVE costs on the data path: row-block-sized messages over PUSH/PULL on loopback, plaintext vs CurveZMQ.

    .venv/bin/python -m ops.bench.curve_cost [--message-bytes 3000000] [--seconds 5]

A sender process pushes messages of one size as fast as the socket takes them (high-water mark 8, like the
actor host's data socket); the receiver in this process counts what arrives. Both runs use the same sockets and
sizes; the CURVE run adds the server and client keys and pyzmq's ZAP authenticator (protocol/curve.py). Prints
one JSON line per mode and the ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import zmq

from ops.benchlib import emit, end_process, run_stoppable
from protocol.curve import ZapGuard, load_client_curve, load_server_curve
from protocol.keys import make_key_pair

HWM = 8


def _sender(url: str, size: int, seconds: float, keys: str | None) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    if keys is not None:
        load_client_curve(Path(keys) / "server.key", Path(keys) / "host.key_secret").apply(sock)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    payload = bytes(size)
    deadline = time.monotonic() + seconds + 2.0
    while time.monotonic() < deadline:
        try:
            sock.send(payload, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            sock.poll(50, zmq.POLLOUT)
    sock.close(linger=0)
    context.term()


def measure(size: int, seconds: float, keys: Path | None) -> dict:
    """Messages and bytes per second the receiver got in ``seconds`` (after a 1 s warm-up)."""
    context = zmq.Context()
    guard = None
    sock = context.socket(zmq.PULL)
    if keys is not None:
        curve = load_server_curve(keys / "server.key_secret", keys / "allowed")
        guard = ZapGuard(context, curve)
        curve.apply(sock)
    sock.setsockopt(zmq.RCVHWM, HWM)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sender = mp.get_context("spawn").Process(target=_sender, args=(f"tcp://127.0.0.1:{port}", size, seconds,
                                                                     None if keys is None else str(keys)))
    try:
        sender.start()
        warm_until = time.monotonic() + 1.0
        while time.monotonic() < warm_until:
            if sock.poll(100):
                sock.recv(copy=False)
        count, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            if sock.poll(100):
                sock.recv(copy=False)
                count += 1
        elapsed = time.monotonic() - started
    finally:
        end_process(sender, timeout_s=10)
        sock.close(linger=0)
        if guard is not None:
            guard.stop()
        context.term()
    return {"messages_per_s": count / elapsed, "gbytes_per_s": count * size / elapsed / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-bytes", type=int, default=3_000_000, help="one ROWS block (grid3: ~3 MB)")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp)
        make_key_pair(keys, "server")
        make_key_pair(keys, "host")
        (keys / "allowed").mkdir()
        (keys / "allowed" / "host.key").write_bytes((keys / "host.key").read_bytes())
        plain = measure(args.message_bytes, args.seconds, None)
        curve = measure(args.message_bytes, args.seconds, keys)
    for mode, figures in (("plaintext", plain), ("curve", curve)):
        emit({"bench": "curve_cost", "mode": mode, "message_bytes": args.message_bytes, **figures})
    emit({"bench": "curve_cost", "curve_over_plaintext": curve["gbytes_per_s"] / max(1e-12, plain["gbytes_per_s"])})


if __name__ == "__main__":
    run_stoppable(main)
