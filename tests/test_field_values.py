"""protocol.messages.check_field_value accepts exactly the msgpack-native values (None, str, bool, float, 64-bit
ints, lists and string-keyed maps of them), its one-pass shortcut for flat lists included: property-tested against
a plain recursive definition."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ProtocolError
from protocol.messages import MAX_FIELD_DEPTH, check_field_value

INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1


def native(value: object, depth: int = 0) -> bool:
    """The definition, item by item."""
    if depth > MAX_FIELD_DEPTH:
        return False
    if value is None or isinstance(value, (str, bool, float)):
        return True
    if isinstance(value, int):
        return INT_MIN <= value <= INT_MAX
    if isinstance(value, list):
        return all(native(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and native(item, depth + 1) for key, item in value.items())
    return False


def accepted(value: object) -> bool:
    try:
        check_field_value("f", value)
    except ProtocolError as err:
        assert err.reason == "bad_field"
        return False
    return True


SCALARS = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(min_value=INT_MIN, max_value=INT_MAX),
                    st.integers(min_value=INT_MAX + 1, max_value=1 << 70),  # too big for 64 bits
                    st.integers(min_value=-(1 << 70), max_value=INT_MIN - 1),
                    st.binary(max_size=2), st.tuples(st.integers()))  # not msgpack-native here
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.one_of(st.text(max_size=2), st.integers()), inner, max_size=3)),
    max_leaves=20)


@given(st.lists(SCALARS, max_size=40))
@settings(max_examples=400, deadline=None)
def test_flat_lists_are_accepted_exactly_when_every_item_is_native(value):
    assert accepted(value) == native(value)


@given(VALUES)
@settings(max_examples=300, deadline=None)
def test_nested_values_are_accepted_exactly_when_native(value):
    assert accepted(value) == native(value)


@pytest.mark.parametrize("value, where", [
    ([1.5, 2, INT_MAX + 1], "field 'f[2]' integer 18446744073709551616 does not fit in 64 bits"),
    ([0.5, math.inf, INT_MIN - 1], "field 'f[2]' integer -9223372036854775809 does not fit in 64 bits"),
    ([1, None, b"x"], "field 'f[2]' has type builtins.bytes, which is not msgpack-native"),
])
def test_a_bad_item_in_a_list_is_named_by_its_index(value, where):
    with pytest.raises(ProtocolError, match="^" + re.escape(where)):
        check_field_value("f", value)
