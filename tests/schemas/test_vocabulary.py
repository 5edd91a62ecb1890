"""The vocabulary: wait keys and waiting entries format to exactly the text history holds and
parse back (totally), and every word the code writes is in its Literal."""

from __future__ import annotations

import json
import re
from functools import reduce
from pathlib import Path
from typing import get_args

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sojourn.actors.core.state import fold
from sojourn.projections.summary import RunSummary, summarize
from sojourn.schemas.codec import decode_child_outcome, encode, to_raw
from sojourn.schemas.events import RunEvent, RunStarted, RunSuspended, ValueRecorded
from sojourn.schemas.vocabulary import (
    CHILD_STATUSES,
    LLM_STEP,
    OP_KINDS,
    OP_STATUSES,
    PATCH_KIND,
    POLL_WAIT,
    RUN_STATUSES,
    SPEND_KIND,
    STEP_KINDS,
    SUSPEND_REASONS,
    TERMINAL,
    VALUE_KINDS,
    WAIT_KINDS,
    WAITING_KINDS,
    WAKE_REASONS,
    ChildStatus,
    OpKind,
    OpStatus,
    RunStatus,
    SuspendReason,
    WaitingOn,
    WaitKey,
    WakeReason,
    is_terminal,
    suspend_reason,
    value_op,
    wake_reason,
)
from sojourn.schemas.wire import (
    CHILD_SIGNAL,
    DECIDE_SIGNAL,
    RESERVED_SIGNAL_PREFIX,
    ChildOutcome,
    child_signal,
    decide_signal,
)
from tests.strategies import (
    any_histories,
    run_ids,
    signal_names,
    wait_keys_typed,
    waiting_entries,
)

ROOT = Path(__file__).resolve().parent.parent.parent

# --- wait keys ---------------------------------------------------------------------------------


@given(wait_keys_typed)
def test_a_wait_key_round_trips(key: WaitKey) -> None:
    text = key.format()
    assert WaitKey.parse(text) == key
    assert WaitKey.parse(text).format() == text


@given(st.text())
@example("")
@example("signal")
@example("signal:")
@example("select:")
@example("select:a||b")
@example("child:")
@example("sleep:x")
@example("poll ")
@example("other:thing")
def test_parsing_a_wait_key_is_total_and_lossless(text: str) -> None:
    key = WaitKey.parse(text)  # never raises
    assert key.format() == text
    assert key.kind in WAIT_KINDS


@given(signal_names, st.lists(signal_names, min_size=1, max_size=4), run_ids)
def test_wait_keys_are_the_text_writers_stored_before_the_type(
    name: str, names: list[str], run_id: str
) -> None:
    # The f-strings of actors/agents/context.py and actors/agents/patterns.py, spelled out: the
    # same bytes.
    assert WaitKey.sleep().format() == "sleep"
    assert WaitKey.poll().format() == POLL_WAIT == "poll"
    assert WaitKey.signal(name).format() == f"signal:{name}"
    assert WaitKey.select(*names).format() == "select:" + "|".join(names)
    assert WaitKey.child(run_id).format() == f"child:{run_id}"


def test_wait_keys_by_example() -> None:
    assert WaitKey.parse("select:docs.signed|timer") == WaitKey.select("docs.signed", "timer")
    assert WaitKey.parse("signal:docs.signed").signals == ("docs.signed",)
    assert WaitKey.parse("select:a|b").signals == ("a", "b")
    assert WaitKey.parse("child:r1-c3") == WaitKey.child("r1-c3")
    assert WaitKey.parse("child:r1-c3").signals == ()
    assert WaitKey.parse("select:a").kind == "select"  # one name, still a select
    assert WaitKey.parse("poll").kind == "poll"
    assert WaitKey.parse("k") == WaitKey("other", target="k")
    with pytest.raises(ValueError, match="at least one"):
        WaitKey.select()
    with pytest.raises(ValueError, match=r"\|"):
        WaitKey.select("a|b")


def test_every_key_in_the_golden_file_parses_to_a_known_kind() -> None:
    golden = (ROOT / "tests" / "schemas" / "golden_events.jsonl").read_text()
    # the wait events' keys (a concurrency key, decision 0048, is another kind of key)
    keys = [
        e["key"]
        for line in golden.splitlines()
        if line.strip()
        for e in json.loads(line)
        if e["type"].startswith("wait.") and "key" in e
    ]
    assert keys
    for raw in keys:
        key = WaitKey.parse(raw)
        assert key.kind != "other", raw
        assert key.format() == raw


# --- what a run waits on ----------------------------------------------------------------------


@given(waiting_entries)
def test_a_waiting_entry_round_trips(entry: WaitingOn) -> None:
    assert WaitingOn.parse(entry.format()) == entry


@given(st.text())
@example("timer")
@example("timer:")
@example("run:")
@example("retry:send")
@example("signal")
def test_parsing_a_waiting_entry_is_total_and_lossless(text: str) -> None:
    entry = WaitingOn.parse(text)  # never raises
    assert entry.format() == text
    assert entry.kind in WAITING_KINDS


def test_waiting_entries_by_example() -> None:
    assert WaitingOn.signal("docs.signed").format() == "signal:docs.signed"
    assert WaitingOn.run("r1-c0").format() == "run:r1-c0"
    assert WaitingOn.timer().format() == "timer"
    assert WaitingOn.retry("send").format() == "retry:send"
    assert WaitingOn.parse(f"signal:{CHILD_SIGNAL}.c1") == WaitingOn.signal("sojourn-child.c1")
    assert WaitingOn.parse("timer:x") == WaitingOn("other", "timer:x")


# --- the Literals -----------------------------------------------------------------------------


def test_statuses() -> None:
    assert RUN_STATUSES == get_args(RunStatus)
    assert TERMINAL == {"completed", "failed", "cancelled"}
    assert TERMINAL <= set(RUN_STATUSES)
    assert [s for s in RUN_STATUSES if is_terminal(s)] == ["completed", "failed", "cancelled"]
    assert set(TERMINAL) | {"rejected"} == set(CHILD_STATUSES)
    assert CHILD_STATUSES == get_args(ChildStatus)
    assert SUSPEND_REASONS == get_args(SuspendReason)


def test_each_tuple_is_its_literal() -> None:
    assert OP_KINDS == get_args(OpKind)
    assert set(OP_KINDS) == {"step", "wait", "child", "other", *VALUE_KINDS}
    assert OP_STATUSES == get_args(OpStatus)
    assert WAKE_REASONS == get_args(WakeReason)
    assert PATCH_KIND in VALUE_KINDS and SPEND_KIND in VALUE_KINDS and LLM_STEP in STEP_KINDS


@given(st.text(max_size=12) | st.sampled_from(SUSPEND_REASONS))
def test_reading_a_suspension_reason_is_total(text: str) -> None:
    reason = suspend_reason(text)
    assert reason in SUSPEND_REASONS
    assert reason == (text if text in SUSPEND_REASONS else "other")


@given(st.text(max_size=12) | st.sampled_from(VALUE_KINDS))
def test_the_operation_of_a_value_is_total(text: str) -> None:
    kind = value_op(text)
    assert kind in OP_KINDS
    assert kind == (text if text in VALUE_KINDS else "other")


def test_wake_reasons() -> None:
    assert wake_reason("start") == "start"
    assert wake_reason("watchdog", "stalled") == "watchdog:stalled"


def _wake_code() -> str:
    return "\n".join((_sources("actors"), _sources("broker")))


def _written_wake_reasons() -> set[str]:
    code = _wake_code()
    # ``publish_wake(`` up to the first string, over arguments that are calls themselves.
    written = set(re.findall(r'publish_wake\((?:[^()"]|\([^()]*\))*"(\w+)"', code))
    written |= set(re.findall(r'wake_reason\(\s*"(\w+)"', code))
    return written


def test_every_wake_reason_the_code_writes_is_in_the_vocabulary() -> None:
    written = _written_wake_reasons()
    assert {"start", "timer", "takeover", "watchdog"} <= written, "the patterns need updating"
    assert written <= set(WAKE_REASONS), written - set(WAKE_REASONS)


def test_the_wake_header_is_written_only_through_wake_reason() -> None:
    # Typed ``WakeReason`` in ``publish_wake`` and ``wake_reason``, checked by mypy; a header
    # value written as text would escape that check.
    assert not re.findall(r"""WAKE_REASON: [rbf]*["']""", _wake_code())


_UNKNOWN: list[RunEvent] = [
    RunStarted(run_id="r", agent="a", input=to_raw(None), at=1.0),
    ValueRecorded(position=0, kind="a-kind-from-a-newer-version", value=to_raw(1), at=2.0),
    RunSuspended(reason="a-reason-from-a-newer-version", detail="d", at=3.0),
]


@given(any_histories)
@example(_UNKNOWN)
def test_the_folds_hold_only_typed_words(events: list[RunEvent]) -> None:
    state = fold(events)
    assert state.status in RUN_STATUSES
    assert state.suspended_reason is None or state.suspended_reason in SUSPEND_REASONS
    for op in state.ops:
        assert op.kind in OP_KINDS and op.status in OP_STATUSES
    summary = reduce(summarize, events, RunSummary())
    assert summary.status in RUN_STATUSES
    assert summary.suspended_reason is None or summary.suspended_reason in SUSPEND_REASONS
    assert summary.suspended_reason == state.suspended_reason


def test_words_a_newer_version_writes_read_as_other_and_keep_their_text() -> None:
    state = fold(_UNKNOWN)
    assert state.suspended_reason == "other" and state.suspended_detail == "d"
    assert state.ops[0].kind == "other"
    assert state.ops[0].name == "a-kind-from-a-newer-version"
    assert reduce(summarize, _UNKNOWN, RunSummary()).suspended_reason == "other"


def _sources(folder: str) -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / folder).rglob("*.py")))


def test_every_suspension_reason_the_code_writes_is_in_the_vocabulary() -> None:
    code = _sources("actors")
    written = set(re.findall(r'suspend\(\s*(?:reason=)?"(\w+)"', code))
    written |= set(re.findall(r'RunSuspended\([^)]*?reason="(\w+)"', code, re.S))
    assert written, "no suspension found: the patterns need updating"
    assert written <= set(SUSPEND_REASONS), written - set(SUSPEND_REASONS)


def test_every_child_status_the_code_writes_is_in_the_vocabulary() -> None:
    code = _sources("actors")
    written = set(re.findall(r'ChildOutcome\([^)]*?status="(\w+)"', code, re.S))
    assert written, "no ChildOutcome(...) found: the pattern needs updating"
    assert written <= set(CHILD_STATUSES), written - set(CHILD_STATUSES)


def test_every_value_kind_the_code_writes_is_in_the_vocabulary() -> None:
    written = set(re.findall(r'_value\(\s*"(\w+)"', _sources("actors")))
    assert written, "no ctx._value(...) found: the pattern needs updating"
    assert written <= set(VALUE_KINDS), written - set(VALUE_KINDS)


# --- reserved signals and the child notice ----------------------------------------------------


def test_reserved_signal_names() -> None:
    assert RESERVED_SIGNAL_PREFIX == "sojourn-"
    assert CHILD_SIGNAL == "sojourn-child" and DECIDE_SIGNAL == "sojourn-decide"
    assert child_signal("r1-c0") == "sojourn-child.r1-c0"
    assert decide_signal(3, 2) == decide_signal("3", "2") == "sojourn-decide.3.2"
    for name in (child_signal("x"), decide_signal(0, 1)):
        assert name.startswith(RESERVED_SIGNAL_PREFIX)


@pytest.mark.parametrize("status", CHILD_STATUSES)
def test_a_child_notice_is_the_same_bytes_and_decodes(status: ChildStatus) -> None:
    notice = ChildOutcome(child_run_id="r1-c0", status=status, output=to_raw(None))
    data = encode(notice)
    assert data == (
        b'{"child_run_id":"r1-c0","status":"' + status.encode() + b'","output":null,"error":null}'
    )
    assert decode_child_outcome(data) == notice


def test_a_child_notice_with_an_unknown_status_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_child_outcome(b'{"child_run_id":"c","status":"exploded","output":null}')
