"""W3C trace context values as the wire gives them: well formed or ignored, never an error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.schemas.tracing import (
    TRACEPARENT_MAX,
    TRACESTATE_MAX,
    derived_id,
    parse_traceparent,
    trace_context,
    valid_traceparent,
    valid_tracestate,
)

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_well_formed_traceparent_is_read() -> None:
    tp = parse_traceparent(GOOD)
    assert tp is not None
    assert tp.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert tp.span_id == 0xB7AD6B7169203331
    assert tp.sampled
    assert valid_traceparent(GOOD) == GOOD
    # A later version may add fields: read, its known part only.
    assert parse_traceparent("01-" + GOOD[3:] + "-more") == tp


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "",
        "garbage",
        GOOD.upper(),
        "ff" + GOOD[2:],
        GOOD + "-x",
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
        GOOD + "\n",
        "01-" + GOOD[3:] + "-" + "x" * TRACEPARENT_MAX,
    ],
)
def test_anything_else_is_ignored(value: object) -> None:
    assert parse_traceparent(value) is None
    assert valid_traceparent(value) is None
    assert trace_context(value, "a=b") == (None, None)


def test_tracestate_is_kept_only_when_well_formed() -> None:
    assert valid_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE") == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert valid_tracestate("tenant@vendor=x") == "tenant@vendor=x"
    for bad in ("", "novalue", "a=b\n", "A=b", "a=" + "b" * TRACESTATE_MAX, ",".join(["a=b"] * 33)):
        assert valid_tracestate(bad) is None, bad
    assert trace_context(GOOD, "bad state") == (GOOD, None)
    assert trace_context(GOOD, "k=v") == (GOOD, "k=v")


@given(st.text(max_size=300))
def test_no_text_makes_the_readers_raise(text: str) -> None:
    parsed = parse_traceparent(text)
    if parsed is not None:
        assert valid_traceparent(text) == text and len(text) <= TRACEPARENT_MAX
    state = valid_tracestate(text)
    assert state is None or len(state) <= TRACESTATE_MAX


def test_derived_ids_are_stable_and_never_zero() -> None:
    assert derived_id(64, "run", "r1") == derived_id(64, "run", "r1")
    assert derived_id(64, "run", "r1") != derived_id(64, "run", "r2")
    assert 0 < derived_id(64, "x") < 1 << 64
    assert 0 < derived_id(128, "x") < 1 << 128
