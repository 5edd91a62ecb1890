"""The replay matcher: ``Journal(state)`` answers each operation the code makes, in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.core.journal import (
    Execute,
    Journal,
    OpenWait,
    Recorded,
    RecordedFailure,
    RecordedWait,
)
from sojourn.actors.core.state import OpRecord, fold
from sojourn.schemas.errors import NondeterminismError
from sojourn.schemas.events import (
    ChildStarted,
    ErrorInfo,
    RunEvent,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.vocabulary import WAIT_OUTCOMES, ValueKind, WaitOutcome
from tests.strategies import Expected, valid_histories

BOOM = ErrorInfo(type="ValueError", message="boom")
NULL = msgspec.Raw(b"null")


def raw(v: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(v))


def history(*events: RunEvent) -> Journal:
    return Journal(fold([RunStarted(run_id="r1", agent="a", input=raw(None)), *events]))


def completed(p: int, name: str, result: object = None, attempt: int = 1) -> list[RunEvent]:
    return [
        StepStarted(position=p, name=name, attempt=attempt),
        StepCompleted(position=p, name=name, attempt=attempt, result=raw(result)),
    ]


def slept(p: int, key: str = "sleep", *, parked: bool = True) -> list[RunEvent]:
    """A wait at ``p`` that timed out (after parking, or at once: its deadline had passed)."""
    done = WaitCompleted(position=p, key=key, outcome="timeout", payload=NULL)
    if not parked:
        return [done]
    return [WaitStarted(position=p, key=key, deadline=100.0), done]


def child(p: int, agent: str, run_id: str = "r1") -> ChildStarted:
    return ChildStarted(position=p, child_run_id=f"{run_id}-c{p}", agent=agent)


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
    # every attempt so far was cut off mid-step: the plan says how many in a row
    assert j.step("send") == Execute(
        position=0, attempt=attempts + 1, in_doubt=True, interrupted=attempts
    )
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
    recorded: list[RunEvent], call: tuple[str, ValueKind], was: str, now: str
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


# --- waits and children, by example -----------------------------------------------------------


def test_a_new_wait_is_open_and_unrecorded() -> None:
    j = history(*completed(0, "fetch"))
    j.step("fetch")
    assert j.wait("signal:approve") == OpenWait(position=1, recorded=None)
    assert j.wait("sleep") == OpenWait(position=2, recorded=None)
    assert not j.replaying
    j.finish()


def test_a_parked_wait_is_open_with_what_was_recorded() -> None:
    j = history(
        *completed(0, "fetch"),
        WaitStarted(
            position=1,
            key="select:approve|reject",
            signals=("approve", "reject"),
            deadline=1234.5,
        ),
        SignalReceived(name="other", payload=raw(1), signal_id="s1"),
    )
    j.step("fetch")
    assert j.replaying
    assert j.wait("select:approve|reject") == OpenWait(
        position=1,
        recorded=OpRecord(
            position=1,
            kind="wait",
            name="select:approve|reject",
            status="waiting",
            signals=("approve", "reject"),
            deadline=1234.5,
        ),
    )
    assert not j.replaying
    j.finish()


@pytest.mark.parametrize("parked", [True, False], ids=["parked", "at-once"])
@pytest.mark.parametrize(
    ("completion", "expected_signal"),
    [
        (
            WaitCompleted(
                position=0,
                key="k",
                outcome="signal",
                payload=raw({"by": "hr"}),
                signal="approve",
                signal_id="s1",
            ),
            "approve",
        ),
        (WaitCompleted(position=0, key="k", outcome="timeout", payload=NULL), None),
        # A child outcome carries no signal name: live (``resolve_child_wait``) returns
        # ``signal=None``, so replay must too.
        (
            WaitCompleted(
                position=0,
                key="k",
                outcome="child",
                payload=raw({"status": "failed"}),
                child_status="failed",
            ),
            None,
        ),
    ],
    ids=lambda v: v.outcome if isinstance(v, WaitCompleted) else None,
)
def test_a_completed_wait_returns_how_it_ended(
    completion: WaitCompleted, expected_signal: str | None, parked: bool
) -> None:
    events: list[RunEvent] = [
        SignalReceived(name="approve", payload=raw({"by": "hr"}), signal_id="s1")
    ]
    if parked:
        events.append(WaitStarted(position=0, key="k", signals=("approve",), deadline=9.0))
    j = history(*events, completion)
    assert j.wait("k") == RecordedWait(
        position=0,
        outcome=completion.outcome,
        payload=completion.payload,
        signal=expected_signal,
    )
    assert j.step("next") == Execute(position=1, attempt=1, in_doubt=False)
    j.finish()


def test_a_started_child_is_recorded_with_its_run_id() -> None:
    j = history(child(0, "it-provision"), *slept(1, "child:r1-c0"))
    assert j.child("it-provision") == Recorded(position=0, result=raw("r1-c0"))
    assert j.wait("child:r1-c0") == RecordedWait(
        position=1, outcome="timeout", payload=NULL, signal=None
    )
    assert j.child("it-provision") == Execute(position=2, attempt=1, in_doubt=False)
    j.finish()


@pytest.mark.parametrize(
    ("recorded", "call", "was", "now"),
    [
        # a wait under another key, parked or completed
        (
            [WaitStarted(position=0, key="sleep", deadline=1.0)],
            ("wait", "signal:approve"),
            "a wait on sleep",
            "a wait on signal:approve",
        ),
        (slept(0, "signal:a"), ("wait", "signal:b"), "a wait on signal:a", "a wait on signal:b"),
        (slept(0, parked=False), ("wait", "select:a|b"), "a wait on sleep", "a wait on select:a|b"),
        # a wait where something else was recorded, and vice versa
        (completed(0, "sleep"), ("wait", "sleep"), "step 'sleep'", "a wait on sleep"),
        (slept(0), ("step", "sleep"), "a wait on sleep", "step 'sleep'"),
        (
            [ValueRecorded(position=0, kind="now", value=raw(0))],
            ("wait", "now"),
            "ctx.now()",
            "a wait on now",
        ),
        (slept(0, "now"), ("value", "now"), "a wait on now", "ctx.now()"),
        (
            [child(0, "mailer")],
            ("wait", "child:r1-c0"),
            "a child run of 'mailer'",
            "a wait on child:r1-c0",
        ),
        (
            slept(0, "child:r1-c0"),
            ("child", "mailer"),
            "a wait on child:r1-c0",
            "a child run of 'mailer'",
        ),
        # a child of another agent, and children where other operations were recorded
        (
            [child(0, "mailer")],
            ("child", "it-provision"),
            "a child run of 'mailer'",
            "a child run of 'it-provision'",
        ),
        ([child(0, "mailer")], ("step", "mailer"), "a child run of 'mailer'", "step 'mailer'"),
        (completed(0, "mailer"), ("child", "mailer"), "step 'mailer'", "a child run of 'mailer'"),
        (
            [StepStarted(position=0, name="mailer")],
            ("child", "mailer"),
            "step 'mailer'",
            "a child run of 'mailer'",
        ),
        (
            [ValueRecorded(position=0, kind="uuid", value=raw(0))],
            ("child", "uuid"),
            "ctx.uuid()",
            "a child run of 'uuid'",
        ),
        ([child(0, "now")], ("value", "now"), "a child run of 'now'", "ctx.now()"),
    ],
)
def test_a_wait_or_child_mismatch_is_nondeterminism_naming_both(
    recorded: list[RunEvent], call: tuple[str, ValueKind], was: str, now: str
) -> None:
    j = history(*recorded)
    with pytest.raises(NondeterminismError) as info:
        perform(j, call)  # type: ignore[arg-type]
    e = info.value
    assert f"run r1: operation 0 was recorded as {was} but the code now calls {now};" in e.message
    assert (e.run_id, e.seq, e.step) == ("r1", 0, now)
    assert j.position == 1  # the position was taken: the run parks, nothing more is matched


def test_finish_names_a_pending_wait_or_child() -> None:
    j = history(*slept(0, "signal:approve"), child(1, "mailer"))
    with pytest.raises(NondeterminismError, match=r"\(next: a wait on signal:approve at 0\)"):
        j.finish()
    j.wait("signal:approve")
    with pytest.raises(NondeterminismError, match=r"\(next: a child run of 'mailer' at 1\)"):
        j.finish()
    j.child("mailer")
    j.finish()


# --- the contract, generated ------------------------------------------------------------------

Kind = Literal["step", "value", "wait", "child"]
Op = tuple[Kind, str]


def ops_of(kind: Kind, names: list[str]) -> st.SearchStrategy[Op]:
    return st.tuples(st.just(kind), st.sampled_from(names))


# Names shared across kinds on purpose ("now" is a step name, a value kind, a wait key and a
# child agent; "sleep" a step and a wait; "fetch" a step and an agent): only kind *and* name
# match.
ops = st.one_of(
    ops_of("step", ["fetch", "send", "now", "sleep"]),
    ops_of("value", ["now", "uuid"]),
    ops_of("wait", ["sleep", "signal:approve", "now"]),
    ops_of("child", ["mailer", "fetch", "now"]),
)
Status = Literal["completed", "failed", "started", "recorded", "waiting"]
ALL_OPS: list[Op] = [
    *((k, n) for k in ("step", "value", "wait", "child") for n in ("fetch", "now", "sleep")),
    ("step", "send"),
    ("value", "uuid"),
    ("wait", "signal:approve"),
    ("child", "mailer"),
]


@dataclass(frozen=True)
class Recording:
    op: Op
    status: Status
    attempts: int = 0
    outcome: WaitOutcome | None = None  # a completed wait: signal, timeout or child
    parked: bool = False  # a completed wait: WaitStarted was recorded before its completion


@st.composite
def recordings(draw: st.DrawFn) -> list[Recording]:
    """What history recorded, op by op; only the last step may be left started (in doubt) and
    only the last wait may still be waiting (the code is sequential)."""
    recorded = draw(st.lists(ops, max_size=6))
    out = []
    for i, op in enumerate(recorded):
        last = i == len(recorded) - 1
        match op[0]:
            case "value":
                out.append(Recording(op, "recorded"))
            case "child":
                out.append(Recording(op, "completed"))
            case "wait":
                waits: list[Status] = ["completed", "waiting"] if last else ["completed"]
                status = draw(st.sampled_from(waits))
                out.append(
                    Recording(
                        op,
                        status,
                        outcome=draw(st.sampled_from(WAIT_OUTCOMES)),
                        parked=draw(st.booleans()),
                    )
                )
            case _:
                steps: list[Status] = (
                    ["completed", "failed", "started"] if last else ["completed", "failed"]
                )
                status = draw(st.sampled_from(steps))
                out.append(Recording(op, status, draw(st.integers(1, 3))))
    return out


def wait_payload(p: int, outcome: str | None) -> msgspec.Raw:
    return NULL if outcome == "timeout" else raw(p)


def waiting_record(p: int, key: str) -> OpRecord:
    return OpRecord(
        position=p,
        kind="wait",
        name=key,
        status="waiting",
        signals=("approve",),
        deadline=float(p),
        children=("c",),
    )


def events_of(recorded: list[Recording]) -> list[RunEvent]:
    events: list[RunEvent] = [RunStarted(run_id="r9", agent="a", input=raw(None))]
    for p, rec in enumerate(recorded):
        kind, name = rec.op
        if kind == "value":
            events.append(ValueRecorded(position=p, kind=name, value=raw(p)))
            continue
        if kind == "child":
            events.append(ChildStarted(position=p, child_run_id=f"r9-c{p}", agent=name))
            continue
        if kind == "wait":
            if rec.status == "waiting" or rec.parked:
                w = waiting_record(p, name)
                events.append(
                    WaitStarted(
                        position=p,
                        key=name,
                        signals=w.signals,
                        deadline=w.deadline,
                        children=w.children,
                    )
                )
            if rec.status == "waiting":
                continue
            payload = wait_payload(p, rec.outcome)
            if rec.outcome == "signal":
                events.append(SignalReceived(name="approve", payload=payload, signal_id=f"s{p}"))
                done = WaitCompleted(
                    position=p,
                    key=name,
                    outcome="signal",
                    payload=payload,
                    signal="approve",
                    signal_id=f"s{p}",
                )
            elif rec.outcome == "timeout":
                done = WaitCompleted(position=p, key=name, outcome="timeout", payload=payload)
            else:
                done = WaitCompleted(
                    position=p, key=name, outcome="child", payload=payload, child_status="failed"
                )
            events.append(done)
            continue
        for a in range(1, rec.attempts + 1):
            events.append(StepStarted(position=p, name=name, attempt=a))
        if rec.status == "completed":
            events.append(StepCompleted(position=p, name=name, attempt=rec.attempts, result=raw(p)))
        elif rec.status == "failed":
            events.append(StepFailed(position=p, name=name, attempt=rec.attempts, error=BOOM))
    return events


@st.composite
def histories_and_code(draw: st.DrawFn) -> tuple[list[Recording], list[Op]]:
    """What history recorded, and the operations the code now makes: unrelated, the recorded
    ones then more, or the recorded ones with one changed to a look-alike (the same kind under
    another name, or the same name as another kind), which is where a matcher slips."""
    recorded = draw(recordings())
    r = [rec.op for rec in recorded]
    how = draw(st.sampled_from(["free", "extends", "diverges", "diverges"]))
    if how == "free" or not r:
        return recorded, draw(st.lists(ops, max_size=8))
    if how == "extends":
        k = draw(st.integers(0, len(r)))
        return recorded, [*r[:k], *draw(st.lists(ops, max_size=3))]
    k = draw(st.integers(0, len(r) - 1))
    kind, name = r[k]
    alike = [o for o in ALL_OPS if (o[0] == kind) != (o[1] == name)]
    return recorded, [*r[:k], draw(st.sampled_from(alike)), *draw(st.lists(ops, max_size=2))]


Plan = Recorded | RecordedFailure | Execute | RecordedWait | OpenWait


def perform(j: Journal, op: Op) -> Plan:
    match op[0]:
        case "step":
            return j.step(op[1])
        case "value":
            # Also by names no value kind has (``fetch``, ``sleep``): the journal refuses them.
            return j.value(op[1])  # type: ignore[arg-type]
        case "wait":
            return j.wait(op[1])
    return j.child(op[1])


def describe(op: Op) -> str:
    match op[0]:
        case "step":
            return f"step '{op[1]}'"
        case "value":
            return f"ctx.{op[1]}()"
        case "wait":
            return f"a wait on {op[1]}"
    return f"a child run of '{op[1]}'"


def expected_plan(i: int, rec: Recording) -> Plan:
    """What call ``i`` gets when history recorded ``rec`` there and the code matches it."""
    kind, name = rec.op
    match rec.status:
        case "recorded":
            return Recorded(position=i, result=raw(i))
        case "completed" if kind == "child":
            return Recorded(position=i, result=raw(f"r9-c{i}"))
        case "completed" if kind == "wait":
            assert rec.outcome is not None
            return RecordedWait(
                position=i,
                outcome=rec.outcome,
                payload=wait_payload(i, rec.outcome),
                signal="approve" if rec.outcome == "signal" else None,
            )
        case "completed":
            return Recorded(position=i, result=raw(i))
        case "failed":
            return RecordedFailure(position=i, error=BOOM, attempts=rec.attempts)
        case "waiting":
            return OpenWait(position=i, recorded=waiting_record(i, name))
    # the recorded attempts were all started back to back: every one was cut off mid-step
    return Execute(position=i, attempt=rec.attempts + 1, in_doubt=True, interrupted=rec.attempts)


def new_plan(i: int, op: Op) -> Plan:
    """What call ``i`` gets beyond history."""
    if op[0] == "wait":
        return OpenWait(position=i, recorded=None)
    return Execute(position=i, attempt=1, in_doubt=False)


STATUSES: dict[Kind, tuple[Status, ...]] = {
    "step": ("completed", "failed", "started"),
    "value": ("recorded",),
    "wait": ("completed", "waiting"),
    "child": ("completed",),
}


def test_every_other_operation_at_a_recorded_position_is_a_mismatch() -> None:
    """Exhaustively: each op of ``ALL_OPS`` recorded (in each status it can have) and each op
    called. The same kind and name replay; any other pair raises, naming both."""
    for recorded in ALL_OPS:
        for status in STATUSES[recorded[0]]:
            rec = Recording(recorded, status, attempts=1, outcome="signal")
            state = fold(events_of([rec]))
            for called in ALL_OPS:
                j = Journal(state)
                if called == recorded:
                    assert perform(j, called) == expected_plan(0, rec)
                    j.finish()
                    continue
                with pytest.raises(NondeterminismError) as info:
                    perform(j, called)
                assert info.value.seq == 0
                assert (
                    f"operation 0 was recorded as {describe(recorded)} but the code now calls "
                    f"{describe(called)};"
                ) in info.value.message, (recorded, status, called)


@given(histories_and_code())
def test_the_journal_raises_iff_history_is_not_a_prefix_of_the_code(
    scenario: tuple[list[Recording], list[Op]],
) -> None:
    """Let R be the recorded operations and C the ones the code makes, in order.

    * If R and C differ at some index < min(len(R), len(C)), the call at the first such index
      m raises, naming both operations and m; every earlier call returns normally.
    * Otherwise, if C is shorter than R, every call returns and ``finish()`` raises (seq =
      len(C)).
    * Otherwise (R is a prefix of C) nothing raises: call i < len(R) gets the recorded
      outcome, call i >= len(R) gets new work (``Execute(i, 1, in_doubt=False)``, or
      ``OpenWait(i, None)`` for a wait).

    So: the journal raises iff R is not a prefix of C.
    """
    recorded, code = scenario
    state = fold(events_of(recorded))
    assert state.anomalies == ()
    j = Journal(state)
    r = [rec.op for rec in recorded]
    mismatch = next((i for i, (a, b) in enumerate(zip(r, code, strict=False)) if a != b), None)
    for i, op in enumerate(code):
        assert j.replaying == (i < len(r))
        if i == mismatch:
            with pytest.raises(NondeterminismError) as info:
                perform(j, op)
            assert info.value.seq == i
            assert f"operation {i} was recorded as {describe(r[i])}" in info.value.message
            assert f"calls {describe(op)}" in info.value.message
            assert code[: len(r)] != r
            return
        plan = perform(j, op)
        if i >= len(r):
            assert plan == new_plan(i, op)
        else:
            assert plan == expected_plan(i, recorded[i])
    assert mismatch is None
    assert j.replaying == (len(code) < len(r))
    if len(code) < len(r):
        with pytest.raises(NondeterminismError) as info:
            j.finish()
        assert info.value.seq == len(code)
        assert f"(next: {describe(r[len(code)])} at {len(code)})" in info.value.message
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
            plan: Plan = j.step(op.name)
            if op.status == "completed":
                assert plan == Recorded(position=p, result=op.result)  # type: ignore[arg-type]
            elif op.status == "failed":
                assert plan == RecordedFailure(position=p, error=op.error, attempts=op.attempts)  # type: ignore[arg-type]
            else:
                assert plan == Execute(
                    position=p,
                    attempt=op.attempts + 1,
                    in_doubt=True,
                    interrupted=op.interrupted + 1,
                )
        elif op.kind == "wait":
            plan = j.wait(op.name)
            if op.status == "waiting":
                assert plan == OpenWait(position=p, recorded=op)
            else:
                assert isinstance(plan, RecordedWait)
                assert (plan.position, plan.outcome, plan.payload) == (p, op.outcome, op.result)
                assert plan.signal == (op.detail if op.outcome == "signal" else None)
        elif op.kind == "child":
            plan = j.child(op.name)
            child_run_id = f"{exp.run_id}-c{p}"  # deterministic: replay starts it once
            assert child_run_id in exp.children
            assert plan == Recorded(position=p, result=raw(child_run_id))
        else:
            assert j.value(op.kind) == Recorded(position=p, result=op.result)  # type: ignore[arg-type]
    assert not j.replaying
    j.finish()
    assert j.step("next") == Execute(position=len(exp.ops), attempt=1, in_doubt=False)


def test_a_value_of_a_kind_this_version_does_not_know_replays_by_its_text() -> None:
    # ``OpRecord.kind`` is ``other`` for it; ``name`` keeps the text, which replay matches and
    # names, as it did when the kind was stored as it came.
    later = ValueRecorded(position=0, kind="moon_phase", value=raw("full"))
    newer = history(later).value("moon_phase")  # type: ignore[arg-type]  # the newer code's call
    assert newer == Recorded(position=0, result=raw("full"))
    with pytest.raises(NondeterminismError, match=r"ctx\.moon_phase\(\)"):
        history(later).value("now")
    step = StepStarted(position=0, name="now")
    with pytest.raises(NondeterminismError):
        history(step).value("now")  # a step named like a value kind is not that value
