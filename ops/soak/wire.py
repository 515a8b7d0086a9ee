"""Messages as raw parts, so the fuzz harness can build what ``protocol.encode`` refuses to: a header map and the
array buffers after it, packed by hand with msgpack (never pickled)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from protocol import Message
from protocol.framing import PROTOCOL_TAG, dtype_name


@dataclass(frozen=True, kw_only=True)
class Parts:
    """One message before packing: frame 0, the header map, the array frames."""

    tag: bytes
    """Frame 0 (protocol name and major version)."""
    header: dict[str, Any]
    """Frame 1 before msgpack: type, sender, seq, version, fields, arrays (the array descriptors)."""
    buffers: tuple[bytes, ...]
    """Frames 2..: one raw little-endian buffer per descriptor."""

    def frames(self) -> list[bytes]:
        """The multipart message as sent."""
        return [self.tag, pack(self.header), *self.buffers]

    def with_header(self, **changes: Any) -> Parts:
        """A copy with top-level header keys replaced (a deep copy: the original stays as it was)."""
        header = copy.deepcopy(self.header)
        header.update(changes)
        return Parts(tag=self.tag, header=header, buffers=self.buffers)

    def with_fields(self, **changes: Any) -> Parts:
        """A copy with message fields replaced."""
        return self.with_header(fields={**self.header["fields"], **changes})

    def without_field(self, name: str) -> Parts:
        """A copy without the message field ``name``."""
        return self.with_header(fields={k: v for k, v in self.header["fields"].items() if k != name})


def pack(value: Any) -> bytes:
    """msgpack with bin types, the wire's encoding of a header."""
    return msgpack.packb(value, use_bin_type=True)


def array_parts(arrays: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], tuple[bytes, ...]]:
    """Descriptors and buffers of ``arrays`` as ``protocol.encode`` writes them (little-endian, C order); any
    numpy dtype is taken, so a test can send one the protocol does not allow."""
    specs, buffers = [], []
    for name, value in arrays.items():
        array = np.ascontiguousarray(value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        specs.append({"name": name, "dtype": dtype_name(array.dtype) or array.dtype.name,
                      "shape": list(array.shape), "nbytes": array.nbytes})
        buffers.append(array.tobytes())
    return specs, tuple(buffers)


def parts_of(message: Message) -> Parts:
    """The parts ``protocol.encode`` would send for ``message`` (without its checks)."""
    specs, buffers = array_parts(message.arrays)
    header = {"type": message.type.value, "sender": message.sender, "seq": message.seq,
              "version": message.version, "fields": copy.deepcopy(message.fields), "arrays": specs}
    return Parts(tag=PROTOCOL_TAG, header=header, buffers=buffers)


def with_arrays(parts: Parts, arrays: dict[str, np.ndarray]) -> Parts:
    """A copy of ``parts`` carrying ``arrays`` instead of its own."""
    specs, buffers = array_parts(arrays)
    return Parts(tag=parts.tag, header={**copy.deepcopy(parts.header), "arrays": specs}, buffers=buffers)
