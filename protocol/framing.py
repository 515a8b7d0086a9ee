"""Encoding and strict decoding of multipart ZeroMQ messages.

Wire layout::

    frame 0   b"sluice/1"                  protocol name and MAJOR version
    frame 1   msgpack map                  {"type", "sender", "seq", "version",
                                            "fields", "arrays"[, "packed"]}
    frame 2.. raw C-contiguous buffers     one per entry of header["arrays"]

or, when the header says ``"packed": true``, one frame 2 that holds every array
one after another, each starting at the first multiple of ``PACKED_ALIGN``
bytes after the previous one's end (the padding is zeros and the frame ends
where the last array ends), so a message of many small arrays costs one frame.
A sender packs only for a peer that said it reads packed messages (the learner
says so in REGISTERED: ``packed_rows``), since older peers refuse them.
A packed payload may also lie outside the message, in a shared-memory slot its
``shared`` field names (protocol/shared_rows.py), with its layout checked by
:func:`checked_layout` as :func:`decode` checks a header's.

Array buffers are little-endian. Nothing is ever pickled. :func:`decode`
validates every byte it uses and raises only :class:`ProtocolError`.
Unknown top-level header keys are ignored, so that a MINOR revision can add
keys without breaking older peers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from .messages import Message, MessageType, ProtocolError, check_field_value, validate_fields

__all__ = [
    "ALLOWED_DTYPES",
    "Limits",
    "MAX_NDIM",
    "PACKED_ALIGN",
    "PackedArrays",
    "PackedLayout",
    "PROTOCOL_MAJOR",
    "PROTOCOL_NAME",
    "PROTOCOL_TAG",
    "checked_layout",
    "decode",
    "encode",
    "pack_arrays",
]

PROTOCOL_NAME = "sluice"
PROTOCOL_MAJOR = 1
PROTOCOL_TAG = f"{PROTOCOL_NAME}/{PROTOCOL_MAJOR}".encode("ascii")

#: dtype names accepted on the wire.
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    }
)

#: Most dimensions an array may have.
MAX_NDIM = 32

#: In a packed message's payload, every array starts at a multiple of this many bytes (the largest itemsize).
PACKED_ALIGN = 8

_HEADER_TYPES: dict[str, type] = {
    "type": str,
    "sender": str,
    "seq": int,
    "version": int,
    "fields": dict,
    "arrays": list,
}
_ARRAY_KEYS: dict[str, type] = {"name": str, "dtype": str, "shape": list, "nbytes": int}


@dataclass(frozen=True)
class Limits:
    """Size limits enforced by :func:`decode` (violations give ``"too_large"``)."""

    max_frames: int = 64
    max_header_bytes: int = 1 << 20
    max_message_bytes: int = 1 << 30


FrameLike = bytes | bytearray | memoryview | zmq.Frame


_WIRE_DTYPES: dict[str, np.dtype] = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}
_NAMES: dict[np.dtype, str] = {}
for _name in ALLOWED_DTYPES:
    _NAMES[np.dtype(_name).newbyteorder("<")] = _NAMES[np.dtype(_name).newbyteorder(">")] = _name
del _name


def _wire_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype for an allow-listed dtype name."""
    return _WIRE_DTYPES[name]


def dtype_name(dtype: np.dtype) -> str | None:
    """The allow-listed wire name of ``dtype`` (either byte order), or None (a dict lookup: numpy's
    ``dtype.name`` is a Python-level property and showed up in the sender's profile)."""
    return _NAMES.get(dtype)


def _as_bytes_view(array: np.ndarray) -> memoryview:
    """A flat byte memoryview of ``array``'s C-contiguous data (zero-copy if possible)."""
    flat = array.reshape(-1)  # a view when ``array`` is C-contiguous
    return memoryview(flat).cast("B")


def _packed_start(end: int) -> int:
    """Where the array after one that ends at byte ``end`` of a packed payload starts."""
    return -(-end // PACKED_ALIGN) * PACKED_ALIGN


def _packed_offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where each of arrays of ``sizes`` bytes starts in a packed payload, and the payload's length."""
    offsets, end = [], 0
    for nbytes in sizes:
        start = _packed_start(end)
        offsets.append(start)
        end = start + nbytes
    return offsets, end


@dataclass(frozen=True, eq=False)
class PackedArrays:
    """Arrays that are views of one byte buffer at the offsets of a packed message (made by
    :meth:`PackedLayout.allocate`): :func:`encode` sends the buffer as the message's one array frame, without copying
    it."""

    buffer: np.ndarray
    """The payload: uint8, every array's bytes at its offset, zeros between them."""
    arrays: dict[str, np.ndarray]
    """The arrays, by name, in message order: writable views of ``buffer``."""
    layout: PackedLayout
    """Where they lie in ``buffer``."""

    def specs_of(self, arrays: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """The header's array descriptors of a message whose ``arrays`` are these very ones (ValueError if not)."""
        layout = self.layout
        if len(arrays) != len(layout.names) or any(
                arrays.get(name) is not array or array.base is not self.buffer or array.shape != shape
                for (name, array), shape in zip(self.arrays.items(), layout.shapes)):
            raise ValueError("encode(packed=...) needs the message's arrays to be the packed arrays themselves")
        return layout.specs


@dataclass(frozen=True)
class PackedLayout:
    """Where each array of a packed message lies in its payload, for arrays of given names, dtypes and shapes."""

    names: tuple[str, ...]
    """The arrays' names, in message order."""
    dtypes: tuple[np.dtype, ...]
    """Their little-endian wire dtypes."""
    shapes: tuple[tuple[int, ...], ...]
    """Their shapes."""
    offsets: tuple[int, ...]
    """Where each one's bytes start in the payload."""
    total: int
    """The payload's length in bytes."""
    specs: list[dict[str, Any]]
    """The header's array descriptors of a message of these arrays."""

    @functools.cached_property
    def key(self) -> str:
        """The arrays in one string, in message order: ``name:dtype:d0,d1,...`` joined by ``;`` (a ROWS message's
        ``shared.layout``, protocol/shared_rows.py); made at its first use (a decoded message's layout never is)."""
        return ";".join(f"{spec['name']}:{spec['dtype']}:{','.join(map(str, spec['shape']))}" for spec in self.specs)

    @classmethod
    def of(cls, layout: Sequence[tuple[str, str, tuple[int, ...]]]) -> "PackedLayout":
        """The layout of arrays ``layout`` lists as (name, wire dtype name, shape), in message order."""
        dtypes = tuple(_WIRE_DTYPES[dtype] for _, dtype, _ in layout)
        shapes = tuple(tuple(shape) for _, _, shape in layout)
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes)]
        offsets, total = _packed_offsets(sizes)
        specs = [{"name": name, "dtype": dtype, "shape": list(shape), "nbytes": nbytes}
                 for (name, dtype, shape), nbytes in zip(layout, sizes)]
        return cls(names=tuple(name for name, _, _ in layout), dtypes=dtypes, shapes=shapes, offsets=tuple(offsets),
                   total=total, specs=specs)

    def allocate(self, into: np.ndarray | None = None) -> PackedArrays:
        """Uninitialised arrays of this layout in one fresh buffer (its padding zeroed): fill them, then pass them to
        :func:`encode` with ``packed``. ``into``: a uint8 buffer of ``total`` bytes at least to lay them out in
        instead (a shared-memory slot, protocol/shared_rows.py)."""
        if into is None:
            buffer = np.empty(self.total, dtype=np.uint8)
        elif into.dtype != np.uint8 or into.ndim != 1 or len(into) < self.total:
            raise ValueError(f"allocate(into=...) needs a uint8 buffer of {self.total} bytes at least")
        else:
            buffer = into[:self.total]
        arrays: dict[str, np.ndarray] = {}
        end = 0
        for name, dtype, shape, start in zip(self.names, self.dtypes, self.shapes, self.offsets):
            if start > end:
                buffer[end:start] = 0  # padding: nothing of this process's memory leaves in it
            array = arrays[name] = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=start)
            end = start + array.nbytes
        return PackedArrays(buffer=buffer, arrays=arrays, layout=self)


def pack_arrays(layout: Sequence[tuple[str, str, tuple[int, ...]]]) -> PackedArrays:
    """Uninitialised arrays of ``layout`` ((name, wire dtype name, shape) in message order) laid out in one fresh
    buffer as a packed message carries them (``PackedLayout.of(layout).allocate()``)."""
    return PackedLayout.of(layout).allocate()


def encode(msg: Message, limits: Limits | None = None, *,
           packed: PackedArrays | None = None) -> list[bytes | memoryview]:
    """Encode ``msg`` as ``[frame0, header, *array buffers]``, or, with ``packed`` (whose arrays must be the very
    ``msg.arrays``), as ``[frame0, header, packed.buffer]``.

    Array buffers are memoryviews sharing memory with C-contiguous,
    little-endian inputs; other arrays are copied once. Keep the arrays alive
    and unmodified until ZeroMQ has sent them when using ``copy=False``.
    Raises :class:`ProtocolError` if the message itself violates the protocol
    (bad field, dtype, or, when ``limits`` is given, size).
    """
    msg_type = MessageType(msg.type)
    if not isinstance(msg.sender, str):
        raise ProtocolError("bad_header", f"sender must be str, got {type(msg.sender).__name__}")
    for key in ("seq", "version"):
        value = getattr(msg, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError("bad_header", f"{key} must be int, got {type(value).__name__}")
        check_field_value(key, value)
    validate_fields(msg_type, msg.fields)

    if packed is None:
        specs, buffers = _array_frames(msg.arrays)
    else:
        specs, buffers = packed.specs_of(msg.arrays), [memoryview(packed.buffer)]
    header_map = {
        "type": msg_type.value,
        "sender": msg.sender,
        "seq": msg.seq,
        "version": msg.version,
        "fields": msg.fields,
        "arrays": specs,
    }
    if packed is not None:
        header_map["packed"] = True
    header = msgpack.packb(header_map, use_bin_type=True)
    frames: list[bytes | memoryview] = [PROTOCOL_TAG, header, *buffers]
    if limits is not None:
        _check_sizes([len(f) if isinstance(f, bytes) else f.nbytes for f in frames], limits)
    return frames


def _array_frames(arrays: dict[str, Any]) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """The header's descriptors of ``arrays`` and a frame of each one's bytes (a view, or a copy in wire form)."""
    specs: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    for name, value in arrays.items():
        if not isinstance(name, str):
            raise ProtocolError("bad_array", f"array name {name!r} is not a string")
        array = np.asarray(value)
        wire_name = dtype_name(array.dtype)
        if wire_name is None:
            raise ProtocolError(
                "bad_array", f"array '{name}': dtype {array.dtype} is not allowed on the wire"
            )
        wire = _WIRE_DTYPES[wire_name]
        if array.dtype != wire or not array.flags.c_contiguous:
            array = np.require(array, dtype=wire, requirements="C")
        buffers.append(_as_bytes_view(array))
        specs.append({"name": name, "dtype": wire_name, "shape": list(array.shape), "nbytes": array.nbytes})
    return specs, buffers


def _check_sizes(sizes: Sequence[int], limits: Limits) -> None:
    """Enforce frame count, header size and total size limits."""
    if len(sizes) > limits.max_frames:
        raise ProtocolError("too_large", f"message has {len(sizes)} frames, limit is {limits.max_frames}")
    if len(sizes) > 1 and sizes[1] > limits.max_header_bytes:
        raise ProtocolError(
            "too_large", f"header is {sizes[1]} bytes, limit is {limits.max_header_bytes}"
        )
    total = sum(sizes)
    if total > limits.max_message_bytes:
        raise ProtocolError("too_large", f"message is {total} bytes, limit is {limits.max_message_bytes}")


def _to_view(index: int, frame: Any) -> memoryview:
    """A flat unsigned-byte memoryview of one received frame."""
    if isinstance(frame, zmq.Frame):
        frame = frame.buffer
    try:
        view = memoryview(frame)
    except TypeError:
        raise ProtocolError(
            "bad_frame", f"frame {index} is a {type(frame).__name__}, not a bytes-like object"
        ) from None
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise ProtocolError("bad_frame", f"frame {index} is not a contiguous buffer")
        view = view.cast("B")
    return view


def _reject_ext(code: int, data: bytes) -> Any:
    """msgpack ext_hook: extension types are not part of the protocol."""
    raise ValueError(f"msgpack extension type {code} is not allowed")


def _unpack_header(raw: memoryview, limits: Limits) -> dict[str, Any]:
    """Decode frame 1 with strict limits and check the top-level key types."""
    cap = min(len(raw), limits.max_header_bytes)
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            max_str_len=cap,
            max_bin_len=cap,
            max_array_len=cap,
            max_map_len=cap,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise ProtocolError("bad_header", f"header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_header", f"header must be a msgpack map, got {type(header).__name__}")
    for key, expected in _HEADER_TYPES.items():
        if key not in header:
            raise ProtocolError("bad_header", f"header is missing key '{key}'")
        value = header[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ProtocolError(
                "bad_header", f"header key '{key}' must be {expected.__name__}, got {type(value).__name__}"
            )
    return header


def _array_spec(index: int, spec: Any, seen: set[str]) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """Validate one array descriptor: its name, wire dtype, shape and size in bytes."""
    if not isinstance(spec, dict):
        raise ProtocolError("bad_array", f"arrays[{index}] must be a map, got {type(spec).__name__}")
    for key, expected in _ARRAY_KEYS.items():
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ProtocolError(
                "bad_array",
                f"arrays[{index}] key '{key}' must be {expected.__name__}, got {type(value).__name__}",
            )
    name: str = spec["name"]
    if not name:
        raise ProtocolError("bad_array", f"arrays[{index}] has an empty name")
    if name in seen:
        raise ProtocolError("bad_array", f"array '{name}' appears more than once")
    seen.add(name)
    dtype_name: str = spec["dtype"]
    if dtype_name not in ALLOWED_DTYPES:
        raise ProtocolError(
            "bad_array",
            f"array '{name}': dtype {dtype_name!r:.40} is not allowed (allowed: {', '.join(sorted(ALLOWED_DTYPES))})",
        )
    shape_list: list[Any] = spec["shape"]
    if len(shape_list) > MAX_NDIM:
        raise ProtocolError("bad_array", f"array '{name}': {len(shape_list)} dimensions, limit is {MAX_NDIM}")
    for dim in shape_list:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ProtocolError(
                "bad_array", f"array '{name}': shape {shape_list!r:.80} must be non-negative ints"
            )
    dtype = _wire_dtype(dtype_name)
    expected_nbytes = math.prod(shape_list) * dtype.itemsize
    nbytes: int = spec["nbytes"]
    if nbytes != expected_nbytes:
        raise ProtocolError(
            "bad_array",
            f"array '{name}': header says {nbytes} bytes, but shape {tuple(shape_list)} of "
            f"{dtype_name} needs {expected_nbytes}",
        )
    return name, dtype, tuple(shape_list), nbytes


def _view_array(name: str, dtype: np.dtype, shape: tuple[int, ...], data: memoryview) -> np.ndarray:
    """``data`` (exactly the array's bytes) as the array."""
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except (ValueError, OverflowError) as exc:
        raise ProtocolError("bad_array", f"array '{name}': cannot view as shape {shape}: {exc}") from None


def _decode_arrays(specs: list[Any], views: list[memoryview], packed: bool) -> dict[str, np.ndarray]:
    """The arrays ``specs`` describe, as views of the array frames (one per array, or one packed payload)."""
    seen: set[str] = set()
    arrays: dict[str, np.ndarray] = {}
    if not packed:
        if len(specs) != len(views):
            raise ProtocolError(
                "bad_array", f"header lists {len(specs)} array(s) but message has {len(views)} array frame(s)"
            )
        for i, (spec, frame) in enumerate(zip(specs, views)):
            name, dtype, shape, nbytes = _array_spec(i, spec, seen)
            if nbytes != len(frame):
                raise ProtocolError("bad_array", f"array '{name}': header says {nbytes} bytes, frame has {len(frame)}")
            arrays[name] = _view_array(name, dtype, shape, frame)
        return arrays
    if len(views) != 1:
        raise ProtocolError("bad_array", f"a packed message has one array frame, this one has {len(views)}")
    payload = views[0]
    end = 0
    for i, spec in enumerate(specs):
        name, dtype, shape, nbytes = _array_spec(i, spec, seen)
        start = _packed_start(end)
        end = start + nbytes
        if end > len(payload):
            raise ProtocolError("bad_array", f"array '{name}' ends at byte {end} of the packed frame, "
                                             f"which has {len(payload)}")
        arrays[name] = _view_array(name, dtype, shape, payload[start:end])
    if end != len(payload):
        raise ProtocolError("bad_array", f"the packed frame has {len(payload)} bytes, its arrays end at {end}")
    return arrays


def checked_layout(specs: Any) -> PackedLayout:
    """The packed layout of arrays that descriptors ``specs`` list (a payload that did not come in a frame: a
    shared-memory slot, protocol/shared_rows.py), checked as a header's are. Raises :class:`ProtocolError` only."""
    if not isinstance(specs, list):
        raise ProtocolError("bad_header", f"array descriptors must be a list, got {type(specs).__name__}")
    seen: set[str] = set()
    checked = [_array_spec(i, spec, seen) for i, spec in enumerate(specs)]
    return PackedLayout.of([(name, _NAMES[dtype], shape) for name, dtype, shape, _ in checked])


def decode(frames: Sequence[FrameLike], limits: Limits = Limits()) -> Message:
    """Decode and fully validate a multipart message.

    ``frames`` may hold ``bytes``, ``memoryview`` or ``zmq.Frame`` objects (as
    returned by ``recv_multipart(copy=False)``). Arrays in the result are
    read-only ``np.frombuffer`` views of the frames. Raises
    :class:`ProtocolError` and nothing else for malformed input.
    """
    count = len(frames)
    if count < 2:
        raise ProtocolError("bad_frames", f"message has {count} frame(s), need at least 2 (tag and header)")
    if count > limits.max_frames:
        raise ProtocolError("too_large", f"message has {count} frames, limit is {limits.max_frames}")
    views = [_to_view(i, f) for i, f in enumerate(frames)]
    _check_sizes([len(v) for v in views], limits)

    tag = bytes(views[0][:64])
    if tag != PROTOCOL_TAG:
        name, sep, major = tag.partition(b"/")
        if sep and name == PROTOCOL_NAME.encode("ascii") and len(views[0]) <= 64:
            raise ProtocolError(
                "bad_version",
                f"peer speaks {PROTOCOL_NAME} major version {major.decode('ascii', 'replace')!r}, "
                f"this side speaks major version {PROTOCOL_MAJOR}",
            )
        raise ProtocolError(
            "bad_protocol", f"frame 0 is {tag[:32]!r}, expected {PROTOCOL_TAG!r}: not a {PROTOCOL_NAME} message"
        )

    header = _unpack_header(views[1], limits)
    try:
        msg_type = MessageType(header["type"])
    except ValueError:
        raise ProtocolError("unknown_type", f"unknown message type {header['type']!r:.60}") from None
    fields: dict[str, Any] = header["fields"]
    validate_fields(msg_type, fields)

    packed = header.get("packed", False)
    if not isinstance(packed, bool):
        raise ProtocolError("bad_header", f"header key 'packed' must be bool, got {type(packed).__name__}")
    arrays = _decode_arrays(header["arrays"], views[2:], packed)
    return Message(
        type=msg_type,
        sender=header["sender"],
        seq=header["seq"],
        version=header["version"],
        fields=fields,
        arrays=arrays,
    )
