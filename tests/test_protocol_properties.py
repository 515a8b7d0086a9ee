"""Property tests of ``protocol.decode``: whatever frames arrive (random bytes, headers of random msgpack values
under the real keys, byte-level corruptions of a real ROWS message, packed or not), it returns a Message or raises
ProtocolError, never anything else."""

from __future__ import annotations

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import Message, MessageType, ProtocolError, decode, encode, pack_arrays

TAG = b"sluice/1"
HEADER_KEYS = ("type", "sender", "seq", "version", "fields", "arrays", "packed")
ROWS_FIELDS = {"num_rows": 2, "episode_returns": [1.0], "episode_lengths": [4], "env_steps": 8, "agent_steps": 8,
               "token": "t" * 32}
VALID_ROWS = [bytes(frame) for frame in encode(Message(
    type=MessageType.ROWS, sender="host", version=3, fields=ROWS_FIELDS,
    arrays={"obs": np.arange(12, dtype=np.float32).reshape(2, 2, 3), "versions": np.array([3, 2], np.int64)}))]


def packed_rows() -> list[bytes]:
    """The frames of a packed ROWS message (every array in one frame, with padding between them)."""
    packed = pack_arrays([("dones", "uint8", (2, 3)), ("obs", "float32", (2, 2, 3)), ("versions", "int64", (2,))])
    packed.arrays["dones"][...] = 1
    packed.arrays["obs"][...] = np.arange(12).reshape(2, 2, 3)
    packed.arrays["versions"][...] = [3, 2]
    message = Message(type=MessageType.ROWS, sender="host", version=3, fields=ROWS_FIELDS, arrays=packed.arrays)
    return [bytes(frame) for frame in encode(message, packed=packed)]


VALID_PACKED_ROWS = packed_rows()

scalars = (st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64 - 1) | st.floats() | st.text(max_size=12)
           | st.binary(max_size=12) | st.sampled_from([t.value for t in MessageType])
           | st.sampled_from(["float32", "int64", "uint8", "<f4", "object", "V8"]))
msgpack_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                              | st.dictionaries(st.text(max_size=8) | st.sampled_from(HEADER_KEYS), inner, max_size=4),
                              max_leaves=20)


def decodes_or_refuses(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except ProtocolError as err:
        assert err.reason and str(err)


@settings(max_examples=400, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), max_size=6), tagged=st.booleans())
def test_random_frames_only_raise_protocol_error(frames, tagged):
    if tagged and frames:
        frames[0] = TAG
    decodes_or_refuses(frames)


@settings(max_examples=400, deadline=None)
@given(header=st.dictionaries(st.sampled_from(HEADER_KEYS), msgpack_values, max_size=6),
       buffers=st.lists(st.binary(max_size=48), max_size=4))
def test_headers_of_random_values_only_raise_protocol_error(header, buffers):
    decodes_or_refuses([TAG, msgpack.packb(header, use_bin_type=True), *buffers])


@settings(max_examples=400, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID_ROWS) - 1), st.integers(0, 10 ** 6), st.integers(0, 255),
                                st.sampled_from(["set", "cut", "grow"])), min_size=1, max_size=4),
       packed=st.booleans())
def test_corrupted_rows_messages_only_raise_protocol_error(edits, packed):
    frames = [bytearray(frame) for frame in (VALID_PACKED_ROWS if packed else VALID_ROWS)]
    for index, position, value, how in edits:
        frame = frames[index % len(frames)]
        if how == "set" and frame:
            frame[position % len(frame)] = value
        elif how == "cut":
            del frame[position % (len(frame) + 1):]
        else:
            frame.extend(bytes([value]) * (position % 9))
    decodes_or_refuses([bytes(frame) for frame in frames])
