"""Message types, the per-type field schema and the protocol error.

The schema is a plain table (:data:`REQUIRED_FIELDS` / :data:`OPTIONAL_FIELDS`)
so that new message types or fields are added in exactly one place. Field
values must be msgpack-native: ``str``, ``int``, ``float``, ``bool``, ``None``,
``list`` and ``dict`` with ``str`` keys, nested to at most
:data:`MAX_FIELD_DEPTH` levels. Binary payloads travel as arrays, never as
field values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

import numpy as np

__all__ = [
    "MAX_FIELD_DEPTH",
    "Message",
    "MessageType",
    "OPTIONAL_FIELDS",
    "ProtocolError",
    "REQUIRED_FIELDS",
    "check_field_value",
    "validate_fields",
]

#: Deepest nesting of lists/maps accepted inside ``fields``.
MAX_FIELD_DEPTH = 32

_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1


class ProtocolError(Exception):
    """A message violated the wire protocol.

    ``reason`` is a short snake_case code suitable as a metrics label (for
    example ``"bad_version"`` or ``"missing_field"``); ``str(err)`` is a human
    readable message naming the problem.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (type(self), (self.reason, self.message))

    def __repr__(self) -> str:
        return f"ProtocolError({self.reason!r}, {self.message!r})"


class MessageType(str, Enum):
    """Every message type of the protocol; the value is the wire string."""

    REGISTER = "register"
    REGISTERED = "registered"
    ROWS = "rows"
    WEIGHTS = "weights"
    GET_WEIGHTS = "get_weights"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_ACK = "heartbeat_ack"
    ERROR = "error"
    SHUTDOWN = "shutdown"
    BYE = "bye"
    GET_OPPONENTS = "get_opponents"
    OPPONENTS = "opponents"
    GET_SNAPSHOT = "get_snapshot"
    SNAPSHOT = "snapshot"


#: Fields each message type MUST carry, with their Python type. ``bool`` is
#: never accepted where ``int`` is expected; ``float`` also accepts ``int``.
REQUIRED_FIELDS: dict[MessageType, dict[str, type]] = {
    MessageType.REGISTER: {"host": str, "num_workers": int},
    MessageType.REGISTERED: {
        "config": dict,
        "data_endpoint": str,
        "weights_endpoint": str,
        "run_id": str,
    },
    MessageType.ROWS: {
        "num_rows": int,
        "episode_returns": list,
        "episode_lengths": list,
        "env_steps": int,
        "agent_steps": int,
    },
    MessageType.WEIGHTS: {"names": list},
    MessageType.GET_WEIGHTS: {},
    MessageType.HEARTBEAT: {},
    MessageType.HEARTBEAT_ACK: {},
    MessageType.ERROR: {"reason": str, "message": str},
    MessageType.SHUTDOWN: {"reason": str},
    MessageType.BYE: {},
    MessageType.GET_OPPONENTS: {"num_envs": int},
    MessageType.OPPONENTS: {"alternation": int, "digests": list, "indices": list, "num_snapshots": int},
    MessageType.GET_SNAPSHOT: {"digest": str},
    MessageType.SNAPSHOT: {"digest": str},
}

#: Fields a message type MAY carry; when present they must have this type.
#: Fields in neither table are passed through unchecked (beyond being
#: msgpack-native) so that additive changes stay compatible.
OPTIONAL_FIELDS: dict[MessageType, dict[str, type]] = {
    MessageType.REGISTER: {"metrics_address": str, "session": str},
    MessageType.REGISTERED: {"token": str, "data_endpoints": list, "data_ipc": dict, "packed_rows": bool,
                             "shared_rows": bool},
    MessageType.HEARTBEAT: {"env_error": dict, "token": str},
    MessageType.HEARTBEAT_ACK: {"run_id": str, "data_endpoints": list},
    MessageType.ROWS: {"episode_stats": dict, "env_restarts": int, "host_stats": dict, "token": str, "shared": dict},
    MessageType.BYE: {"reason": str},
    MessageType.ERROR: {"refused": str, "refused_seq": int},
}
"""``REGISTERED.token``: a secret the learner hands one registration; the host sends it back in every ROWS
message, and the learner drops rows whose token no registered host holds. ``REGISTER.session``: a random name the
host picks once for its connection; a REGISTER from the same identity and session while that registration is
current gets the same token again (REGISTERs that queued up during a pause or partition are answered alike, so no
reply is stale). ``HEARTBEAT.token``: the token the host sends rows with; one the learner no longer holds for that
identity is refused as ``not_registered``, and the host registers again. ``data_endpoints`` (REGISTERED,
HEARTBEAT_ACK): with several learner ranks, the data sockets this host pushes rows to (``tcp://*:PORT`` meaning the
learner's own address); a host without the field pushes to ``data_endpoint``. ``REGISTERED.data_ipc``: for each of
those data endpoints whose learner rank also listens on a unix socket, that route (``{"endpoint": "ipc://PATH",
"machine": ..., "file": ...}``, protocol/same_machine.py); a host on that rank's machine, in its network namespace,
that sees the very socket file, pushes there instead (all ranks' routes come at registration, so the later
``data_endpoints`` of a HEARTBEAT_ACK are mapped the same way). ``BYE.reason``: why a host leaves
when it is not a clean stop (e.g. a worker that crashes in a loop); absent for a normal goodbye.
``REGISTERED.packed_rows``: the learner reads ROWS messages packed (every array in one frame,
protocol/framing.py); a host sends them so only to a learner that says so (an older one refuses them).
``REGISTERED.shared_rows``: the learner reads a ROWS message's packed payload from a shared-memory slot of the host's
that the message's ``shared`` field names (protocol/shared_rows.py); a host whose every data route is ipc:// (the
learner's machine) sends them so, the message then has no array frame.
``ERROR.refused``: the type of the message the error answers, when the learner could decode it (a host registering
again reads a late refusal of its last heartbeat as that, not as a refusal of its REGISTER); ``ERROR.refused_seq``:
that message's ``seq`` (a host ignores refusals of heartbeats it sent before its current registration)."""


def _type_ok(value: Any, expected: type) -> bool:
    """Return whether ``value`` has type ``expected`` (bool is not int)."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


_SCALARS = frozenset({str, bool, float})
"""Types whose values are msgpack-native whatever they hold (int needs its range checked)."""
_LIST_SCALARS = _SCALARS | {type(None)}
"""A list holding only these is msgpack-native as it is (checked with one pass in C, not per item)."""
_NUMBERS = frozenset({int, float})


def check_field_value(path: str, value: Any, depth: int = 0) -> None:
    """Raise ``ProtocolError("bad_field")`` unless ``value`` is msgpack-native.

    ``path`` names the value in error messages (e.g. ``"config.lr"``).
    """
    if depth > MAX_FIELD_DEPTH:
        raise ProtocolError("bad_field", f"field '{path}' is nested deeper than {MAX_FIELD_DEPTH} levels")
    if value is None or isinstance(value, (str, bool, float)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ProtocolError("bad_field", f"field '{path}' integer {value} does not fit in 64 bits")
        return
    if isinstance(value, list):
        kinds = set(map(type, value))  # the common lists (episode returns, lengths) pass here without a loop
        if kinds <= _LIST_SCALARS or (kinds <= _NUMBERS and _INT_MIN <= min(value) and max(value) <= _INT_MAX):
            return
        for i, item in enumerate(value):
            if item is None or type(item) in _SCALARS or (type(item) is int and _INT_MIN <= item <= _INT_MAX):
                continue  # the common case, without building the path
            check_field_value(f"{path}[{i}]", item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(
                    "bad_field", f"field '{path}' has a non-string key {key!r} ({type(key).__name__})"
                )
            check_field_value(f"{path}.{key}", item, depth + 1)
        return
    raise ProtocolError(
        "bad_field",
        f"field '{path}' has type {type(value).__module__}.{type(value).__qualname__}, "
        "which is not msgpack-native (use str/int/float/bool/None/list/dict)",
    )


def validate_fields(msg_type: MessageType, fields: Mapping[str, Any]) -> None:
    """Check ``fields`` against the schema of ``msg_type``.

    Raises ``ProtocolError`` with reason ``"missing_field"`` or ``"bad_field"``.
    """
    if not isinstance(fields, dict):
        raise ProtocolError("bad_header", f"'fields' must be a map, got {type(fields).__name__}")
    required = REQUIRED_FIELDS.get(msg_type, {})
    optional = OPTIONAL_FIELDS.get(msg_type, {})
    for name, expected in required.items():
        if name not in fields:
            raise ProtocolError(
                "missing_field", f"{msg_type.value} message is missing required field '{name}'"
            )
    for name, value in fields.items():
        if not isinstance(name, str):
            raise ProtocolError("bad_field", f"field name {name!r} is not a string")
        expected = required.get(name) or optional.get(name)
        if expected is not None and not _type_ok(value, expected):
            raise ProtocolError(
                "bad_field",
                f"{msg_type.value} field '{name}' must be {expected.__name__}, "
                f"got {type(value).__name__} {value!r:.80}",
            )
        check_field_value(name, value)


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact comparison of dtype (ignoring byte order), shape and contents (NaN equals NaN)."""
    if a.dtype.name != b.dtype.name or a.shape != b.shape:
        return False
    equal_nan = a.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=equal_nan))


@dataclass(frozen=True, kw_only=True, eq=False)
class Message:
    """One protocol message.

    ``fields`` holds msgpack-native values; ``arrays`` holds numpy arrays sent
    as raw buffers, in insertion order. A ``str`` ``type`` is converted to
    :class:`MessageType` (``ValueError`` if unknown). Equality compares array
    contents exactly; messages are unhashable.
    """

    type: MessageType
    sender: str
    seq: int = 0
    version: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.type, MessageType):
            object.__setattr__(self, "type", MessageType(self.type))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.type == other.type
            and self.sender == other.sender
            and self.seq == other.seq
            and self.version == other.version
            and self.fields == other.fields
            and list(self.arrays) == list(other.arrays)
            and all(_arrays_equal(np.asarray(self.arrays[k]), np.asarray(other.arrays[k])) for k in self.arrays)
        )

    __hash__ = None  # type: ignore[assignment]
