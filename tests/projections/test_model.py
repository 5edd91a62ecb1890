"""The run model's bookkeeping, fed stream messages directly (no broker needed)."""

from __future__ import annotations

from sojourn.broker import headers as h
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.names import Names
from sojourn.projections.model import RunModel, gauge_families
from sojourn.schemas.codec import encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    CancelRequested,
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    WaitStarted,
)

NAMES = Names("t")
NOW = 2_000_000.0


class _Seq:
    n = 0


def msg(run_id: str, events: list[RunEvent] | bytes) -> StoredMessage:
    _Seq.n += 1
    data = events if isinstance(events, bytes) else encode_events(events)
    subject = NAMES.events(run_id)
    headers = {h.SUBJECT: subject, h.SEQUENCE: str(_Seq.n)}
    return StoredMessage(subject=subject, seq=_Seq.n, data=data, headers=headers)


def model() -> RunModel:
    m = RunModel(None, NAMES, Settings(prefix="t"))  # type: ignore[arg-type]
    m.caught_up = True
    return m


def start(run_id: str, agent: str = "a") -> list[RunEvent]:
    return [RunStarted(run_id=run_id, agent=agent, input=to_raw(None), at=NOW - 10)]


def test_ended_runs_are_dropped_and_late_events_do_not_bring_them_back() -> None:
    m = model()
    m._on_decision(msg("r1", start("r1")))
    m._on_decision(msg("r1", [StepStarted(position=0, name="s", attempt=1, at=NOW - 9)]))
    m._on_decision(msg("r1", [WaitStarted(position=1, key="sleep", deadline=NOW + 99, at=NOW)]))
    assert m.assess(NOW)["r1"].state == "waiting"
    done: list[RunEvent] = [
        StepCompleted(position=0, name="s", attempt=1, result=to_raw(1), at=NOW),
        RunCompleted(output=to_raw(1), at=NOW),
    ]
    m._on_decision(msg("r1", done))
    assert "r1" not in m.runs and m.ended == 1
    m._on_decision(msg("r1", [CancelRequested(reason="late", at=NOW)]))
    assert "r1" not in m.runs and m.assess(NOW) == {}
    assert m.tool_calls["a"].minutes  # the step was counted as a tool call
    assert m.history["a"].runs == 1


def test_an_undecodable_message_wedges_its_run_for_good() -> None:
    m = model()
    m._on_decision(msg("r2", start("r2")))
    m._on_decision(msg("r2", b'[{"type":"from.the.future.v9"}]'))
    liv = m.assess(NOW)["r2"]
    assert liv.state == "wedged" and (liv.reason or "").startswith("poison: event message")


def test_gauges_count_runs_by_agent_and_liveness_with_zeros() -> None:
    m = model()
    for i in range(3):
        m._on_decision(msg(f"w{i}", start(f"w{i}", "waiter")))
        m._on_decision(
            msg(f"w{i}", [WaitStarted(position=0, key="sleep", deadline=NOW + 99, at=NOW)])
        )
    m._on_decision(msg("o1", start("o1", "orphan")))  # work, no owner, 10 s ago
    m.assess(NOW + 60)
    fams = {f.name: f for f in gauge_families(m)}
    runs = {
        (s.labels["agent"], s.labels["liveness"]): s.value for s in fams["sojourn_runs"].samples
    }
    assert runs[("waiter", "waiting")] == 3 and runs[("waiter", "stalled")] == 0
    assert runs[("orphan", "orphaned")] == 1
    assert fams["sojourn_pending_timers"].samples[0].value == 3
    assert all("run" not in s.labels for f in fams.values() for s in f.samples)
