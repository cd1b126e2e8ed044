"""Response bodies: encode_json is exactly json.dumps(ensure_ascii=False, compact separators), as UTF-8."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from homeserver.jsonio import encode_json

# What a response can hold: JSON's own values, any text (lone surrogates aside: a response
# never carries one), nested.
TEXT = st.text(st.characters(exclude_categories=["Cs"]))
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(TEXT, VALUES, max_size=6))
def test_a_body_is_what_json_dumps_gives(value):
    assert encode_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def test_bodies_that_are_not_objects_and_odd_values():
    for value in ([1, "ü"], "text", {"a": float("inf")}, {1: "int key", None: "null key"}, {"s": "\u2028\x00\"\\"}):
        assert encode_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
