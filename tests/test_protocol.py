"""Tests for the wire protocol package (framing, schema, validation, endpoints)."""

from __future__ import annotations

import random
import sys
from typing import Any, Iterator

import msgpack
import numpy as np
import pytest
import zmq

from protocol import (
    ArraySpec,
    Endpoint,
    Limits,
    Message,
    MessageType,
    ProtocolError,
    check_arrays,
    check_leading_dims,
    decode,
    encode,
    is_loopback,
    pack_arrays,
    parse_endpoint,
)

FIELDS: dict[MessageType, dict[str, Any]] = {
    MessageType.REGISTER: {"host": "box-1", "num_workers": 4},
    MessageType.REGISTERED: {
        "config": {"lr": 3e-4, "layers": [64, 64], "nested": {"ok": True, "none": None}},
        "data_endpoint": "tcp://127.0.0.1:5555",
        "weights_endpoint": "tcp://127.0.0.1:5556",
        "run_id": "run-abc",
    },
    MessageType.ROWS: {"num_rows": 5, "episode_returns": [1.5, -2.0], "episode_lengths": [10, 20], "env_steps": 5,
                      "agent_steps": 5},
    MessageType.WEIGHTS: {"names": ["w", "b"]},
    MessageType.GET_WEIGHTS: {},
    MessageType.HEARTBEAT: {},
    MessageType.HEARTBEAT_ACK: {"run_id": "run-abc"},
    MessageType.ERROR: {"reason": "bad_header", "message": "oops"},
    MessageType.SHUTDOWN: {"reason": "done"},
    MessageType.BYE: {},
    MessageType.GET_OPPONENTS: {"num_envs": 16},
    MessageType.OPPONENTS: {"alternation": 3, "digests": ["ab" * 32, "cd" * 32], "indices": [4, 9], "num_snapshots": 10},
    MessageType.GET_SNAPSHOT: {"digest": "ab" * 32},
    MessageType.SNAPSHOT: {"digest": "ab" * 32},
}


def sample_arrays() -> dict[str, np.ndarray]:
    """Arrays of several dtypes, including 0-d, empty and non-contiguous ones."""
    rng = np.random.default_rng(0)
    return {
        "obs": rng.integers(0, 256, size=(5, 4, 4), dtype=np.uint8),
        "act": rng.integers(-3, 3, size=(5,), dtype=np.int64),
        "rew": rng.standard_normal(5).astype(np.float32),
        "done": np.array([True, False, False, True, False]),
        "half": np.arange(6, dtype=np.float16).reshape(2, 3),
        "scalar": np.array(3.25, dtype=np.float64),
        "empty": np.zeros((0, 7), dtype=np.int32),
        "strided": np.arange(20, dtype=np.uint16).reshape(4, 5)[:, ::2],
        "big_endian": np.arange(3, dtype=">i4"),
    }


@pytest.fixture(scope="module")
def zmq_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A real PUSH/PULL pair over loopback TCP on a random port."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 5000)
    push.connect(f"tcp://127.0.0.1:{port}")
    yield push, pull
    push.close()
    pull.close()
    ctx.term()


def make(msg_type: MessageType, **kw: Any) -> Message:
    return Message(type=msg_type, sender=kw.pop("sender", "actor-0"), fields=dict(FIELDS[msg_type]), **kw)


def raises(reason: str, frames: list[Any], match: str | None = None, **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frames, **kw)
    assert info.value.reason == reason, str(info.value)
    if match is not None:
        assert match in str(info.value), str(info.value)
    return info.value


def header_frames(header: dict[str, Any], *buffers: bytes) -> list[bytes]:
    base = {"type": "heartbeat", "sender": "a", "seq": 0, "version": 0, "fields": {}, "arrays": []}
    base.update(header)
    return [b"sluice/1", msgpack.packb(base), *buffers]


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("msg_type", list(MessageType))
def test_round_trip_over_zmq(zmq_pair: tuple[zmq.Socket, zmq.Socket], msg_type: MessageType) -> None:
    push, pull = zmq_pair
    arrays = sample_arrays()
    msg = make(msg_type, seq=7, version=42, arrays=arrays)
    push.send_multipart(encode(msg), copy=False)
    frames = pull.recv_multipart(copy=False)
    assert all(isinstance(f, zmq.Frame) for f in frames)
    got = decode(frames)
    assert got == msg
    assert got.type is msg_type and got.seq == 7 and got.version == 42 and got.sender == "actor-0"
    assert got.fields == FIELDS[msg_type]
    assert list(got.arrays) == list(arrays)
    for name, want in arrays.items():
        have = got.arrays[name]
        assert have.shape == want.shape and have.dtype.name == want.dtype.name, name
        np.testing.assert_array_equal(have, want)
    assert got.arrays["scalar"].ndim == 0 and got.arrays["empty"].shape == (0, 7)


def test_round_trip_without_arrays_and_bytes_frames() -> None:
    msg = Message(type=MessageType.BYE, sender="x")
    frames = encode(msg)
    assert frames[0] == b"sluice/1" and len(frames) == 2
    assert decode([bytes(f) for f in frames]) == msg
    assert decode([memoryview(bytes(f)) for f in frames]) == msg


def test_encode_is_zero_copy_for_contiguous_arrays() -> None:
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = encode(Message(type="rows", sender="a", fields=dict(FIELDS[MessageType.ROWS]), arrays={"obs": obs}))
    view = frames[2]
    assert isinstance(view, memoryview) and view.nbytes == obs.nbytes
    assert np.shares_memory(np.frombuffer(view, dtype=np.float32), obs)
    header = msgpack.unpackb(frames[1])
    assert header["arrays"] == [{"name": "obs", "dtype": "float32", "shape": [3, 4], "nbytes": 48}]
    assert header["type"] == "rows"


def packed_sample() -> tuple[Message, Any]:
    """A ROWS message whose arrays (odd sizes, so padding falls between them) are packed."""
    arrays = {name: array for name, array in sample_arrays().items() if name not in ("strided", "big_endian")}
    packed = pack_arrays([(name, array.dtype.name, array.shape) for name, array in arrays.items()])
    for name, array in arrays.items():
        packed.arrays[name][...] = array
    return make(MessageType.ROWS, seq=3, arrays=packed.arrays), packed


def test_packed_round_trip_over_zmq_is_one_array_frame_sent_without_a_copy(
        zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    msg, packed = packed_sample()
    frames = encode(msg, packed=packed)
    assert len(frames) == 3 and msgpack.unpackb(frames[1])["packed"] is True
    assert np.shares_memory(np.frombuffer(frames[2], dtype=np.uint8), packed.buffer)
    push, pull = zmq_pair
    push.send_multipart(frames, copy=False)
    received = pull.recv_multipart(copy=False)
    got = decode(received)
    assert got == msg and list(got.arrays) == list(msg.arrays)
    payload = np.frombuffer(received[2], dtype=np.uint8)
    start = end = 0  # each array at the first multiple of 8 bytes after the previous one's end, zeros between
    for name, array in got.arrays.items():
        start = -(-end // 8) * 8
        assert array.__array_interface__["data"][0] - payload.ctypes.data == start, name
        assert not payload[end:start].any(), name
        end = start + array.nbytes
    assert len(payload) == end and end > sum(array.nbytes for array in msg.arrays.values())


def test_packed_messages_that_do_not_add_up_are_refused() -> None:
    msg, packed = packed_sample()
    tag, header, payload = (bytes(frame) for frame in encode(msg, packed=packed))
    raises("bad_array", [tag, header, payload[:-1]], f"array 'scalar' ends at byte {len(payload)} of the packed frame, "
                                                f"which has {len(payload) - 1}")
    raises("bad_array", [tag, header, payload + b"\0"], f"the packed frame has {len(payload) + 1} bytes, its arrays "
                                                         f"end at {len(payload)}")
    raises("bad_array", [tag, header, payload, b""], "a packed message has one array frame, this one has 2")
    raises("bad_array", [tag, header], "a packed message has one array frame, this one has 0")
    unpacked = msgpack.unpackb(header)
    raises("bad_header", [tag, msgpack.packb({**unpacked, "packed": 1}), payload], "key 'packed' must be bool")
    raises("bad_array", [tag, msgpack.packb({**unpacked, "packed": False}), payload], "lists 7 array(s) but message has 1")
    assert decode(header_frames({"packed": True}, b"")).arrays == {}  # no arrays: an empty payload


def test_encode_packed_needs_the_packed_arrays_themselves() -> None:
    msg, packed = packed_sample()
    with pytest.raises(ValueError, match="the message's arrays to be the packed arrays themselves"):
        encode(make(MessageType.ROWS, arrays={**msg.arrays, "obs": msg.arrays["obs"].copy()}), packed=packed)
    with pytest.raises(ValueError, match="packed arrays themselves"):
        encode(make(MessageType.ROWS, arrays={"obs": msg.arrays["obs"]}), packed=packed)


def test_encode_rejects_bad_messages() -> None:
    with pytest.raises(ProtocolError, match="missing required field 'host'"):
        encode(Message(type=MessageType.REGISTER, sender="a", fields={"num_workers": 1}))
    with pytest.raises(ProtocolError, match="not msgpack-native"):
        encode(Message(type=MessageType.HEARTBEAT, sender="a", fields={"x": np.float32(1)}))
    with pytest.raises(ProtocolError, match="not allowed"):
        encode(Message(type=MessageType.HEARTBEAT, sender="a", arrays={"c": np.zeros(2, np.complex64)}))
    with pytest.raises(ValueError):
        Message(type="nope", sender="a")


def test_protocol_error_is_picklable() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ProtocolError("bad_field", "field 'x' bad")))
    assert err.reason == "bad_field" and str(err) == "field 'x' bad"


# ---------------------------------------------------------------- rejections


def good_frames() -> list[Any]:
    return list(encode(make(MessageType.ROWS, arrays={"obs": np.zeros((2, 3), np.uint8)})))


def test_rejects_wrong_protocol_name() -> None:
    frames = good_frames()
    frames[0] = b"http/1.1"
    raises("bad_protocol", frames, "expected b'sluice/1'")


def test_rejects_wrong_major_version() -> None:
    frames = good_frames()
    frames[0] = b"sluice/2"
    err = raises("bad_version", frames)
    assert "'2'" in str(err) and "major version 1" in str(err)


def test_rejects_too_few_frames() -> None:
    raises("bad_frames", [b"sluice/1"], "need at least 2")
    raises("bad_frame", [b"sluice/1", 12345], "not a bytes-like")


def test_rejects_garbage_header() -> None:
    raises("bad_header", [b"sluice/1", b"\xc1\xff\x00garbage"], "not valid msgpack")
    raises("bad_header", [b"sluice/1", msgpack.packb({"a": 1}) + b"\x01"], "not valid msgpack")


def test_rejects_header_not_a_map() -> None:
    raises("bad_header", [b"sluice/1", msgpack.packb([1, 2, 3])], "must be a msgpack map, got list")


def test_rejects_bad_header_keys() -> None:
    raises("bad_header", header_frames({"seq": "1"}), "'seq' must be int, got str")
    raises("bad_header", header_frames({"version": True}), "'version' must be int, got bool")
    frames = header_frames({})
    frames[1] = msgpack.packb({"type": "bye", "sender": "a", "seq": 0, "version": 0, "arrays": []})
    raises("bad_header", frames, "missing key 'fields'")


def test_rejects_unknown_type() -> None:
    raises("unknown_type", header_frames({"type": "teleport"}), "'teleport'")


def test_rejects_missing_field() -> None:
    raises("missing_field", header_frames({"type": "register", "fields": {"host": "h"}}), "'num_workers'")


def test_rejects_wrong_field_type() -> None:
    err = raises("bad_field", header_frames({"type": "register", "fields": {"host": "h", "num_workers": True}}))
    assert "'num_workers' must be int, got bool" in str(err)
    raises("bad_field", header_frames({"type": "shutdown", "fields": {"reason": 3}}), "'reason' must be str")
    raises("bad_field", header_frames({"type": "heartbeat_ack", "fields": {"run_id": 1}}), "'run_id'")
    raises("bad_field", header_frames({"fields": {"blob": b"\x00\x01"}}), "not msgpack-native")


def array_frames(spec: dict[str, Any], buffer: bytes, extra: list[bytes] | None = None) -> list[bytes]:
    base = {"name": "obs", "dtype": "uint8", "shape": [2, 3], "nbytes": 6}
    base.update(spec)
    return header_frames({"arrays": [base]}, buffer, *(extra or []))


def test_rejects_bad_dtype() -> None:
    raises("bad_array", array_frames({"dtype": "object"}, b"\x00" * 6), "dtype 'object' is not allowed")
    raises("bad_array", array_frames({"dtype": "<U4"}, b"\x00" * 6), "not allowed")


def test_rejects_nbytes_mismatch() -> None:
    raises("bad_array", array_frames({"shape": [256], "dtype": "float32", "nbytes": 1024}, b"\x00" * 1000),
           "array 'obs': header says 1024 bytes, frame has 1000")
    raises("bad_array", array_frames({"nbytes": 7}, b"\x00" * 7), "header says 7 bytes, but shape (2, 3)")


def test_rejects_bad_shape_and_names() -> None:
    raises("bad_array", array_frames({"shape": [2, -3]}, b"\x00" * 6), "non-negative")
    raises("bad_array", array_frames({"shape": "23"}, b"\x00" * 6), "'shape' must be list")
    raises("bad_array", array_frames({"shape": [0, 2**63]}, b""), "array 'obs'")
    spec = {"name": "obs", "dtype": "uint8", "shape": [1], "nbytes": 1}
    raises("bad_array", header_frames({"arrays": [spec, spec]}, b"a", b"b"), "more than once")


def test_rejects_frame_count_mismatch() -> None:
    raises("bad_array", array_frames({}, b"\x00" * 6, extra=[b"x"]), "lists 1 array(s) but message has 2")
    raises("bad_array", header_frames({}, b"stray"), "lists 0 array(s) but message has 1")


def test_rejects_too_many_frames() -> None:
    frames = header_frames({}) + [b""] * 70
    raises("too_large", frames, "72 frames, limit is 64")


def test_rejects_header_too_large() -> None:
    frames = header_frames({"fields": {"pad": "x" * 2000}})
    raises("too_large", frames, "limit is 1000", limits=Limits(max_header_bytes=1000))
    raises("too_large", array_frames({}, b"\x00" * 6), "limit is 50", limits=Limits(max_message_bytes=50))


def test_rejects_deeply_nested_fields() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    raises("bad_field", header_frames({"fields": {"deep": deep}}), "nested deeper")
    raises("bad_header", [b"sluice/1", b"\x91" * 5000 + b"\x01"], "not valid msgpack")


# ---------------------------------------------------------------- check_arrays

SPECS = {
    "obs": ArraySpec("uint8", (-1, 4, 4)),
    "rew": ArraySpec("float32", (-1,), allow_nonfinite=False),
    "scalar": ArraySpec("float64", ()),
}


def rows_msg(**arrays: np.ndarray) -> Message:
    base = {"obs": np.zeros((3, 4, 4), np.uint8), "rew": np.zeros(3, np.float32), "scalar": np.array(1.0)}
    base.update(arrays)
    return Message(type=MessageType.ROWS, sender="a", fields=dict(FIELDS[MessageType.ROWS]), arrays=base)


def test_check_arrays_accepts_matching() -> None:
    check_arrays(rows_msg(), SPECS)
    assert check_leading_dims(rows_msg(), SPECS) == 3
    check_arrays(decode(encode(rows_msg())), SPECS)


def test_check_arrays_wrong_shape() -> None:
    with pytest.raises(ProtocolError, match=r"array 'obs': expected shape uint8\[\*, 4, 4\], got uint8\[3, 4, 5\]"):
        check_arrays(rows_msg(obs=np.zeros((3, 4, 5), np.uint8)), SPECS)


def test_check_arrays_wrong_dtype() -> None:
    with pytest.raises(ProtocolError, match="array 'rew': expected dtype float32.*got float64") as info:
        check_arrays(rows_msg(rew=np.zeros(3, np.float64)), SPECS)
    assert info.value.reason == "bad_array"


def test_check_arrays_missing_and_extra() -> None:
    msg = rows_msg()
    del msg.arrays["rew"]
    with pytest.raises(ProtocolError, match="missing array.*'rew'"):
        check_arrays(msg, SPECS)
    with pytest.raises(ProtocolError, match="unexpected array.*'junk'"):
        check_arrays(rows_msg(junk=np.zeros(1)), SPECS)


def test_check_arrays_non_finite() -> None:
    with pytest.raises(ProtocolError, match=r"array 'rew' has 2 non-finite value\(s\), first at index \(1,\)") as info:
        check_arrays(rows_msg(rew=np.array([0, np.nan, np.inf], np.float32)), SPECS)
    assert info.value.reason == "non_finite"
    specs = dict(SPECS, rew=ArraySpec("float32", (-1,)))
    check_arrays(rows_msg(rew=np.array([0, np.nan, np.inf], np.float32)), specs)


def test_check_arrays_inconsistent_leading_dims() -> None:
    with pytest.raises(ProtocolError, match="array 'rew' has 4 rows but array 'obs' has 3"):
        check_arrays(rows_msg(rew=np.zeros(4, np.float32)), SPECS)


def test_array_spec_validates_itself() -> None:
    assert ArraySpec(np.float32, [-1, 2]) == ArraySpec("float32", (-1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ArraySpec("complex64", (1,))
    with pytest.raises(ValueError):
        ArraySpec("uint8", (-2,))


# ---------------------------------------------------------------- endpoints


def test_parse_endpoint_ok() -> None:
    ep = parse_endpoint("tcp://127.0.0.1:5555")
    assert ep == Endpoint("tcp", "127.0.0.1", 5555) and ep.url == "tcp://127.0.0.1:5555"
    assert ep.is_loopback and ep.with_port(6000).url == "tcp://127.0.0.1:6000"
    v6 = parse_endpoint("tcp://[::1]:80")
    assert v6.host == "::1" and v6.url == "tcp://[::1]:80" and v6.is_loopback
    assert parse_endpoint(" tcp://learner.example.com:9000 ").host == "learner.example.com"
    assert parse_endpoint("tcp://*:5555").host == "*"
    ipc = parse_endpoint("ipc:///tmp/sluice.sock")
    assert ipc.host == "/tmp/sluice.sock" and ipc.port is None and ipc.url == "ipc:///tmp/sluice.sock"
    with pytest.raises(ValueError, match="no port"):
        ipc.with_port(1)
    with pytest.raises(ValueError, match="1..65535"):
        ep.with_port(0)


@pytest.mark.parametrize(
    "text, match",
    [
        ("foo", "learner address 'foo' is not a ZeroMQ endpoint: expected tcp://HOST:PORT"),
        ("10.0.0.1:5555", "did you mean 'tcp://10.0.0.1:5555'"),
        ("http://x:1", "scheme 'http' is not supported"),
        ("tcp://host", "missing port"),
        ("tcp://:5555", "missing host"),
        ("tcp://host:abc", "port 'abc' is not a number"),
        ("tcp://host:70000", "not a valid TCP port"),
        ("tcp://host:0", "not a valid TCP port"),
        ("tcp://::1:5555", "IPv6 addresses need brackets"),
        ("tcp://[zz]:5555", "not an IPv6 address"),
        ("tcp://bad host:1", "not a valid host"),
        ("ipc://", "non-empty path"),
    ],
)
def test_parse_endpoint_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match.replace(".", r"\.").replace("(", r"\(").replace("?", r"\?")):
        parse_endpoint(text)


def test_parse_endpoint_custom_name() -> None:
    with pytest.raises(ValueError, match="bind address 'x' is not a ZeroMQ endpoint"):
        parse_endpoint("x", what="bind address")


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("10.0.0.1", "0.0.0.0", "*", "example.com", "::2", ""):
        assert not is_loopback(host), host


# ---------------------------------------------------------------- fuzz


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """Randomly corrupt a valid message: flip, truncate, extend, drop or add frames."""
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(frames))
        if op == 0 and frames[i]:
            j = rng.randrange(len(frames[i]))
            frames[i][j] = rng.randrange(256)
        elif op == 1:
            del frames[i][rng.randrange(len(frames[i]) + 1):]
        elif op == 2:
            frames[i] += bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
        elif op == 3 and len(frames) > 1:
            del frames[i]
        elif op == 4:
            frames.insert(i, bytearray(rng.randbytes(rng.randrange(16))))
        else:
            frames[i] = bytearray(rng.randbytes(rng.randrange(64)))
    return [bytes(f) for f in frames]


def test_fuzz_decode_only_raises_protocol_error() -> None:
    rng = random.Random(1234)
    packed_msg, packed = packed_sample()
    bases = [[bytes(f) for f in encode(make(MessageType.ROWS, arrays=sample_arrays()))],
             [bytes(f) for f in encode(packed_msg, packed=packed)]]
    headers = [bytes(encode(make(t))[1]) for t in MessageType]
    for i in range(6000):
        kind = i % 3
        if kind == 0:
            frames = [rng.randbytes(rng.randrange(40)) for _ in range(rng.randrange(6))]
            if frames and rng.random() < 0.5:
                frames[0] = b"sluice/1"
        elif kind == 1:
            frames = mutate(rng, bases[i % 2])
        else:
            frames = [b"sluice/1", mutate(rng, [rng.choice(headers)])[0]]
        try:
            decode(frames)
        except ProtocolError as err:
            assert err.reason and str(err)
        except Exception as exc:  # pragma: no cover - the failure being tested for
            pytest.fail(f"decode raised {type(exc).__name__}: {exc} for frames {frames!r}")


@pytest.mark.integration
def test_protocol_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, protocol; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
