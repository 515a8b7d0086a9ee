"""The registered actor hosts as bytes, so rank 0 can hand them to the other learner ranks (learner/ranks/link.py).

msgpack of one map per ``Sender``; decoding checks every field's type, so a corrupt value fails loudly rather than
letting rows through. No pickle.
"""

from __future__ import annotations

from dataclasses import asdict, fields

import msgpack

from learner.serve.senders import Sender

SENDER_TYPES = {"name": str, "token": str, "curve_key": (str, type(None)), "num_envs": int, "agent_slots": int}
"""Each Sender field and the type(s) its decoded value must have."""


def encode_senders(senders: list[Sender]) -> bytes:
    """``senders`` as msgpack bytes."""
    return msgpack.packb([asdict(sender) for sender in senders], use_bin_type=True)


def decode_senders(payload: bytes) -> list[Sender]:
    """The senders ``encode_senders`` wrote; ValueError naming the first malformed entry."""
    entries = msgpack.unpackb(payload, raw=False)
    if not isinstance(entries, list):
        raise ValueError(f"senders payload must be a list, got {type(entries).__name__}")
    names = {field.name for field in fields(Sender)}
    senders = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != names:
            raise ValueError(f"sender {index}: expected the fields {sorted(names)}")
        for name, expected in SENDER_TYPES.items():
            if not isinstance(entry[name], expected) or isinstance(entry[name], bool):
                raise ValueError(f"sender {index}: field {name!r} has type {type(entry[name]).__name__}")
        senders.append(Sender(**entry))
    return senders
