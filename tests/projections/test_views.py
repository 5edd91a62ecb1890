"""Run views are a function of the history prefix: a projector that loses its fold (a restart,
a take-over that folds again) and rebuilds it from the start makes exactly the views a single
pass makes. Fed stream messages directly (no broker needed)."""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.broker import headers as h
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.names import Names
from sojourn.projections.model import RunModel
from sojourn.projections.projector import Projector
from sojourn.projections.sink import Applied
from sojourn.projections.summary import summarize_all
from sojourn.projections.views import pending_view, view_of
from sojourn.schemas.codec import encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunEvent, RunStarted, StepStarted
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.views import RunView
from tests.strategies import any_histories, valid_histories

NAMES = Names("t")


def _messages(events: list[RunEvent], data: st.DataObject) -> list[StoredMessage]:
    """The history cut into decisions (a few events each), as the events stream stores them."""
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(events))), max_size=10))))
    bounds = [0, *[c for c in cuts if c < len(events)], len(events)]
    run_id = next((e.run_id for e in events if isinstance(e, RunStarted)), "r")
    subject = NAMES.events(run_id)
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        body = encode_events(events[a:b])
        seq = 3 * i + 1  # other runs' decisions in between
        headers = {h.SUBJECT: subject, h.SEQUENCE: str(seq)}
        out.append(StoredMessage(subject=subject, seq=seq, data=body, headers=headers))
    return out


def _projector() -> Projector:
    """A projector's fold with no broker: its decision hook, fed by hand."""
    p = Projector(settings=Settings(prefix="t"))
    p.model = RunModel(None, NAMES, p.settings)  # type: ignore[arg-type]
    p.model.on_decision = p._on_decision
    return p


def _views(p: Projector) -> list[Applied]:
    out, p._applied = p._applied, []
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(any_histories, valid_histories().map(lambda he: he[0])), st.data())
def test_a_fold_thrown_away_and_rebuilt_from_the_prefix_makes_the_same_views(
    events: list[RunEvent], data: st.DataObject
) -> None:
    msgs = _messages(events, data)
    single = _projector()
    for m in msgs:
        single.model._on_decision(m)
    want = _views(single)

    p = _projector()
    got: list[Applied] = []
    for i, m in enumerate(msgs):
        if data.draw(st.booleans(), label=f"restart before {i}"):
            p = _projector()  # lost: fold the prefix again, views made meanwhile not kept
            for earlier in msgs[:i]:
                p.model._on_decision(earlier)
            _views(p)
        p.model._on_decision(m)
        got.extend(_views(p))
    assert got == want
    assert [a.seq for a in got] == sorted({a.seq for a in got})  # one view per decision


@settings(max_examples=300, deadline=None, derandomize=True)
@given(valid_histories(), st.data())
def test_each_view_is_the_view_of_the_summary_of_its_prefix(
    history: tuple[list[RunEvent], object], data: st.DataObject
) -> None:
    events, _ = history
    msgs = _messages(events, data)
    p = _projector()
    for m in msgs:
        p.model._on_decision(m)
    views = _views(p)
    assert len(views) == len(msgs)  # a valid history's every decision is applied
    decisions = [(m.seq, len(m.data), list(a.events)) for m, a in zip(msgs, views, strict=True)]
    for k, a in enumerate(views):
        assert a.view == view_of(summarize_all(decisions[: k + 1]), None)
    final = views[-1].view
    assert final == view_of(summarize_all(decisions), None)
    assert final.last_seq == msgs[-1].seq
    assert final.liveness == (
        "ended" if final.status in ("completed", "failed", "cancelled") else None
    )


def test_a_view_names_what_a_dashboard_shows() -> None:
    start = RunStarted(
        run_id="r", agent="a", input=to_raw(None), budget_tokens=100, parent_run_id="p", at=5.0
    )
    step = StepStarted(position=0, name="fetch", attempt=1, at=6.0)
    s = summarize_all([(4, 10, [start]), (9, 10, [step])])
    v = view_of(s, "running")
    assert (v.run_id, v.agent, v.parent_run_id, v.status, v.liveness) == (
        "r",
        "a",
        "p",
        "running",
        "running",
    )
    assert (v.step, v.step_position, v.step_attempt, v.attempts, v.budget_tokens) == (
        "fetch",
        0,
        1,
        1,
        100,
    )
    assert (v.started_at, v.updated_at, v.last_seq, v.events) == (5.0, 6.0, 9, 2)
    assert pending_view("r2", "a", 3.0) == RunView(
        run_id="r2",
        agent="a",
        status="pending",
        liveness="pending",
        started_at=3.0,
        updated_at=3.0,
    )


def test_a_view_names_the_runs_priority_and_fairness_and_a_pending_one_its_lane() -> None:
    fair = Fairness(key="tenant:acme", weight=2)
    start = RunStarted(run_id="r", agent="a", input=to_raw(None), priority=1, fairness=fair, at=5.0)
    v = view_of(summarize_all([(4, 10, [start])]), None)
    assert (v.priority, v.fairness) == (1, fair)
    wire = msgspec.json.decode(msgspec.json.encode(v))
    assert (wire["priority"], wire["fairness"]) == (1, {"key": "tenant:acme", "weight": 2})
    plain = view_of(
        summarize_all([(4, 10, [msgspec.structs.replace(start, priority=3, fairness=None)])]), None
    )
    assert (plain.priority, plain.fairness) == (3, None)
    assert pending_view("r2", "a", 3.0, 5).priority == 5
