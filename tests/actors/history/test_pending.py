"""Pending runs: a start stored in the inbox and not yet taken is a run you can look at,
signal and cancel; and ``status`` shows what a run spent against its budget.

A run started while no worker is up has no history, only its start in the inbox (the client
names the run in the start's subject, so it can be found). ``Client.status`` and ``sojourn
status`` say ``pending``; signals and cancels for it are accepted and handed back by the intake
until a worker creates the run, then apply in order: a cancel sent while the run was pending is
recorded with its start, so the run never runs a step.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

import sojourn.actors.worker.intake as intake_module
from sojourn.actors import Budget, Client, Context, RunCancelledError, Worker, agent
from sojourn.actors.core.state import RunState, fold
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.schemas import decode_dead_letter
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName, RunNotFound
from sojourn.schemas.events import (
    CancelRequested,
    RunEvent,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepStarted,
    ValueRecorded,
)
from sojourn.schemas.wire import DeadLetter
from tests.actors.cli.test_cli import sojourn
from tests.conftest import wait_for

DEADLINE = 60.0

side_effects: list[str] = []
"""What the steps of ``waiter`` runs did (in this process: the workers run in-process)."""


def effect(tag: str) -> str:
    side_effects.append(tag)
    return tag


@agent("waiter")
async def waiter(ctx: Context, tag: str) -> dict[str, Any]:
    await ctx.step(effect, tag)
    got = await ctx.wait_for("go")
    return {"tag": tag, "got": got}


release = asyncio.Event()


async def hold() -> str:
    await release.wait()
    return "held"


@agent("holder")
async def holder(ctx: Context) -> str:
    return await ctx.step(hold)


@agent("bystander")
async def bystander(ctx: Context) -> str:
    return "here"


@agent("spender", budget=Budget(usd=1.0, tokens=1000))
async def spender(ctx: Context) -> str:
    for _ in range(3):
        await ctx.spend(usd=0.4, tokens=100)
    return "spent"


# --- helpers -----------------------------------------------------------------------------------


def cli(server: EmbeddedServer, settings: Settings) -> list[str]:
    return ["--nats", server.url, "--prefix", settings.prefix]


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def dead_letters(client: Client, kind: str) -> list[DeadLetter]:
    names = client.names
    msgs = await client.broker.direct_get_range(names.dlq_stream, names.dlq(kind))
    return [decode_dead_letter(m.data) for m in msgs]


async def inbox_messages(client: Client) -> int:
    info = await client.broker.api(f"$JS.API.STREAM.INFO.{client.names.inbox_stream}")
    return int(info["state"]["messages"])


async def redelivered(client: Client) -> int:
    """How many inbox messages the intake has had delivered more than once."""
    names = client.names
    info = await client.broker.api(
        f"$JS.API.CONSUMER.INFO.{names.inbox_stream}.{names.intake_consumer}"
    )
    return int(info.get("num_redelivered", 0))


async def register(server: EmbeddedServer, settings: Settings, *agents: Any) -> None:
    """Make the deployment know these agents (a worker served them once), then stop it."""
    async with Worker(list(agents), nats=server.url, settings=settings):
        pass


# --- pending runs, end to end ------------------------------------------------------------------


async def test_a_pending_run_is_shown_takes_signals_and_cancels_and_they_apply_in_order(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    side_effects.clear()
    dep = cli(nats_server, settings)
    before = time.time()
    signalled = await client.trigger("waiter", "a", run_id="p-sig", wait=False)
    await client.start("waiter", "b", run_id="p-cancel")
    assert signalled.queued

    # No worker is up: each run is its stored start.
    assert await client.status("p-sig") == "pending"
    pending = await client.pending("p-sig")
    assert pending is not None
    assert (pending.run_id, pending.agent, pending.sender) == ("p-sig", "waiter", None)
    assert before - 5 <= pending.queued_at <= time.time() + 5
    with pytest.raises(RunNotFound):
        await client.state("p-sig")  # no history yet: the state is the fold of nothing
    with pytest.raises(RunNotFound):
        await client.status("p-nothing")
    assert await client.pending("p-nothing") is None

    text, doc, hist = await asyncio.gather(
        sojourn("status", "p-sig", *dep),
        sojourn("status", "p-sig", "--json", *dep),
        sojourn("history", "p-sig", *dep),
    )
    assert text.rc == 0, text
    rows = dict(line.split(None, 1) for line in text.out.splitlines())
    assert rows["status"] == "pending" and rows["agent"] == "waiter"
    assert "UTC" in rows["queued"] and "ago" in rows["queued"]
    assert doc.rc == 0, doc
    body = json.loads(doc.out)
    assert (body["run_id"], body["agent"], body["status"]) == ("p-sig", "waiter", "pending")
    assert body["queued_at"] and body["liveness"] is None and body["started_at"] is None
    assert hist.rc == 0 and "no history yet" in hist.out, hist

    sig, cancel = await asyncio.gather(
        sojourn("signal", "p-sig", "go", "--payload", '{"ok": 1}', *dep),
        sojourn("cancel", "p-cancel", "--reason", "not needed", *dep),
    )
    assert sig.rc == 0 and "pending" in sig.out, sig
    assert cancel.rc == 0 and "without running a step" in cancel.out, cancel
    assert await client.status("p-cancel") == "pending"

    async with Worker([waiter], nats=nats_server.url, settings=settings):
        assert await client.result("p-sig", timeout=DEADLINE) == {"tag": "a", "got": {"ok": 1}}
        with pytest.raises(RunCancelledError, match="not needed"):
            await client.result("p-cancel", timeout=DEADLINE)

        async def settled() -> bool:  # every inbox message handled, the cancel's too
            return await inbox_messages(client) == 0

        await wait_for(settled, DEADLINE, what="the inbox to be worked through")

    assert "b" not in side_effects and side_effects.count("a") == 1
    history = await client.history("p-cancel")
    # The start, then its queued cancel, recorded before the run ran anything.
    first = [e for d in history[:2] for e in d.events]
    assert [type(e) for e in first] == [RunStarted, CancelRequested]
    events = [e for d in history for e in d.events]
    assert not any(isinstance(e, StepStarted) for e in events)
    cancels = [e for e in events if isinstance(e, CancelRequested)]
    assert len(cancels) == 1  # the cancel's own delivery later recorded nothing more
    assert cancels[0].reason == "not needed" and cancels[0].by and cancels[0].by.startswith("cli")
    assert await client.status("p-cancel") == "cancelled"
    for kind in ("start", "signal", "cancel"):
        assert await dead_letters(client, kind) == []


async def test_a_cancel_sent_through_the_client_before_any_worker_is_recorded_with_the_start(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    side_effects.clear()
    await client.start("waiter", "c", run_id="p-twice")
    await client.cancel("p-twice", "first", by="ops")
    await client.cancel("p-twice", "second", by="ops")
    async with Worker([waiter], nats=nats_server.url, settings=settings):
        with pytest.raises(RunCancelledError, match="first"):
            await client.result("p-twice", timeout=DEADLINE)

        async def settled() -> bool:
            return await inbox_messages(client) == 0

        await wait_for(settled, DEADLINE, what="both cancels to be handled")
    events = await events_of(client, "p-twice")
    assert [type(e).__name__ for e in events] == ["RunStarted", "CancelRequested", "RunCancelled"]
    assert side_effects == []
    assert await dead_letters(client, "cancel") == []


@pytest.mark.parametrize("sender", [None, "ops"])
async def test_a_cancel_on_either_subject_form_is_recorded_with_the_start(
    nats_server: EmbeddedServer, settings: Settings, client: Client, sender: str | None
) -> None:
    """The worker's look for a queued cancel covers the plain subject and the sender's."""
    side_effects.clear()
    run_id = f"p-form-{sender or 'plain'}"
    await client.start("waiter", "f", run_id=run_id)
    broker = await Broker.connect(nats_server.url)
    try:
        subject = Names(settings.prefix).cancel(run_id, sender)
        await broker.publish(subject, b'{"reason": "by form"}', {h.MSG_ID: f"c-{run_id}"})
    finally:
        await broker.close()
    async with Worker([waiter], nats=nats_server.url, settings=settings):
        with pytest.raises(RunCancelledError, match="by form"):
            await client.result(run_id, timeout=DEADLINE)
    events = await events_of(client, run_id)
    assert [type(e).__name__ for e in events] == ["RunStarted", "CancelRequested", "RunCancelled"]
    assert side_effects == []


async def test_a_cancel_recorded_with_the_start_is_not_recorded_again_when_it_is_delivered(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    side_effects.clear()
    release.clear()
    async with Worker([waiter, holder], nats=nats_server.url, settings=settings, concurrency=1):
        await client.start("holder", None, run_id="p-holder")

        async def holding() -> bool:  # the worker's only slot is taken
            return (await client.history("p-holder")) != [] and (
                await client.state("p-holder")
            ).status == "running"

        await wait_for(holding, DEADLINE, what="the holder to take the only slot")
        # The cancel is stored first: its first delivery finds no run and hands it back, and
        # the start, created meanwhile, takes it in. The run cannot execute (no free slot),
        # so the cancel's next delivery finds it created, cancelled, and not yet ended.
        await client.cancel("p-late", "never mind", by="ops")
        await client.start("waiter", "e", run_id="p-late")

        async def settled() -> bool:  # left: the holder's start, kept until it rests
            return await inbox_messages(client) == 1

        await wait_for(settled, DEADLINE, what="the start and the cancel to be handled")
        history = await client.history("p-late")
        assert [[type(e) for e in d.events] for d in history] == [[RunStarted], [CancelRequested]]
        release.set()
        with pytest.raises(RunCancelledError, match="never mind"):
            await client.result("p-late", timeout=DEADLINE)
        assert await client.result("p-holder", timeout=DEADLINE) == "held"
    events = await events_of(client, "p-late")
    assert [type(e).__name__ for e in events] == ["RunStarted", "CancelRequested", "RunCancelled"]
    assert side_effects == []


async def test_a_signal_for_a_run_pending_for_another_workers_agent_is_handed_back_not_refused(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the pending check, a signal for a run with no history would be refused at its
    # first delivery here.
    monkeypatch.setattr(intake_module, "UNKNOWN_RUN_RETRIES", 1)
    await register(nats_server, settings, waiter)
    async with Worker([bystander], nats=nats_server.url, settings=settings):
        await client.start("waiter", "d", run_id="p-elsewhere")
        await client.signal("p-elsewhere", "go", "late")

        async def both_handed_back() -> bool:  # the start and the signal, each at least twice
            return await redelivered(client) >= 2

        await wait_for(both_handed_back, DEADLINE, what="the start and the signal handed back")
        assert await dead_letters(client, "signal") == []
        assert await client.status("p-elsewhere") == "pending"
    # (The bystander stops first: two workers pulling, which one a handed-back message
    # reaches next is up to the broker, and this test is about the signal, not that.)
    async with Worker([waiter], nats=nats_server.url, settings=settings):
        got = await client.result("p-elsewhere", timeout=DEADLINE)
    assert got == {"tag": "d", "got": "late"}
    assert await dead_letters(client, "signal") == []


# --- hostile and unknown -----------------------------------------------------------------------


@pytest.fixture
def small(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, max_payload=4096)


@dataclass
class Raw:
    """A plain NATS connection, publishing what an attacker would."""

    broker: Broker
    names: Names
    client: Client

    async def ask(self, subject: str, data: bytes, timeout: float = 10.0) -> dict[str, Any]:
        inbox = self.broker.new_inbox()
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            await self.broker.publish(subject, data, {h.REPLY_TO: inbox})
            msg = await sub.next_msg(timeout=timeout)
        finally:
            await sub.unsubscribe()
        answer: dict[str, Any] = json.loads(msg.data)
        return answer


@pytest_asyncio.fixture
async def raw(nats_server: EmbeddedServer, small: Settings) -> AsyncIterator[Raw]:
    client = await Client.connect(nats_server.url, settings=small)
    broker = await Broker.connect(nats_server.url)
    try:
        async with Worker([waiter], nats=nats_server.url, settings=small):
            yield Raw(broker, Names(small.prefix), client)
    finally:
        await broker.close()
        await client.close()


def trigger(**fields: Any) -> bytes:
    return json.dumps({"input": "x", **fields}).encode()


@pytest.mark.parametrize(
    ("token", "body", "code", "nothing_at"),
    [
        ("subj-id", trigger(run_id="body-id"), "invalid_run_id", ("subj-id", "body-id")),
        ("evil-c3", trigger(), "invalid_run_id", ("evil-c3",)),
        ("evil-c3", trigger(run_id="evil-c3"), "invalid_run_id", ("evil-c3",)),
        ("bad$id", trigger(), "invalid_trigger", ()),
        ("x" * 129, trigger(), "invalid_trigger", ()),
        ("big", trigger(run_id="big", pad="y" * 5000), "payload_too_large", ("big",)),
        ("noinput", json.dumps({"run_id": "noinput"}).encode(), "invalid_trigger", ("noinput",)),
    ],
)
async def test_a_bad_start_subject_is_dead_lettered_answered_and_creates_nothing(
    raw: Raw, token: str, body: bytes, code: str, nothing_at: tuple[str, ...]
) -> None:
    subject = f"{raw.names.prefix}.start.waiter.{token}"
    answer = await raw.ask(subject, body)
    assert answer["error"]["code"] == code, answer
    # A subject that does not parse cannot say what it is: its record is filed as "other".
    kind = "other" if code == "invalid_trigger" and not nothing_at else "start"
    records = await dead_letters(raw.client, kind)
    assert [(r.code, r.subject) for r in records] == [(code, subject)]
    for run_id in nothing_at:
        assert await raw.client.history(run_id) == []
        with pytest.raises(RunNotFound):
            await raw.client.status(run_id)


async def test_a_start_subject_names_the_run_and_the_old_form_still_works(raw: Raw) -> None:
    prefix = raw.names.prefix
    named = await raw.ask(f"{prefix}.start.waiter.from-subject", trigger())
    assert named == {"run_id": "from-subject", "created": True}
    same = await raw.ask(f"{prefix}.as.ada.start.waiter.both", trigger(run_id="both"))
    assert same == {"run_id": "both", "created": True}
    old = await raw.ask(f"{prefix}.start.waiter", trigger(run_id="old-form"))
    assert old == {"run_id": "old-form", "created": True}
    for run_id in ("from-subject", "both", "old-form"):
        started = (await events_of(raw.client, run_id))[0]
        assert isinstance(started, RunStarted) and started.run_id == run_id
    assert await dead_letters(raw.client, "start") == []


async def test_a_signal_for_a_run_neither_pending_nor_existing_is_refused_unknown_run(
    raw: Raw,
) -> None:
    answer = await raw.ask(f"{raw.names.prefix}.signal.ghost.go", b"1", timeout=DEADLINE)
    assert answer["error"]["code"] == "unknown_run", answer
    cancel = await raw.ask(f"{raw.names.prefix}.cancel.ghost", b"", timeout=DEADLINE)
    assert cancel["error"]["code"] == "unknown_run", cancel
    assert [r.code for r in await dead_letters(raw.client, "signal")] == ["unknown_run"]
    assert [r.code for r in await dead_letters(raw.client, "cancel")] == ["unknown_run"]
    assert await raw.client.history("ghost") == []


async def test_junk_in_the_inbox_does_not_make_a_run_pending(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    await client.start("waiter", "x", run_id="unrelated")  # creates the streams
    broker = await Broker.connect(nats_server.url)
    try:
        p = settings.prefix
        await broker.publish(f"{p}.start.waiter.victim", trigger(run_id="other"))
        await broker.publish(f"{p}.start.waiter.victim", b"not json")
        await broker.publish(f"{p}.start.waiter.victim-c1", trigger())
    finally:
        await broker.close()
    assert await client.pending("victim") is None
    assert await client.pending("victim-c1") is None
    with pytest.raises(RunNotFound):
        await client.status("victim")
    assert await client.status("unrelated") == "pending"


# --- spend against the budget ------------------------------------------------------------------


async def test_status_shows_spend_against_the_budget_with_grants_after_a_resume(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = cli(nats_server, settings)
    async with Worker([spender], nats=nats_server.url, settings=settings):
        run_id = await client.start("spender", None, run_id="spend-1")

        async def suspended() -> bool:
            try:
                return (await client.state(run_id)).status == "suspended"
            except RunNotFound:
                return False

        await wait_for(suspended, DEADLINE, what="the run to reach its budget")
        started = (await events_of(client, run_id))[0]
        assert isinstance(started, RunStarted)
        assert (started.budget_usd, started.budget_tokens) == (1.0, 1000)
        state = await client.state(run_id)
        assert state.spent_usd == pytest.approx(1.2) and state.spent_tokens == 300
        assert (state.granted_usd, state.granted_tokens) == (1.0, 1000)

        text, doc = await asyncio.gather(
            sojourn("status", run_id, *dep), sojourn("status", run_id, "--json", *dep)
        )
        rows = dict(line.split(None, 1) for line in text.out.splitlines())
        assert rows["spend"] == "1.2 usd of 1, 300 tokens of 1000", text
        body = json.loads(doc.out)
        assert body["spent_usd"] == pytest.approx(1.2) and body["spent_tokens"] == 300
        assert (body["budget_usd"], body["budget_tokens"]) == (1.0, 1000)

        await client.resume(run_id)
        assert await client.result(run_id, timeout=DEADLINE) == "spent"

    after = json.loads((await sojourn("status", run_id, "--json", *dep)).out)
    assert after["status"] == "completed"
    assert after["spent_usd"] == pytest.approx(1.2) and after["spent_tokens"] == 300
    assert (after["budget_usd"], after["budget_tokens"]) == (2.0, 2000)  # granted twice
    final = (await sojourn("status", run_id, *dep)).out
    assert "1.2 usd of 2, 300 tokens of 2000 (budget granted 2 times)" in final


# --- the fold of spend (pure) ------------------------------------------------------------------

START = RunStarted(run_id="r", agent="a", input=msgspec.Raw(b"null"), budget_usd=2.0)


def spend(position: int, usd: float, tokens: int) -> ValueRecorded:
    value = msgspec.Raw(msgspec.json.encode({"usd": usd, "tokens": tokens}))
    return ValueRecorded(position=position, kind="spend", value=value)


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1e6, allow_nan=False),
            st.integers(min_value=0, max_value=10**9),
        ),
        max_size=20,
    )
)
def test_the_fold_sums_what_spend_values_recorded(spends: list[tuple[float, int]]) -> None:
    events: list[RunEvent] = [START]
    events += [spend(i, usd, tokens) for i, (usd, tokens) in enumerate(spends)]
    state = fold(events)
    assert state.spent_usd == pytest.approx(sum(u for u, _ in spends))
    assert state.spent_tokens == sum(t for _, t in spends)
    assert (state.budget_usd, state.budget_tokens) == (2.0, None)
    assert (state.granted_usd, state.granted_tokens) == (2.0, None)


def test_other_values_and_unreadable_spend_count_nothing_and_resumes_grant_again() -> None:
    events: list[RunEvent] = [
        START,
        ValueRecorded(position=0, kind="now", value=msgspec.Raw(b'{"usd": 5}')),
        ValueRecorded(position=1, kind="spend", value=msgspec.Raw(b'"lots"')),
        spend(2, 0.5, 7),
        RunSuspended(reason="budget", detail="spent"),
        RunResumed(by="ops"),
        RunSuspended(reason="cap", detail="polls"),
        RunResumed(by="ops"),
    ]
    state = fold(events)
    assert (state.spent_usd, state.spent_tokens) == (0.5, 7)
    assert state.grants == 2  # a resume after a cap grants no budget
    assert state.granted_usd == 4.0 and state.granted_tokens is None
    assert RunState().granted_usd is None and RunState().grants == 1


async def test_the_client_refuses_a_child_form_run_id_before_publishing(client: Client) -> None:
    await client.start("nobody", None, run_id="plain-1")  # creates the streams
    info = await client.broker.api(f"$JS.API.STREAM.INFO.{client.names.inbox_stream}")
    before = info["state"]["messages"]
    for run_id in ("order-c1", "x-c0", "a-b-c12"):
        with pytest.raises(InvalidName, match="child run"):
            await client.start("nobody", None, run_id=run_id)
    info = await client.broker.api(f"$JS.API.STREAM.INFO.{client.names.inbox_stream}")
    assert info["state"]["messages"] == before
    await client.start("nobody", None, run_id="a-c")  # not the child form: accepted
