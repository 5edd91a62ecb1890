"""Hypothesis strategies for bodies and headers a hostile sender writes: shared by the guard's
tests (tests/schemas/test_guard.py), the intake's fuzz test
(tests/actors/worker/test_fuzz_intake.py)
and the longer run under bench (``python -m bench.fuzz``).

Each strategy makes bytes that look nearly right, since those reach furthest into a decoder:
valid bodies cut short or with a byte changed, nesting just past the limit and far past it,
keys given twice, numbers out of range, text that is not UTF-8, and header blocks nats-py
cannot parse.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from sojourn.schemas.guard import MAX_DEPTH

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
"""Well-formed JSON values (what a well-meaning sender writes)."""


def nested(depth: int, opener: str = "[") -> bytes:
    """A value ``depth`` levels deep: ``[[...]]``, or ``{"a":{"a":...1}}``."""
    if opener == "[":
        return (b"[" * depth) + (b"]" * depth)
    return (b'{"a":' * depth) + b"1" + (b"}" * depth)


deep_values = st.builds(
    nested,
    st.one_of(
        st.integers(min_value=MAX_DEPTH + 1, max_value=MAX_DEPTH + 8),
        st.sampled_from([2_000, 100_000]),
    ),
    st.sampled_from(["[", "{"]),
)
"""Values nested past the limit: just past it, and far past it."""


@st.composite
def duplicate_keys(draw: st.DrawFn) -> bytes:
    key = draw(st.text(min_size=1, max_size=8))
    a, b = draw(json_values), draw(json_values)
    body = "{" + json.dumps(key) + ":" + json.dumps(a) + "," + json.dumps(key) + ":"
    return (body + json.dumps(b) + "}").encode()


big_numbers = st.one_of(
    st.integers(min_value=2**64, max_value=2**200).map(lambda n: str(n).encode()),
    st.integers(min_value=-(2**200), max_value=-(2**63) - 1).map(lambda n: str(n).encode()),
    st.integers(min_value=309, max_value=99_999).map(lambda e: f"1e{e}".encode()),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1" * 5000]),
)
"""Numbers no 64-bit integer or double holds, and the constants JSON does not have."""

not_utf8 = st.one_of(
    st.sampled_from([b"\xff\xfe{", b'"\xff"', b'{"a":"\xc3"}', b'"\xed\xa0\x80"']),
    st.sampled_from([b'"\\ud800"', b'"\\udfff x"', b'{"\\udc00":1}']),
    st.binary(min_size=1, max_size=64).filter(lambda b: not _is_utf8(b)),
)
"""Bytes that are not UTF-8, and escapes of half a surrogate pair."""


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid body cut short, or with one byte changed, inserted or removed."""
    body = draw(base)
    if not body:
        return body
    i = draw(st.integers(min_value=0, max_value=len(body) - 1))
    how = draw(st.sampled_from(["cut", "flip", "insert", "remove"]))
    if how == "cut":
        return body[:i]
    byte = bytes([draw(st.integers(min_value=0, max_value=255))])
    if how == "flip":
        return body[:i] + byte + body[i + 1 :]
    if how == "insert":
        return body[:i] + byte + body[i:]
    return body[:i] + body[i + 1 :]


def wrapped(value: st.SearchStrategy[bytes], key: str = "input") -> st.SearchStrategy[bytes]:
    """``{"<key>": value}``: a hostile value inside a well-formed envelope."""
    return value.map(lambda v: b'{"' + key.encode() + b'":' + v + b"}")


valid_bodies = json_values.map(lambda v: json.dumps({"input": v}).encode())

FIELDS = [
    "input", "run_id", "parent_run_id", "budget", "reason", "by", "terminate", "note", "action",
    "result", "child_run_id", "status", "output", "error", "usd", "tokens", "steps", "action",
    "spec", "agent", "every", "cron", "zone", "overlap", "approve",
]  # fmt: skip
"""Field names of the bodies sojourn reads (``sojourn.schemas.wire``, ``.schedules``)."""

wrong_shapes = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4).map(
    lambda d: json.dumps(d).encode()
)
"""Well-formed JSON objects with the right field names and values of any type."""

hostile_values = st.one_of(
    deep_values, duplicate_keys(), big_numbers, not_utf8, mutated(valid_bodies)
)
hostile_bodies = st.one_of(
    hostile_values,
    wrong_shapes,
    wrapped(hostile_values),
    st.binary(max_size=256),
    st.sampled_from([b"", b" ", b"null", b"[]", b"[1,2]", b'"x"', b"{}", b'{"input": 1} x']),
)
"""Any body a hostile sender might write, on any subject."""

garbled_header_blocks = st.sampled_from(
    [
        b"XXXX\r\n\r\n",
        b"NATS\r\n\r\n",
        b"NATS/1.0\r\n: x\r\n\r\n",
        b"NATS/1.0\r\ngarbage\r\n\r\n",
        b"NATS/1.0\r\n\xff\xfe: \xff\r\n\r\n",
        b"NATS/1.0 503\r\n\r\n",
        b"NATS/1.0 abc\r\nSojourn-Reply-To: _INBOX.x\r\n\r\n",
    ]
)
"""Raw header blocks (``HPUB``) nats-server passes on and nats-py may not parse."""

hostile_headers = st.dictionaries(
    st.sampled_from(
        ["Sojourn-Reply-To", "Nats-Msg-Id", "Sojourn-Signal-Id", "Status", "Description", "X-A"]
    ),
    st.one_of(
        st.sampled_from(["503", "404", "408", "100", "_INBOX", "_INBOX.", "sojourn.ev.x", ""]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=300),
    ),
    max_size=4,
)
"""Headers a sender may set with any client: names that mean something to sojourn or to
JetStream, with values that are wrong for them."""
