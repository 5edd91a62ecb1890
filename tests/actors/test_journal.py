"""The replay matcher: ``Journal(state)`` answers each operation the code makes, in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.journal import Execute, Journal, Recorded, RecordedFailure
from sojourn.actors.state import fold
from sojourn.schemas.errors import NondeterminismError
from sojourn.schemas.events import (
    ErrorInfo,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)
from tests.actors.test_state import Expected, valid_histories

BOOM = ErrorInfo(type="ValueError", message="boom")


def raw(v: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(v))


def history(*events: RunEvent) -> Journal:
    return Journal(fold([RunStarted(run_id="r1", agent="a", input=raw(None)), *events]))


def completed(p: int, name: str, result: object = None, attempt: int = 1) -> list[RunEvent]:
    return [
        StepStarted(position=p, name=name, attempt=attempt),
        StepCompleted(position=p, name=name, attempt=attempt, result=raw(result)),
    ]


# --- the contract, by example -----------------------------------------------------------------


def test_a_completed_step_is_recorded() -> None:
    j = history(*completed(0, "fetch", {"page": 1}))
    assert j.step("fetch") == Recorded(position=0, result=raw({"page": 1}))


def test_a_failed_step_is_a_recorded_failure() -> None:
    j = history(
        StepStarted(position=0, name="fetch"),
        StepStarted(position=0, name="fetch", attempt=2),
        StepFailed(position=0, name="fetch", attempt=2, error=BOOM),
    )
    assert j.step("fetch") == RecordedFailure(position=0, error=BOOM, attempts=2)


@pytest.mark.parametrize("attempts", [1, 2, 5])
def test_a_started_step_is_executed_again_in_doubt(attempts: int) -> None:
    j = history(*[StepStarted(position=0, name="send", attempt=a) for a in range(1, attempts + 1)])
    assert j.replaying
    assert j.step("send") == Execute(position=0, attempt=attempts + 1, in_doubt=True)
    assert not j.replaying
    j.finish()


def test_beyond_history_everything_is_new() -> None:
    j = history(*completed(0, "fetch"))
    assert j.step("fetch") == Recorded(position=0, result=raw(None))
    assert j.step("send") == Execute(position=1, attempt=1, in_doubt=False)
    assert j.value("now") == Execute(position=2, attempt=1, in_doubt=False)
    assert j.step("send") == Execute(position=3, attempt=1, in_doubt=False)
    j.finish()


def test_an_empty_history_never_replays() -> None:
    j = Journal(fold([]))
    assert not j.replaying
    assert j.value("uuid") == Execute(position=0, attempt=1, in_doubt=False)
    j.finish()


def test_a_recorded_value_is_returned() -> None:
    j = history(ValueRecorded(position=0, kind="now", value=raw("2024-05-01T00:00:00Z")))
    assert j.value("now") == Recorded(position=0, result=raw("2024-05-01T00:00:00Z"))


def test_a_different_step_at_a_position_is_nondeterminism() -> None:
    j = history(*completed(0, "fetch"), *completed(1, "send"))
    j.step("fetch")
    with pytest.raises(NondeterminismError) as info:
        j.step("compose")
    e = info.value
    assert "step 'send'" in e.message  # what history recorded
    assert "step 'compose'" in e.message  # what the code calls now
    assert "operation 1" in e.message
    assert "r1" in e.message
    assert (e.run_id, e.seq) == ("r1", 1)
    assert str(e) == e.message


@pytest.mark.parametrize(
    ("recorded", "call", "was", "now"),
    [
        (completed(0, "fetch"), ("value", "now"), "step 'fetch'", "ctx.now()"),
        (
            [ValueRecorded(position=0, kind="now", value=raw(0))],
            ("step", "fetch"),
            "ctx.now()",
            "step 'fetch'",
        ),
        (
            [ValueRecorded(position=0, kind="now", value=raw(0))],
            ("value", "uuid"),
            "ctx.now()",
            "ctx.uuid()",
        ),
        # A step that happens to be named like a value kind is still a step.
        (
            [ValueRecorded(position=0, kind="now", value=raw(0))],
            ("step", "now"),
            "ctx.now()",
            "step 'now'",
        ),
        (completed(0, "now"), ("value", "now"), "step 'now'", "ctx.now()"),
    ],
)
def test_a_value_where_a_step_was_recorded_and_vice_versa(
    recorded: list[RunEvent], call: tuple[str, str], was: str, now: str
) -> None:
    j = history(*recorded)
    with pytest.raises(NondeterminismError) as info:
        j.step(call[1]) if call[0] == "step" else j.value(call[1])
    assert was in info.value.message
    assert now in info.value.message
    assert info.value.seq == 0


def test_an_in_doubt_step_renamed_is_nondeterminism() -> None:
    j = history(StepStarted(position=0, name="charge"))
    with pytest.raises(NondeterminismError, match="step 'charge'"):
        j.step("charge_v2")


def test_finish_raises_when_history_has_more_operations() -> None:
    j = history(*completed(0, "fetch"), ValueRecorded(position=1, kind="uuid", value=raw("u")))
    j.step("fetch")
    with pytest.raises(NondeterminismError) as info:
        j.finish()
    assert info.value.seq == 1
    assert "after 1 operations" in info.value.message
    assert "history records 2" in info.value.message
    assert "ctx.uuid() at 1" in info.value.message


def test_finish_passes_when_everything_was_replayed() -> None:
    j = history(*completed(0, "fetch"), ValueRecorded(position=1, kind="uuid", value=raw("u")))
    j.step("fetch")
    j.value("uuid")
    j.finish()


def test_replaying_flips_exactly_after_the_last_recorded_position() -> None:
    j = history(*completed(0, "a"), *completed(1, "b"), *completed(2, "c"))
    seen = []
    for name in ["a", "b", "c", "d", "e"]:
        seen.append(j.replaying)
        j.step(name)
    seen.append(j.replaying)
    assert seen == [True, True, True, False, False, False]


# --- the contract, generated ------------------------------------------------------------------

Op = tuple[Literal["step", "value"], str]
# "now" is both a step name and a value kind: a step named "now" must not match ctx.now().
ops = st.one_of(
    st.tuples(st.just("step"), st.sampled_from(["fetch", "send", "now"])),
    st.tuples(st.just("value"), st.sampled_from(["now", "uuid"])),
)


@dataclass(frozen=True)
class Recording:
    op: Op
    status: Literal["completed", "failed", "started", "recorded"]
    attempts: int


@st.composite
def recordings(draw: st.DrawFn) -> list[Recording]:
    """What history recorded, op by op; only the last step may be left started (in doubt)."""
    recorded = draw(st.lists(ops, max_size=6))
    out = []
    for i, op in enumerate(recorded):
        if op[0] == "value":
            out.append(Recording(op, "recorded", 0))
            continue
        last = i == len(recorded) - 1
        status = draw(st.sampled_from(["completed", "failed", *(["started"] if last else [])]))
        out.append(Recording(op, status, draw(st.integers(1, 3))))
    return out


def events_of(recorded: list[Recording]) -> list[RunEvent]:
    events: list[RunEvent] = [RunStarted(run_id="r9", agent="a", input=raw(None))]
    for p, rec in enumerate(recorded):
        kind, name = rec.op
        if kind == "value":
            events.append(ValueRecorded(position=p, kind=name, value=raw(p)))  # type: ignore[arg-type]
            continue
        for a in range(1, rec.attempts + 1):
            events.append(StepStarted(position=p, name=name, attempt=a))
        if rec.status == "completed":
            events.append(StepCompleted(position=p, name=name, attempt=rec.attempts, result=raw(p)))
        elif rec.status == "failed":
            events.append(StepFailed(position=p, name=name, attempt=rec.attempts, error=BOOM))
    return events


def call(j: Journal, op: Op) -> Recorded | RecordedFailure | Execute:
    return j.step(op[1]) if op[0] == "step" else j.value(op[1])


def describe(op: Op) -> str:
    return f"step '{op[1]}'" if op[0] == "step" else f"ctx.{op[1]}()"


@given(recordings(), st.lists(ops, max_size=8))
def test_the_journal_raises_iff_history_is_not_a_prefix_of_the_code(
    recorded: list[Recording], code: list[Op]
) -> None:
    """Let R be the recorded operations and C the ones the code makes, in order.

    * If R and C differ at some index < min(len(R), len(C)), the call at the first such index
      m raises, naming both operations and m; every earlier call returns normally.
    * Otherwise, if C is shorter than R, every call returns and ``finish()`` raises (seq =
      len(C)).
    * Otherwise (R is a prefix of C) nothing raises: call i < len(R) gets the recorded
      outcome, call i >= len(R) gets ``Execute(i, 1, in_doubt=False)``.

    So: the journal raises iff R is not a prefix of C.
    """
    j = Journal(fold(events_of(recorded)))
    r = [rec.op for rec in recorded]
    mismatch = next((i for i, (a, b) in enumerate(zip(r, code, strict=False)) if a != b), None)
    for i, op in enumerate(code):
        assert j.replaying == (i < len(r))
        if i == mismatch:
            with pytest.raises(NondeterminismError) as info:
                call(j, op)
            assert info.value.seq == i
            assert f"operation {i} was recorded as {describe(r[i])}" in info.value.message
            assert f"calls {describe(op)}" in info.value.message
            assert code[: len(r)] != r
            return
        plan = call(j, op)
        if i >= len(r):
            assert plan == Execute(position=i, attempt=1, in_doubt=False)
            continue
        rec = recorded[i]
        match rec.status:
            case "completed" | "recorded":
                assert plan == Recorded(position=i, result=raw(i))
            case "failed":
                assert plan == RecordedFailure(position=i, error=BOOM, attempts=rec.attempts)
            case "started":
                assert plan == Execute(position=i, attempt=rec.attempts + 1, in_doubt=True)
    assert mismatch is None
    assert j.replaying == (len(code) < len(r))
    if len(code) < len(r):
        with pytest.raises(NondeterminismError) as info:
            j.finish()
        assert info.value.seq == len(code)
    else:
        assert code[: len(r)] == r
        j.finish()


@given(valid_histories())
def test_the_code_that_wrote_a_valid_history_replays_it(
    history: tuple[list[RunEvent], Expected],
) -> None:
    events, exp = history
    j = Journal(fold(events))
    for p, op in enumerate(exp.ops):
        assert j.replaying
        if op.kind == "step":
            plan = j.step(op.name)
            if op.status == "completed":
                assert plan == Recorded(position=p, result=op.result)  # type: ignore[arg-type]
            elif op.status == "failed":
                assert plan == RecordedFailure(position=p, error=op.error, attempts=op.attempts)  # type: ignore[arg-type]
            else:
                assert plan == Execute(position=p, attempt=op.attempts + 1, in_doubt=True)
        else:
            assert j.value(op.kind) == Recorded(position=p, result=op.result)  # type: ignore[arg-type]
    assert not j.replaying
    j.finish()
    assert j.step("next") == Execute(position=len(exp.ops), attempt=1, in_doubt=False)
