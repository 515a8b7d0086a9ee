"""Sluice wire protocol: multipart ZeroMQ messages with a msgpack header.

Frame 0 is ``b"sluice/1"``, frame 1 a msgpack header map, frames 2.. raw
array buffers (or one frame that holds them all: a packed message). See :mod:`protocol.framing` for the layout. This package
must not import torch.
"""

from .endpoints import Endpoint, is_loopback, parse_endpoint
from .framing import (
    ALLOWED_DTYPES,
    MAX_NDIM,
    PACKED_ALIGN,
    PROTOCOL_MAJOR,
    PROTOCOL_NAME,
    PROTOCOL_TAG,
    Limits,
    PackedArrays,
    PackedLayout,
    checked_layout,
    decode,
    encode,
    pack_arrays,
)
from .messages import (
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    Message,
    MessageType,
    ProtocolError,
    check_field_value,
    validate_fields,
)
from .validation import ANY, ArraySpec, check_arrays, check_leading_dims

__all__ = [
    "ALLOWED_DTYPES",
    "ANY",
    "ArraySpec",
    "Endpoint",
    "Limits",
    "MAX_NDIM",
    "Message",
    "MessageType",
    "OPTIONAL_FIELDS",
    "PACKED_ALIGN",
    "PackedArrays",
    "PackedLayout",
    "PROTOCOL_MAJOR",
    "PROTOCOL_NAME",
    "PROTOCOL_TAG",
    "ProtocolError",
    "REQUIRED_FIELDS",
    "check_arrays",
    "checked_layout",
    "check_field_value",
    "check_leading_dims",
    "decode",
    "encode",
    "is_loopback",
    "pack_arrays",
    "parse_endpoint",
    "validate_fields",
]
