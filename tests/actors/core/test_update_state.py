"""Updates in the fold (decision 0042): received once per id, decided once, with the answer or
the rejection kept; anything else is an anomaly, never an exception; ``fold`` equals
``evolve`` step by step."""

from __future__ import annotations

from functools import reduce

import msgspec

from sojourn.actors.core.state import RunState, evolve, fold
from sojourn.schemas.events import (
    ErrorInfo,
    RunCompleted,
    RunEvent,
    RunStarted,
    UpdateCompleted,
    UpdateRejected,
    UpdateRequested,
)

RAW = msgspec.Raw


def requested(uid: str, payload: bytes = b'"x"') -> UpdateRequested:
    return UpdateRequested(update_id=uid, name="add", payload=RAW(payload), sent_by="ada", at=1.0)


def both(events: list[RunEvent]) -> RunState:
    folded = fold(events)
    assert folded == reduce(evolve, events, RunState())
    return folded


def test_received_once_and_decided_once() -> None:
    events: list[RunEvent] = [
        RunStarted(run_id="r", agent="a", input=RAW(b"null"), at=0.0),
        requested("u1"),
        requested("u1", b'"again"'),  # the same id again: nothing changes
        requested("u2"),
        requested("u3"),
        UpdateCompleted(update_id="u1", name="add", position=1, answer=RAW(b"1"), at=2.0),
        UpdateRejected(update_id="u2", name="add", code="rejected", message="no", at=2.0),
        UpdateCompleted(
            update_id="u3",
            name="add",
            position=1,
            answer=RAW(b"null"),
            error=ErrorInfo(type="RuntimeError", message="broke"),
            at=2.0,
        ),
    ]
    s = both(events)
    assert [(u.update_id, u.outcome, u.position) for u in s.updates] == [
        ("u1", "completed", 1),
        ("u2", "rejected", None),
        ("u3", "completed", 1),
    ]
    u1, u2, u3 = s.updates
    assert bytes(u1.payload) == b'"x"' and u1.answer is not None and bytes(u1.answer) == b"1"
    assert (u2.code, u2.message) == ("rejected", "no")
    assert u3.error is not None and u3.error.message == "broke"
    assert s.anomalies == ()


def test_what_does_not_fit_is_an_anomaly() -> None:
    events: list[RunEvent] = [
        RunStarted(run_id="r", agent="a", input=RAW(b"null"), at=0.0),
        UpdateCompleted(update_id="never", name="add", position=0, answer=RAW(b"1"), at=1.0),
        requested("u1"),
        UpdateRejected(update_id="u1", name="add", code="rejected", at=2.0),
        UpdateCompleted(update_id="u1", name="add", position=0, answer=RAW(b"1"), at=3.0),
        RunCompleted(output=RAW(b"null"), at=4.0),
        requested("late"),
    ]
    s = both(events)
    assert len(s.anomalies) == 3
    assert [(u.update_id, u.outcome) for u in s.updates] == [("u1", "rejected")]
