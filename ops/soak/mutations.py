"""Hostile messages, by class: each class is a set of variants, and each variant makes one message (its frames)
from a random generator. The variants of the classes every socket gets (random bytes, another protocol version,
corrupt headers) start from a base message that is invalid on that socket whatever a bit flip does to it, so
every message of those classes must be refused; the field-by-field and semantic classes start from a genuine
message and break exactly one thing in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import msgpack
import numpy as np

from protocol.framing import MAX_NDIM, PROTOCOL_TAG
from wire import Parts, pack

Variant = Callable[[np.random.Generator], list[bytes]]
"""Makes one hostile message (its frames)."""


class Outcome(str, Enum):
    """What the receiver must do with every message of a class."""

    REJECTED = "rejected"
    """Data: dropped and counted as a dropped message. Request sockets: answered with ERROR."""
    DROPPED = "dropped"
    """Data: dropped, as a message or as its one row (a policy version the learner never had or too old)."""
    ACCEPTED = "accepted"
    """Data: taken into a batch (the genuine control group, which shows the base messages are valid)."""
    SILENT = "silent"
    """Request sockets: no answer, and nothing changes (a BYE from an identity that never registered)."""
    REPORTED = "reported"
    """Data: hostile but within the learner's documented rules (no verdict: the table shows what it did)."""


@dataclass(frozen=True, kw_only=True)
class HostileClass:
    """One class of hostile messages on one socket."""

    name: str
    """Short name, as the report's table shows it."""
    variants: tuple[tuple[str, Variant], ...]
    """Named ways to make a message of this class; each message uses one, drawn at random."""
    outcome: Outcome
    """What the receiver must do with each of them."""
    share: float = 1.0
    """Relative number of messages this class gets among its socket's classes."""

    def make(self, rng: np.random.Generator) -> tuple[str, list[bytes]]:
        """One message: the variant's name and its frames."""
        name, variant = self.variants[int(rng.integers(len(self.variants)))]
        return name, variant(rng)


OTHER_TAGS = (b"sluice/0", b"sluice/2", b"sluice/99", b"sluice/", b"sluice/1\x00", b"SLUICE/1", b"other/1", b"",
              b"sluice/1" * 20)
"""Frame 0 of a peer speaking another protocol or another major version."""

HEADER_KEYS_WRONG = {"type": [5, None, ["rows"], "no_such_type"], "sender": [5, None, ["x"]],
                     "seq": ["1", 1.5, True, None], "version": ["1", 2.5, False, None], "fields": [[], "x", 5, None],
                     "arrays": [{}, "x", 5, None]}
"""Per header key, values of the wrong type (or, for ``type``, no such type)."""


def random_bytes(rng: np.random.Generator) -> list[bytes]:
    """1 to 4 frames of 0 to 300 random bytes."""
    return [rng.bytes(int(rng.integers(0, 300))) for _ in range(int(rng.integers(1, 5)))]


def frame_variants(base: Callable[[np.random.Generator], Parts]) -> dict[str, tuple[tuple[str, Variant], ...]]:
    """The classes every socket gets, from ``base`` (a message that is invalid on the socket it goes to)."""

    def other_tag(rng: np.random.Generator) -> list[bytes]:
        frames = base(rng).frames()
        return [OTHER_TAGS[int(rng.integers(len(OTHER_TAGS)))], *frames[1:]]

    def bit_flips(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        header = bytearray(pack(parts.header))
        for _ in range(int(rng.integers(1, 9))):
            bit = int(rng.integers(len(header) * 8))
            header[bit // 8] ^= 1 << (bit % 8)
        return [parts.tag, bytes(header), *parts.buffers]

    def truncated(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        header = pack(parts.header)
        return [parts.tag, header[:int(rng.integers(len(header)))], *parts.buffers]

    def not_a_map(rng: np.random.Generator) -> list[bytes]:
        values = ([1, 2], "header", 5, None, b"\x00" * 8, 1.5)
        return [PROTOCOL_TAG, pack(values[int(rng.integers(len(values)))])]

    def wrong_type(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        key = list(HEADER_KEYS_WRONG)[int(rng.integers(len(HEADER_KEYS_WRONG)))]
        choices = HEADER_KEYS_WRONG[key]
        return parts.with_header(**{key: choices[int(rng.integers(len(choices)))]}).frames()

    def missing_key(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        key = list(HEADER_KEYS_WRONG)[int(rng.integers(len(HEADER_KEYS_WRONG)))]
        header = {k: v for k, v in parts.header.items() if k != key}
        return [parts.tag, pack(header), *parts.buffers]

    def huge_array(rng: np.random.Generator) -> list[bytes]:
        descriptors = [{"name": "x", "dtype": "float32", "shape": [1 << 62, 1 << 62], "nbytes": 16},
                       {"name": "x", "dtype": "uint8", "shape": [1 << 40], "nbytes": 1 << 40},
                       {"name": "x", "dtype": "uint8", "shape": [16], "nbytes": (1 << 64) - 1},
                       {"name": "x", "dtype": "uint8", "shape": [-16], "nbytes": 16},
                       {"name": "x", "dtype": "uint8", "shape": [1] * (MAX_NDIM + 1), "nbytes": 1},
                       {"name": "x", "dtype": "object", "shape": [2], "nbytes": 16},
                       {"name": "x", "dtype": "float128", "shape": [1], "nbytes": 16},
                       {"name": "", "dtype": "uint8", "shape": [16], "nbytes": 16},
                       {"name": 7, "dtype": "uint8", "shape": [16], "nbytes": 16},
                       {"name": "x", "dtype": "uint8", "shape": [16], "nbytes": 15},
                       {"name": "x", "dtype": "uint8", "shape": "16", "nbytes": 16}]
        parts = base(rng)
        descriptor = descriptors[int(rng.integers(len(descriptors)))]
        return [*parts.with_header(arrays=[descriptor]).frames()[:2], b"\x00" * 16]

    def frame_count(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        if rng.random() < 0.5:
            return [parts.tag]  # no header at all
        return [*parts.frames(), *([b"\x00"] * int(rng.integers(1, 70)))]  # frames no descriptor names

    def deep_fields(rng: np.random.Generator) -> list[bytes]:
        nested: object = 1
        for _ in range(int(rng.integers(33, 60))):
            nested = [nested]
        return base(rng).with_fields(nested=nested).frames()

    def forbidden_msgpack(rng: np.random.Generator) -> list[bytes]:
        parts = base(rng)
        odd = (msgpack.ExtType(5, b"\x01\x02"), {1: 2}, {b"k": 1}, None)
        choice = int(rng.integers(len(odd)))
        if choice == 3:  # msgpack cannot pack an int beyond 64 bits: send a uint64 after the map instead
            return [parts.tag, pack(parts.header) + b"\xcf" + b"\xff" * 8, *parts.buffers]
        return [parts.tag, pack({**parts.header, "fields": {**parts.header["fields"], "odd": odd[choice]}}),
                *parts.buffers]

    return {
        "random_bytes": (("random_bytes", random_bytes),),
        "other_version": (("other_tag", other_tag),),
        "corrupt_header": (("bit_flips", bit_flips), ("truncated", truncated), ("not_a_map", not_a_map),
                           ("wrong_type", wrong_type), ("missing_key", missing_key), ("huge_array", huge_array),
                           ("frame_count", frame_count), ("deep_fields", deep_fields),
                           ("forbidden_msgpack", forbidden_msgpack)),
    }


def generic_classes(base: Callable[[np.random.Generator], Parts]) -> list[HostileClass]:
    """Random bytes, another version, corrupt headers: each must be refused."""
    return [HostileClass(name=name, variants=variants, outcome=Outcome.REJECTED)
            for name, variants in frame_variants(base).items()]


def variants_of(table: dict[str, Callable[[np.random.Generator], Parts]]) -> tuple[tuple[str, Variant], ...]:
    """Named Parts makers as named frame makers."""
    return tuple((name, _framed(make)) for name, make in table.items())


def _framed(make: Callable[[np.random.Generator], Parts]) -> Variant:
    return lambda rng: make(rng).frames()
