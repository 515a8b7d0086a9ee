"""Benchmark: what one ROWS message costs to encode, decode, send and receive, with one frame per array (what a
learner that does not read packed rows gets) and packed (every array in one frame: what the learner gets).

The message is the first of ``ops.bench.ingest``'s batch for the run config (what a host ships: the same fields and
arrays, ``rows_per_message`` rows). Three figures per config:

* ``encode_us`` and ``decode_us``: ``protocol.encode`` and ``protocol.decode`` of that message, in this process,
  and ``encode_packed_us`` / ``decode_packed_us`` of the same message packed (``protocol.pack_arrays``);
* ``send_cpu_us`` / ``recv_cpu_us`` per message: a forked sender pushes ``--messages`` copies of its frames over a
  real PUSH socket on ``ipc://`` (``send_multipart(copy=False)``, blocking while the queue is full) into a PULL socket here
  (``recv_multipart(copy=False)``, as the ingest); each side's CPU seconds (its ZeroMQ IO thread included) over the
  messages. Measured twice, in turn: ``frames: per_array`` and ``frames: packed``;
* ``send_multipart_us`` and ``send_nonblocking_us``: the calling thread's CPU to queue the message's frames on an
  ``inproc://`` PUSH socket (drained untimed), by pyzmq's ``send_multipart(copy=False, flags=NOBLOCK)`` (what the host
  did until 2026-11-28) and by ``protocol.sending.send_nonblocking`` (what ``LearnerLink.send_rows`` does).

Usage: .venv/bin/python -m ops.bench.message_cost [--configs configs/cartpole.yaml configs/grid_3agents.yaml]
[--messages 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import tempfile
import time
from pathlib import Path

import zmq

from configs.loader import load_config
from ops.bench.ingest import make_blocks
from ops.benchlib import emit, run_stoppable
from protocol import Message, PackedArrays, decode, encode, pack_arrays
from protocol.sending import send_nonblocking

REPO = Path(__file__).resolve().parents[2]


def per_call_us(call, repeat: int) -> float:
    """CPU-us per call of ``call()`` over ``repeat`` calls."""
    began = time.process_time()
    for _ in range(repeat):
        call()
    return 1e6 * (time.process_time() - began) / repeat


def packed_copy(message: Message) -> tuple[Message, PackedArrays]:
    """``message`` with its arrays copied into one packed buffer, and that buffer."""
    packed = pack_arrays([(name, array.dtype.name, array.shape) for name, array in message.arrays.items()])
    for name, array in message.arrays.items():
        packed.arrays[name][...] = array
    return dataclasses.replace(message, arrays=packed.arrays), packed


def stream(frames: list, messages: int) -> tuple[float, float]:
    """CPU-us per message of a forked sender and of this receiver over ``ipc://``: (send, receive). Whatever ends
    it (an error, Ctrl-C, SIGTERM under ``run_stoppable``), the sender is gone and its folder removed."""
    with tempfile.TemporaryDirectory(prefix="sluice_message_cost_") as folder:
        endpoint = f"ipc://{folder}/rows.sock"
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _send(endpoint, frames, messages, report_w)
        os.close(report_w)
        try:
            return _receive(endpoint, messages, report_r)
        finally:
            os.close(report_r)
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running: the receiver stopped early
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _send(endpoint: str, frames: list, messages: int, report_w: int) -> None:
    """The forked sender: its own context, made after the fork; it reports its CPU seconds and exits. It dies of the
    signals that stop the bench (the parent's handlers would run the parent's code here)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    status = 1
    try:  # whatever happens, the fork ends here: never in its parent's code
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 8)
        push.connect(endpoint)
        began = time.process_time()
        for _ in range(messages):
            push.send_multipart(frames, copy=False)
        push.close(linger=-1)
        context.term()  # waits for every message to leave: the IO thread's work counts
        os.write(report_w, str(time.process_time() - began).encode())
        status = 0
    finally:
        os._exit(status)


def _receive(endpoint: str, messages: int, report_r: int) -> tuple[float, float]:
    """The receiver's side of ``stream``: every message, then the sender's report."""
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    try:
        pull.setsockopt(zmq.RCVHWM, 8)
        pull.bind(endpoint)
        pull.recv_multipart(copy=False)  # the connection is up; the clock starts after the first message
        began = time.process_time()
        for _ in range(messages - 1):
            pull.recv_multipart(copy=False)
        recv_s = time.process_time() - began
        send_s = float(os.read(report_r, 64).decode())
    finally:
        pull.close(linger=0)
        context.term()
    return 1e6 * send_s / messages, 1e6 * recv_s / (messages - 1)


def queue_cpu_us(frames: list, messages: int) -> tuple[float, float]:
    """CPU-us per message of this thread queueing ``frames`` on an inproc PUSH socket: (send_multipart,
    send_nonblocking), each timed over ``messages`` messages, the queue drained between batches, untimed."""
    context = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    for sock in (push, pull):
        sock.setsockopt(zmq.SNDHWM if sock is push else zmq.RCVHWM, 0)  # no limit: nothing is refused
    pull.bind("inproc://message_cost")
    push.connect("inproc://message_cost")
    ways = {"send_multipart": lambda: push.send_multipart(frames, copy=False, flags=zmq.NOBLOCK),
            "send_nonblocking": lambda: send_nonblocking(push, frames)}
    spent = dict.fromkeys(ways, 0.0)
    batch = 100
    for _ in range(max(1, messages // batch)):
        for name, send in ways.items():
            began = time.process_time()
            for _ in range(batch):
                send()
            spent[name] += time.process_time() - began
            for _ in range(batch):
                pull.recv_multipart(copy=False)
    push.close(linger=0)
    pull.close(linger=0)
    context.term()
    count = max(1, messages // batch) * batch
    return 1e6 * spent["send_multipart"] / count, 1e6 * spent["send_nonblocking"] / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["configs/cartpole.yaml", "configs/grid_3agents.yaml"])
    parser.add_argument("--messages", type=int, default=2000, help="messages streamed in each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="times both frame layouts are streamed in turn")
    args = parser.parse_args()
    if args.messages < 2:
        parser.error(f"--messages: 2 at least (the first one is not timed), got {args.messages}")
    for path in args.configs:
        message = make_blocks(load_config(REPO / path), 0, 0)[0]
        frames = encode(message)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        repeat = max(20, 20_000_000 // max(nbytes, 1))
        packed_message, packed = packed_copy(message)
        packed_frames = encode(packed_message, packed=packed)
        base = {"bench": "message_cost", "config": path, "rows": message.fields["num_rows"],
                "arrays": len(message.arrays), "bytes": nbytes,
                "encode_us": round(per_call_us(lambda: encode(message), repeat), 1),
                "decode_us": round(per_call_us(lambda: decode(frames), repeat), 1),
                "encode_packed_us": round(per_call_us(lambda: encode(packed_message, packed=packed), repeat), 1),
                "decode_packed_us": round(per_call_us(lambda: decode(packed_frames), repeat), 1)}
        messages = max(2, min(args.messages, 2_000_000_000 // nbytes))
        multipart_us, nonblocking_us = queue_cpu_us(frames, messages)
        base.update(send_multipart_us=round(multipart_us, 1), send_nonblocking_us=round(nonblocking_us, 1))
        for round_number in range(1, args.rounds + 1):
            for layout, sent in (("per_array", frames), ("packed", packed_frames)):
                send_us, recv_us = stream(sent, messages)
                emit({**base, "round": round_number, "frames": layout, "frame_count": len(sent),
                      "messages": messages, "send_cpu_us": round(send_us, 1), "recv_cpu_us": round(recv_us, 1)})


if __name__ == "__main__":
    run_stoppable(main)
