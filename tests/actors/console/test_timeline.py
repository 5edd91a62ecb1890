"""A run's timeline (pure): attempts with their outcomes, a restart after a lost worker, waits
ended by an authenticated sender, spend per budget kind, no callback token, bounded."""

from __future__ import annotations

import msgspec

from sojourn.actors.console.timeline import ITEMS_MAX, timeline_of
from sojourn.broker.eventstore import Decision
from sojourn.schemas import events as ev
from sojourn.schemas.codec import encode
from sojourn.schemas.fairness import Fairness

T0 = 1_700_000_000.0
RAW = msgspec.Raw(b"null")
TOKEN = msgspec.Raw(encode("sjc1.k1.secret.mac"))


def decision(seq: int, writer: str, *events: ev.RunEvent) -> Decision:
    return Decision(seq=seq, events=tuple(events), writer=writer, msg_id=f"m{seq}")


def started(**kw: object) -> ev.RunStarted:
    return ev.RunStarted(
        run_id="r1",
        agent="refunds",
        input=RAW,
        at=T0,
        trigger=ev.TriggerInfo(sent_by="ada"),
        **kw,  # type: ignore[arg-type]
    )


def test_a_restart_after_a_lost_worker_is_an_in_doubt_attempt_then_the_next() -> None:
    usage = ev.Usage(input_tokens=10, output_tokens=20, usd=0.5, requests=1, model="m")
    history = [
        decision(1, "w1.1", started(budget=ev.Budget(usd=2.0, steps=10))),
        decision(2, "w1.1", ev.StepStarted(position=0, name="fetch", at=T0 + 1)),
        # w1 was SIGKILLed mid-step; w2 runs it again.
        decision(3, "w2.1", ev.StepStarted(position=0, name="fetch", attempt=2, at=T0 + 5)),
        decision(
            4,
            "w2.1",
            ev.StepFailed(
                position=0,
                name="fetch",
                attempt=2,
                at=T0 + 6,
                duration=1.0,
                error=ev.ErrorInfo(type="Boom", message="x" * 10_000),
                retry_at=T0 + 8,
            ),
        ),
        decision(5, "w2.2", ev.StepStarted(position=0, name="fetch", attempt=3, at=T0 + 8)),
        decision(
            6,
            "w2.2",
            ev.StepCompleted(position=0, name="fetch", attempt=3, result=RAW, duration=0.5,
                             at=T0 + 8.5),
            ev.StepStarted(position=1, name="llm:m", kind="llm", at=T0 + 8.5),
        ),
        decision(
            7,
            "w2.2",
            ev.StepCompleted(position=1, name="llm:m", result=RAW, duration=2, usage=usage,
                             at=T0 + 10.5),
        ),
    ]  # fmt: skip
    t = timeline_of("r1", history, T0 + 20)
    steps = [i for i in t.items if i.kind == "step"]
    assert [s.name for s in steps] == ["fetch", "llm:m"]
    fetch = steps[0]
    assert [a.outcome for a in fetch.attempts] == ["in_doubt", "failed", "completed"]
    assert [a.writer for a in fetch.attempts] == ["w1.1", "w2.1", "w2.2"]
    failed = fetch.attempts[1]
    assert failed.error is not None and failed.error.type == "Boom"
    assert len(failed.error.message) <= 4096 and failed.retry_at == T0 + 8
    assert fetch.attempts[2].duration == 0.5 and fetch.end == T0 + 8.5
    assert steps[1].step_kind == "llm" and steps[1].usage == usage
    spend = {s.limit: s for s in t.spend}
    assert spend["usd"].used == 0.5 and spend["usd"].granted == 2.0
    assert spend["steps"].used == 4 and spend["steps"].granted == 10
    assert spend["tool_calls"].used == 3 and spend["input_tokens"].used == 10
    assert spend["tokens"].granted is None
    assert spend["wall_seconds"].used == 20  # not ended: up to now
    assert t.model_calls == 1 and t.last_seq == 7 and t.decisions == 7


def test_waits_signals_and_the_end() -> None:
    history = [
        decision(1, "w1.1", started()),
        decision(
            2,
            "w1.1",
            ev.WaitStarted(
                position=0, key="signal:approval.refund", signals=("approval.refund",),
                deadline=T0 + 3600, at=T0 + 1,
            ),
        ),
        decision(
            3,
            "intake:w1",
            ev.SignalReceived(name="approval.refund", payload=RAW, signal_id="s1",
                              sent_by="ada", sender_verified=True, at=T0 + 86_400),
        ),
        decision(
            4,
            "w1.2",
            ev.WaitCompleted(position=0, key="signal:approval.refund", outcome="signal",
                             payload=RAW, signal="approval.refund", signal_id="s1",
                             sent_by="ada", sender_verified=True, at=T0 + 86_400.1),
            ev.ValueRecorded(position=1, kind="callback", value=TOKEN, at=T0 + 86_400.1),
            ev.RunCompleted(output=RAW, at=T0 + 86_400.2),
        ),
    ]  # fmt: skip
    t = timeline_of("r1", history, T0 + 10**6)
    assert [i.kind for i in t.items] == ["start", "wait", "signal", "end"]
    start, wait, signal, end = t.items
    assert start.by == "ada"
    assert wait.deadline == T0 + 3600 and wait.end == T0 + 86_400.1
    assert wait.outcome == "signal" and wait.sent_by == "ada" and wait.sender_verified
    assert signal.sent_by == "ada" and signal.sender_verified
    assert end.status == "completed" and t.status == "completed"
    assert t.ended_at == T0 + 86_400.2
    spend = {s.limit: s for s in t.spend}
    assert round(spend["wall_seconds"].used, 1) == 86_400.2  # ended: up to the end
    assert b"secret" not in encode(t)  # a callback token is a credential


def test_suspensions_resumes_budgets_and_cancels() -> None:
    history = [
        decision(1, "w1.1", started()),
        decision(2, "w1.1", ev.RunSuspended(reason="budget", detail="usd used up", limit="usd",
                                            at=T0 + 1)),
        decision(3, "ops", ev.BudgetChanged(budget=ev.Budget(usd=9.0), by="ada", at=T0 + 2),
                 ev.RunResumed(by="ada", note="more", at=T0 + 2)),
        decision(4, "ops", ev.RunSuspended(reason="something-new", detail="?", at=T0 + 3)),
        decision(5, "ops", ev.CancelRequested(by="bob", reason="stop", terminate=True,
                                              at=T0 + 4)),
    ]  # fmt: skip
    t = timeline_of("r1", history, T0 + 5)
    kinds = [i.kind for i in t.items]
    assert kinds == ["start", "suspended", "budget", "resumed", "suspended", "cancel"]
    assert t.items[1].reason == "budget" and t.items[1].limit == "usd"
    assert t.items[2].detail == "usd 9" and t.items[2].by == "ada"
    assert t.items[4].reason == "other"  # a reason this version does not know
    assert t.items[5].terminate and t.items[5].by == "bob"
    assert t.cancel_requested


def test_a_long_run_keeps_the_latest_items() -> None:
    events: list[ev.RunEvent] = []
    for p in range(ITEMS_MAX + 10):
        events += [
            ev.StepStarted(position=p, name=f"s{p}", at=T0 + p),
            ev.StepCompleted(position=p, name=f"s{p}", result=RAW, at=T0 + p + 0.5),
        ]
    t = timeline_of("r1", [decision(1, "w.1", started(), *events)], T0 + 10**5)
    assert len(t.items) == ITEMS_MAX and t.omitted == 11  # the start and ten steps
    assert t.items[-1].name == f"s{ITEMS_MAX + 9}"
    assert timeline_of("r1", [], T0).status == "pending"


def test_how_the_run_was_started_priority_fairness_fork_and_attributes() -> None:
    fair = Fairness(key="tenant:acme", weight=3)
    fork = ev.ForkOrigin(run_id="r0", position=2, copied=4)
    first = started(priority=2, fairness=fair, forked_from=fork, attributes={"customer": 42})
    upsert = ev.ValueRecorded(
        position=0, kind="attributes", value=msgspec.Raw(encode({"tier": "gold"})), at=T0 + 1
    )
    t = timeline_of("r1", [decision(1, "w1.1", first), decision(2, "w1.1", upsert)], T0 + 2)
    assert (t.priority, t.fairness, t.forked_from) == (2, fair, fork)
    assert t.attributes == {"customer": 42, "tier": "gold"}
    wire = msgspec.json.decode(msgspec.json.encode(t))
    assert wire["priority"] == 2 and wire["fairness"] == {"key": "tenant:acme", "weight": 3}
    assert wire["forked_from"]["run_id"] == "r0" and wire["attributes"]["tier"] == "gold"
    plain = timeline_of("r1", [decision(1, "w1.1", started())], T0 + 1)
    assert (plain.priority, plain.fairness, plain.forked_from, plain.attributes) == (
        3,
        None,
        None,
        {},
    )
