"""The onboarding example (examples/onboarding.py) tested as its author would, with the kit.

A deployment per test (``sojourn_env``) under virtual time, with the production deadlines:
HR is paged after a day, the hire has three days to sign and the manager two to approve the
laptop, and each test takes a moment. ``env.result`` skips time whenever every run waits on it;
``env.advance`` moves it by hand, to send a signal on day two. The model is scripted
(``mock_model``, ``turn``), HR's pager replaced where it helps (``mock_step``), the approval
given as its signal (``approval.laptop``); the outbox's ``effects.log`` says how often each
effect ran. No test sleeps, and none asserts on wall time but a hang guard."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

import examples.onboarding
from examples.onboarding import STANDARD_LAPTOP, Hire, Onboarded, it_provision, onboarding
from sojourn.actors import Agent
from sojourn.actors.llm import ModelRequest
from sojourn.actors.testing import ModelMock, SojournEnv, mock_model, mock_step, turn
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    SignalReceived,
    StepStarted,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)

DAY = timedelta(days=1)
ADA = Hire(name="Ada", email="ada@example.com", manager="grace", laptop="16-inch laptop")
NOTE = "Welcome aboard, Ada! The team can't wait to meet you."
HANG_GUARD = 60.0
"""Real seconds a test may take before it is a hang: the flows span days of virtual time."""


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [onboarding, it_provision]


@pytest.fixture(autouse=True)
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(examples.onboarding.OUTBOX_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def model() -> Iterator[ModelMock]:
    """The model writes one note per run, whatever model the environment configures."""
    with mock_model(examples.onboarding.MODEL, lambda request: turn(NOTE, tokens=(60, 15))) as m:
        yield m


def effects(outbox: Path) -> Counter[str]:
    """How often each effect's step body ran."""
    log = outbox / "effects.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[0] for line in lines)


def days(at: float, since: float) -> float:
    """Virtual days from ``since`` to ``at`` (unix seconds)."""
    return (at - since) / DAY.total_seconds()


def steps_at(events: list[RunEvent], start: float) -> dict[str, float]:
    """Each step's name and the virtual day its first attempt started."""
    out: dict[str, float] = {}
    for e in events:
        if isinstance(e, StepStarted):
            out.setdefault(e.name, days(e.at, start))
    return out


async def test_a_hire_who_signs_in_time_is_onboarded_without_paging_hr(
    sojourn_env: SojournEnv, outbox: Path, model: ModelMock
) -> None:
    env = sojourn_env
    t0 = time.monotonic()
    with mock_step(examples.onboarding, "page_hr", returns="paged") as hr:
        run_id = await env.start(onboarding, ADA)
        await env.advance(timedelta(hours=6))  # signed the same morning
        await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
        await env.advance(timedelta(hours=20))  # the manager answers the next day
        state = await env.state(run_id)
        assert state.status == "waiting" and "signal:approval.laptop" in state.waiting_on
        await env.signal(run_id, "approval.laptop", {"approve": True, "by": "grace"}, wait=True)
        done = await env.result(run_id, type=Onboarded)
    assert time.monotonic() - t0 < HANG_GUARD
    assert done.outcome == "onboarded" and done.signed_by == "ada@example.com"
    assert not done.escalated and hr.calls == []
    assert done.laptop is not None and done.laptop.model == "16-inch laptop"
    assert done.laptop_decided_by == "grace" and done.note == NOTE
    assert effects(outbox) == Counter(
        {"welcome": 1, "approval-request": 1, "account": 1, "laptop-order": 1}
    )
    (child,) = (await env.state(run_id)).children
    assert (await env.state(child)).status == "completed"
    # The model step: one request, about this hire, its usage charged to the run.
    (call,) = model.calls
    assert "Ada" in (call.request.messages[-1].content or "")
    assert (call.attempt, call.idempotency_key) == (1, f"{run_id}/{call.position}")
    final = await env.state(run_id)
    assert (final.model_calls, final.spent_input_tokens, final.spent_output_tokens) == (1, 60, 15)
    assert final.spent_usd > 0  # priced as production would be (the model's own table)


async def test_a_late_hire_pages_hr_once_after_a_day_then_goes_on_when_they_sign_on_day_two(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    env = sojourn_env
    with mock_step(examples.onboarding, "page_hr", returns="paged") as hr:
        run_id = await env.start(onboarding, ADA)
        await env.advance(DAY + timedelta(hours=12))  # day 1.5: HR was paged at day 1
        assert len(hr.calls) == 1
        state = await env.state(run_id)
        assert state.status == "waiting" and set(state.waiting_on) == {
            "signal:docs.signed",
            "timer",
        }
        (start,) = [e.at for e in await env.history(run_id) if isinstance(e, RunStarted)]
        assert state.deadline is not None and round(days(state.deadline, start), 2) == 3.0
        await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
        await env.advance(timedelta(hours=2))
        await env.signal(run_id, "approval.laptop", {"approve": True, "by": "grace"}, wait=True)
        done = await env.result(run_id, type=Onboarded)
    assert done.outcome == "onboarded" and done.escalated
    assert done.signed_by == "ada@example.com" and done.laptop_decided_by == "grace"
    ((hired,),) = [c.args for c in hr.calls]
    assert hired == ADA
    (page,) = hr.calls
    assert (page.attempt, page.idempotency_key) == (1, f"{run_id}/{page.position}")
    # In virtual-time order: the packet at day 0, HR at day 1, the signature at day 1.5, the
    # manager's answer at day 1.58, the order right after it.
    events = await env.history(run_id)
    at = steps_at(events, start)
    assert round(at["send_welcome_packet"], 3) == 0.0
    assert round(at["page_hr"], 3) == 1.0
    signals = {
        e.name: round(days(e.at, start), 2)
        for e in events
        if isinstance(e, SignalReceived) and not e.name.startswith("sojourn-")  # child's end
    }
    assert signals == {"docs.signed": 1.5, "approval.laptop": 1.58}
    child = (await env.state(run_id)).children[0]
    ordered = steps_at(await env.history(child), start)["order_laptop"]
    assert 1.58 <= round(ordered, 2) < 1.6
    assert effects(outbox) == Counter(
        {"welcome": 1, "approval-request": 1, "account": 1, "laptop-order": 1}
    )


async def test_a_hire_who_never_signs_ends_unsigned_on_day_three_with_hr_paged_once(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    env = sojourn_env
    t0 = time.monotonic()
    run_id = await env.start(onboarding, ADA)
    done = await env.result(run_id, type=Onboarded)  # three days, skipped
    assert time.monotonic() - t0 < HANG_GUARD
    assert done.outcome == "unsigned" and done.escalated
    assert done.signed_by is None and done.laptop is None and done.laptop_decided_by is None
    assert effects(outbox) == Counter({"welcome": 1, "escalation": 1})  # nothing ordered
    events = await env.history(run_id)
    (start,) = [e.at for e in events if isinstance(e, RunStarted)]
    # The deadlines came due in order, one day apart and then two: the escalation's wait
    # timed out at day 1, HR was paged then, and the docs deadline passed at day 3.
    waits = [
        (e.key, e.outcome, round(days(e.at, start), 3))
        for e in events
        if isinstance(e, WaitCompleted)
    ]
    assert waits == [
        ("signal:docs.signed", "timeout", 1.0),
        ("signal:docs.signed", "timeout", 3.0),
    ]
    assert round(steps_at(events, start)["page_hr"], 3) == 1.0
    (end,) = [e for e in events if isinstance(e, RunCompleted)]
    assert round(days(end.at, start), 3) == 3.0
    # ctx.now() read the virtual clock too: the packet's time, then the time HR was paged.
    nows = [
        msgspec.json.decode(e.value, type=datetime)
        for e in events
        if isinstance(e, ValueRecorded) and e.kind == "now"
    ]
    assert [round(days(n.timestamp(), start), 3) for n in nows] == [0.0, 1.0]
    assert env.now().timestamp() - start >= 3 * DAY.total_seconds()


async def test_the_whole_flow_with_the_escalation_and_a_silent_manager_spans_five_days(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    """Signed on day 2.9 after HR was paged; the manager never answers, so after two more
    days the approval's policy orders the standard laptop: days of deadlines, a moment."""
    env = sojourn_env
    t0 = time.monotonic()
    run_id = await env.start(onboarding, ADA)
    await env.advance(2 * DAY + timedelta(hours=21, minutes=36))  # day 2.9
    await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
    done = await env.result(run_id, type=Onboarded)
    assert time.monotonic() - t0 < HANG_GUARD
    assert done.outcome == "onboarded" and done.escalated
    assert done.laptop is not None and done.laptop.model == STANDARD_LAPTOP
    assert done.laptop_decided_by == "policy"
    events = await env.history(run_id)
    (start,) = [e.at for e in events if isinstance(e, RunStarted)]
    at = steps_at(events, start)
    assert [round(at[s], 2) for s in ("send_welcome_packet", "page_hr", "ask_manager")] == [
        0.0,
        1.0,
        2.9,
    ]
    waits = [(e.key, round(days(e.at, start), 2)) for e in events if isinstance(e, WaitStarted)]
    assert waits[:3] == [
        ("signal:docs.signed", 0.0),  # after the packet
        ("signal:docs.signed", 1.0),  # after HR was paged, to the same day-3 deadline
        ("signal:approval.laptop", 2.9),  # after the signature
    ]
    (end,) = [e for e in events if isinstance(e, RunCompleted)]
    assert round(days(end.at, start), 2) == 4.9  # the approval's two days after the signature
    assert effects(outbox) == Counter(
        {"welcome": 1, "escalation": 1, "approval-request": 1, "account": 1, "laptop-order": 1}
    )


async def test_a_manager_who_denies_gets_the_standard_laptop_ordered(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    run_id = await env.start(onboarding, ADA)
    await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
    denial = {"approve": False, "by": "grace", "note": "the standard one will do"}
    await env.signal(run_id, "approval.laptop", denial, wait=True)
    done = await env.result(run_id, type=Onboarded)
    assert not done.escalated and done.laptop_decided_by == "grace"
    assert done.laptop is not None and done.laptop.model == STANDARD_LAPTOP


def test_the_offline_model_writes_a_note_for_the_hire() -> None:
    """Without a configured model the example answers from its own script: a note that names
    the hire, the same every time (so its recorded runs replay)."""
    request = ModelRequest(messages=tuple(examples.onboarding.welcome_prompt(ADA)))
    first = examples.onboarding.scripted(request)
    assert "Ada" in first.text and first == examples.onboarding.scripted(request)


KINDS = ("welcome", "escalation", "approval-request", "account", "laptop-order")


def delivered(outbox: Path) -> Counter[str]:
    """The effects the outside world has seen: one file per effect and idempotency key."""
    return Counter(
        next(k for k in KINDS if p.name.startswith(f"{k}-"))
        for p in outbox.iterdir()
        if p.suffix == ".txt" and any(p.name.startswith(f"{k}-") for k in KINDS)
    )


@pytest.mark.slow(33)
async def test_a_crash_at_any_seam_of_the_flow_ends_like_the_clean_run_with_each_effect_once(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    """The crash explorer over the whole flow: the model step, the packet, the signature, the
    approval, the child's provisioning; a crash at every seam they pass, each run resumed on a
    fresh worker, each ending as the clean one did, each effect delivered once."""
    result = await sojourn_env.explore_crashes(
        onboarding,
        ADA,
        signals={
            "docs.signed": {"by": "ada@example.com"},
            "approval.laptop": {"approve": True, "by": "grace"},
        },
        effects=lambda: delivered(outbox),
    )
    print(f"onboarding: {result.summary()}")
    names = {s.name for s in result.seams}
    assert {"after_step", "intake_recorded", "child_spawned", "before_ack"} <= names, names
    assert result.explored == len(result.seams)
    assert result.clean.status == "completed"
    assert result.clean.output["outcome"] == "onboarded"


async def test_the_runs_spend_is_read_per_budget_kind(sojourn_env: SojournEnv) -> None:
    env = sojourn_env
    run_id = await env.start(onboarding, ADA)
    await env.advance(timedelta(hours=6))
    spend = await env.spend(run_id)
    assert spend["input_tokens"] == 60 and spend["output_tokens"] == 15
    assert spend["tokens"] == 75 and spend["usd"] > 0
    assert spend["steps"] == 2 and spend["tool_calls"] == 1  # the model call, the packet
    assert spend["polls"] == 0
    assert 6 * 3600 <= spend["wall_seconds"] < 6 * 3600 + 60  # virtual time
