"""The gate every body from the wire passes (``sojourn.schemas.guard``), and the codec behind it:
total for any bytes (a value, or a refusal with its reason; never ``RecursionError`` or any
other exception), in agreement with the decoders it protects, and each refusal reason named.

Fixed seed (``derandomize``) and bounded examples: the longer run is ``python -m bench.fuzz``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sojourn.schemas import codec
from sojourn.schemas.guard import (
    BODY_REFUSALS,
    MAX_DEPTH,
    RECORD_DEPTH,
    BodyRefused,
    check_depth,
    check_json,
    depth_of,
)
from sojourn.schemas.wire import REJECT_CODES
from tests.hostile import hostile_bodies, json_values, nested

FUZZ = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _reference_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    return 0


# --- each refusal reason -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\xff\xfe{", "invalid_encoding"),
        (b'{"input": "caf\xe9"}', "invalid_encoding"),
        (b'{"input": "\\ud800"}', "invalid_encoding"),
        (b'{"input": ' + nested(65) + b"}", "too_deep"),
        (b'{"input": ' + nested(100_000) + b"}", "too_deep"),
        (b'{"input": ' + nested(65, "{") + b"}", "too_deep"),
        (b'{"input": {"a": 1', "invalid_json"),
        (b'{"input": 1} trailing', "invalid_json"),
        (b'{"input": NaN}', "invalid_json"),
        (b"", "invalid_json"),
        (b'{"input": 1, "input": 2}', "duplicate_key"),
        (b'{"input": {"k": [1, {"x": 1, "x": 1}]}}', "duplicate_key"),
        (b'{"input": 18446744073709551616}', "out_of_range"),
        (b'{"input": -9223372036854775809}', "out_of_range"),
        (b'{"input": 1e400}', "out_of_range"),
    ],
)
def test_each_refusal_names_its_reason(body: bytes, code: str) -> None:
    with pytest.raises(BodyRefused) as refused:
        check_json(body, envelope=1)
    assert refused.value.code == code
    assert refused.value.message
    assert isinstance(refused.value, msgspec.DecodeError)  # callers treat it as a decode error


def test_every_refusal_reason_is_an_intake_reject_code() -> None:
    assert set(BODY_REFUSALS) <= set(REJECT_CODES)


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": ' + nested(64) + b"}",
        b'{"input": ' + nested(64, "{") + b"}",
        b'{"input": "[[[[' + b"[" * 500 + b'"}',  # brackets in a string are text
        b'{"input": "\\ud83d\\ude00"}',  # a surrogate pair is a character
        b'{"input": "\\\\ud800"}',  # an escaped backslash, then text
        b'{"input": [18446744073709551615, -9223372036854775808, 1.7976931348623157e308]}',
        b'{"input": {"a": 1, "b": {"a": 2}}}',  # the same key in two objects
        b'  {"input": null}  ',
    ],
)
def test_bodies_at_the_limits_pass(body: bytes) -> None:
    check_json(body, envelope=1)


def test_a_signal_payload_has_no_envelope() -> None:
    check_json(nested(64))
    with pytest.raises(BodyRefused, match="65 levels"):
        check_json(nested(65))


def test_a_million_brackets_are_refused_without_recursion() -> None:
    with pytest.raises(BodyRefused) as refused:
        check_json(b"[" * 1_000_000)
    assert refused.value.code == "too_deep"
    with pytest.raises(BodyRefused):
        check_depth(b"{" * 1_000_000)


# --- properties -------------------------------------------------------------------------------


@FUZZ
@given(hostile_bodies)
def test_check_json_is_total(body: bytes) -> None:
    try:
        check_json(body, envelope=1)
    except BodyRefused as e:
        assert e.code in BODY_REFUSALS


@FUZZ
@given(st.one_of(hostile_bodies, json_values.map(lambda v: json.dumps(v).encode())))
def test_what_passes_reads_the_same_in_every_decoder(body: bytes) -> None:
    try:
        check_json(body)
    except BodyRefused:
        return
    ours = msgspec.json.decode(body)
    assert ours == json.loads(body)
    assert _reference_depth(ours) <= MAX_DEPTH
    assert msgspec.json.decode(msgspec.json.encode(ours)) == ours


@FUZZ
@given(json_values)
def test_depth_of_matches_a_recursive_reference(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1)):
        assert depth_of(text.encode()) == _reference_depth(value)


DECODERS: list[Callable[[bytes], object]] = [
    codec.decode_events,
    codec.decode_history,
    codec.decode_start,
    codec.decode_json,
    codec.decode_intake_reply,
    codec.decode_schedule_request,
    codec.decode_schedule_record,
    codec.decode_schedule_answer,
    codec.decode_cancel,
    codec.decode_resume,
    codec.decode_budget,
    codec.decode_decision,
    codec.decode_child_outcome,
    codec.decode_dead_letter,
    codec.decode_worker_beat,
    codec.decode_wedge_record,
    codec.decode_watch_claim,
    codec.decode_lease_holder,
    codec.decode_run_view,
    codec.decode_runs_query,
    codec.from_raw,
]


@FUZZ
@given(hostile_bodies, st.sampled_from(DECODERS))
def test_every_codec_decoder_is_total(body: bytes, decode: Callable[[bytes], object]) -> None:
    try:
        decode(body)
    except msgspec.MsgspecError:
        pass


@pytest.mark.parametrize("decode", DECODERS, ids=lambda d: getattr(d, "__name__", "?"))
def test_no_codec_decoder_recurses_into_a_deep_body(decode: Callable[[bytes], object]) -> None:
    for body in (nested(RECORD_DEPTH + 1), b'{"input":' + nested(100_000, "{") + b"}"):
        with pytest.raises(msgspec.DecodeError):
            decode(body)
    assert codec.peek_run_id(b'{"run_id": ' + nested(100_000) + b"}") is None


@FUZZ
@given(json_values, st.integers(min_value=0, max_value=6))
def test_the_depth_gate_refuses_exactly_what_is_deeper_than_its_limit(
    value: Any, limit: int
) -> None:
    body = json.dumps(value).encode()
    deeper = _reference_depth(value) > limit
    try:
        check_depth(body, limit)
    except BodyRefused as e:
        assert deeper and e.code == "too_deep"
    else:
        assert not deeper
