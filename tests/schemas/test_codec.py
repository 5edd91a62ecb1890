"""The codec: every event round-trips, events are open-world, commands are closed, and every
event tag ever shipped still decodes (tests/schemas/golden_events.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.schemas.codec import (
    decode_dead_letter,
    decode_events,
    decode_intake_reply,
    decode_start,
    decode_worker_beat,
    encode,
    encode_events,
    from_raw,
    to_raw,
)
from sojourn.schemas.events import ErrorInfo, RunEvent, RunStarted, StepCompleted
from sojourn.schemas.health import ActiveRun, WorkerBeat
from sojourn.schemas.wire import (
    REJECT_CODES,
    DeadLetter,
    ErrorBody,
    IntakeError,
    IntakeOk,
    RejectCode,
    StartTrigger,
)
from tests.strategies import EVENT_TYPES, json_values, schema_events, struct_strategy

GOLDEN = Path(__file__).with_name("golden_events.jsonl")


def tag_of(cls: type[Any]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str), cls
    return tag


# --- events round-trip ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=25)  # per type; the mixed-message test below draws many more
@given(data=st.data())
def test_every_event_type_round_trips(cls: type[Any], data: st.DataObject) -> None:
    event = data.draw(struct_strategy(cls))
    encoded = encode_events([event])
    decoded = decode_events(encoded)
    assert decoded == [event]
    assert type(decoded[0]) is cls
    assert json.loads(encoded)[0]["type"] == tag_of(cls)


@given(st.lists(schema_events, min_size=1, max_size=5))
def test_a_message_of_mschema_eventss_round_trips(events: list[RunEvent]) -> None:
    assert decode_events(encode_events(events)) == events
    assert decode_events(encode_events(tuple(events))) == events


def test_raw_payloads_are_kept_verbatim() -> None:
    # A payload written by another client (spaces, key order) comes back byte for byte.
    data = b'[{"type":"step.completed.v1","position":0,"name":"s","result": {"b": 1,  "a": [2]}}]'
    (event,) = decode_events(data)
    assert isinstance(event, StepCompleted)
    assert event.result == msgspec.Raw(b'{"b": 1,  "a": [2]}')


def with_unknown_fields(event: Any, extra: Any) -> dict[str, Any]:
    """The event as a newer writer would send it: extra fields at every struct level."""
    out: dict[str, Any] = {"future_field": extra, "type": tag_of(type(event))}
    for name, value in msgspec.structs.asdict(event).items():
        if isinstance(value, msgspec.Struct):
            value = {**msgspec.structs.asdict(value), "future_nested": extra}
        out[name] = value
    out["future_last"] = extra
    return out


@given(schema_events, json_values)
def test_events_are_open_world(event: RunEvent, extra: Any) -> None:
    newer = encode([with_unknown_fields(event, extra)])
    assert b"future_field" in newer
    assert decode_events(newer) == [event]


def test_new_reasons_and_value_kinds_do_not_break_old_readers() -> None:
    """Enumerations inside events are plain strings: a newer writer's new value decodes."""
    (ev,) = decode_events(b'[{"type":"run.suspended.v1","reason":"budget","detail":"d"}]')
    assert ev.reason == "budget"  # type: ignore[union-attr]
    (val,) = decode_events(b'[{"type":"value.recorded.v1","position":0,"kind":"x","value":1}]')
    assert val.kind == "x"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b'{"type":"run.resumed.v1"}',  # a message is an array of events
        b'[{"type":"run.exploded.v1"}]',  # unknown tag
        b'[{"position":0,"name":"s"}]',  # no tag
        b'[{"type":"step.started.v1","name":"s"}]',  # missing required field
        b'[{"type":"step.started.v1","position":"0","name":"s"}]',  # wrong type
    ],
)
def test_malformed_messages_raise_decode_error(data: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_events(data)


# --- the golden file --------------------------------------------------------------------------


def golden_lines() -> list[bytes]:
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: it is committed, never regenerated"
    return GOLDEN.read_bytes().splitlines()


def test_golden_file_is_one_message_per_line() -> None:
    raw = GOLDEN.read_bytes()
    assert raw.endswith(b"\n")
    for n, line in enumerate(golden_lines(), 1):
        assert line.strip(), f"line {n} is blank"
        assert isinstance(json.loads(line), list), f"line {n} is not a JSON array"


def test_every_golden_message_decodes() -> None:
    for n, line in enumerate(golden_lines(), 1):
        events = decode_events(line)
        assert events, f"line {n} holds no event"
        for event, obj in zip(events, json.loads(line), strict=True):
            assert tag_of(type(event)) == obj["type"], f"line {n}"


def test_the_golden_file_covers_every_event_tag() -> None:
    """Adding an event to RunEvent without a golden sample fails here: append one line with an
    encoded sample of the new tag to golden_events.jsonl (never edit or remove a line)."""
    in_golden = {obj["type"] for line in golden_lines() for obj in json.loads(line)}
    in_union = {tag_of(cls) for cls in EVENT_TYPES}
    assert not in_union - in_golden, f"no golden sample for {sorted(in_union - in_golden)}"
    assert not in_golden - in_union, f"no event for golden tags {sorted(in_golden - in_union)}"


def test_golden_fields_are_still_fields() -> None:
    """A renamed or removed field would be silently dropped when old history is decoded (events
    are open-world), so every field a golden sample carries must still exist."""

    def check(cls: type[Any], obj: dict[str, Any], where: str) -> None:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        fields = {f.encode_name: f for f in info.fields}
        tag_field = cls.__struct_config__.tag_field
        unknown = set(obj) - set(fields) - ({tag_field} if tag_field else set())
        assert not unknown, f"{where}: {cls.__name__} lost field(s) {sorted(unknown)}"
        for name, value in obj.items():
            f = fields.get(name)
            if f is not None and isinstance(f.type, mi.StructType) and isinstance(value, dict):
                check(f.type.cls, value, f"{where}.{name}")

    for n, line in enumerate(golden_lines(), 1):
        for event, obj in zip(decode_events(line), json.loads(line), strict=True):
            check(type(event), obj, f"line {n}")


def test_golden_samples_without_defaults_decode_to_the_documented_defaults() -> None:
    """Old history omits fields that later got defaults: changing a default changes its meaning.
    The expected values are spelled out (not read from the classes) for that reason."""
    minimal = {
        obj["type"]: event
        for line in golden_lines()
        for event, obj in zip(decode_events(line), json.loads(line), strict=True)
        if "at" not in obj
    }
    expected: dict[str, dict[str, Any]] = {
        "run.started.v1": {"code_version": None, "parent_run_id": None, "at": 0.0},
        "run.cancel_requested.v1": {"reason": "", "by": None},
        "run.cancelled.v1": {"reason": ""},
        "run.resumed.v1": {"by": None, "note": ""},
        "step.started.v1": {"attempt": 1},
        "step.completed.v1": {"attempt": 1, "duration": 0.0},
        "step.failed.v1": {"attempt": 1, "duration": 0.0},
        "wait.started.v1": {"signals": (), "deadline": None, "children": ()},
        "wait.completed.v1": {"signal": None, "signal_id": None, "child_status": None},
        "signal.received.v1": {"sent_by": None},
    }
    for tag, fields in expected.items():
        event = minimal[tag]
        assert {k: getattr(event, k) for k in fields} == fields, tag
    started = minimal["run.started.v1"]
    assert isinstance(started, RunStarted)
    assert (started.trigger.inbox_seq, started.trigger.msg_id, started.trigger.received_at) == (
        0,
        None,
        0.0,
    )
    failed = minimal["step.failed.v1"]
    assert failed.error.traceback is None  # type: ignore[union-attr]


# --- commands are closed ----------------------------------------------------------------------


def test_a_start_trigger_decodes() -> None:
    assert decode_start(b'{"input": {"name": "Ada"}}') == StartTrigger(
        input=msgspec.Raw(b'{"name": "Ada"}')
    )
    assert decode_start(b'{"run_id": "r1", "input": 3}') == StartTrigger(
        input=msgspec.Raw(b"3"), run_id="r1"
    )


@given(struct_strategy(StartTrigger))
def test_a_start_trigger_round_trips(trigger: StartTrigger) -> None:
    assert decode_start(encode(trigger)) == trigger


def test_a_start_trigger_rejects_unknown_fields() -> None:
    with pytest.raises(msgspec.ValidationError, match="inptu"):
        decode_start(b'{"input": 1, "inptu": 2}')


@pytest.mark.parametrize("data", [b"{}", b'{"run_id": "r1"}', b'{"inptu": {"name": "Ada"}}'])
def test_a_start_trigger_requires_input(data: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_start(data)


def test_a_start_trigger_with_bad_shapes() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_start(b'{"input": 1, "run_id": 7}')
    with pytest.raises(msgspec.ValidationError):
        decode_start(b'[{"input": 1}]')
    with pytest.raises(msgspec.DecodeError) as info:
        decode_start(b'{"input": ')
    assert not isinstance(info.value, msgspec.ValidationError)


# --- intake replies and dead letters ----------------------------------------------------------


@given(struct_strategy(IntakeOk) | struct_strategy(IntakeError))
def test_decode_intake_reply_tells_ok_from_error(reply: IntakeOk | IntakeError) -> None:
    decoded = decode_intake_reply(encode(reply))
    assert decoded == reply
    assert type(decoded) is type(reply)


def test_intake_reply_examples() -> None:
    assert decode_intake_reply(b'{"run_id": "r1", "created": false}') == IntakeOk(
        run_id="r1", created=False
    )
    err = decode_intake_reply(b'{"error": {"code": "unknown_agent", "message": "no such agent"}}')
    assert err == IntakeError(error=ErrorBody(code="unknown_agent", message="no such agent"))
    # Replies are open-world too: a newer intake may add fields.
    assert decode_intake_reply(b'{"run_id": "r1", "created": true, "seq": 9}') == IntakeOk(
        run_id="r1", created=True
    )


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"error": "boom"}', msgspec.ValidationError),
        (b'{"run_id": "r1"}', msgspec.ValidationError),
        (b"[]", msgspec.ValidationError),
        (b"nope", msgspec.DecodeError),
    ],
)
def test_malformed_intake_replies(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_intake_reply(data)


@given(struct_strategy(DeadLetter))
def test_a_dead_letter_round_trips(letter: DeadLetter) -> None:
    assert decode_dead_letter(encode(letter)) == letter


def test_reject_codes_match_the_literal() -> None:
    assert REJECT_CODES == get_args(RejectCode)


# --- raw payloads -----------------------------------------------------------------------------


@given(json_values)
def test_to_raw_and_from_raw_round_trip(value: Any) -> None:
    raw = to_raw(value)
    assert isinstance(raw, msgspec.Raw)
    assert from_raw(raw) == value
    assert from_raw(bytes(raw)) == value


def test_from_raw_converts_to_the_requested_type() -> None:
    err = ErrorInfo(type="E", message="m")
    assert from_raw(to_raw(err), ErrorInfo) == err
    assert from_raw(to_raw({"type": "E", "message": "m"}), ErrorInfo) == err
    with pytest.raises(msgspec.ValidationError):
        from_raw(to_raw({"type": "E"}), ErrorInfo)


# --- heartbeats -------------------------------------------------------------------------------


def test_a_beat_lists_each_runs_priority_and_reads_an_older_workers_beat() -> None:
    """A takeover wakes a dead worker's run on its own lane: the beat lists each run's
    priority (``[run_id, agent, since, priority]``); an older worker's three-item entries read
    as the default priority, and a priority outside 1-5 is refused, not taken for a lane."""
    beat = WorkerBeat(worker_id="w", runs=(ActiveRun("r1", "a", 1.5, 1), ActiveRun("r2", "a")))
    data = encode(beat)
    assert b'["r1","a",1.5,1]' in data and b'["r2","a",0.0,3]' in data
    assert decode_worker_beat(data) == beat
    old = decode_worker_beat(b'{"worker_id":"w","runs":[["r1","a",1.5]]}')
    assert old.runs == (ActiveRun("r1", "a", 1.5, 3),)
    with pytest.raises(msgspec.ValidationError):
        decode_worker_beat(b'{"worker_id":"w","runs":[["r1","a",1.5,9]]}')
