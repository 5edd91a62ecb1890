"""Approvals and polling on a real nats-server: deadlines, escalation, backoff, the poll cap."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from sojourn.actors import ApprovalDecision, Client, Context, Worker, agent
from sojourn.actors.testing import SojournEnv
from sojourn.broker import EmbeddedServer
from sojourn.schemas import SignalReceived, StepCompleted, WaitCompleted, WaitStarted
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

audit: list[tuple[str, ...]] = []


def remind(approver: str, name: str) -> str:
    audit.append(("remind", approver, name))
    return approver


def escalate(approver: str, nxt: str | None, name: str) -> str:
    audit.append(("escalate", approver, str(nxt), name))
    return str(nxt)


@agent("expense")
async def expense(ctx: Context, amount: int) -> dict[str, Any]:
    d = await ctx.approval(
        "expense",
        approvers=["alice", "bob"],
        timeout=1.0,
        remind=remind,
        remind_every=0.4,
        escalate=escalate,
        on_timeout="deny",
    )
    return {
        "approved": d.approved,
        "by": d.by,
        "verified": d.verified,
        "via": d.via,
        "stage": d.stage,
        "at": d.at.isoformat(),
        "amount": amount,
    }


async def events(client: Client, run_id: str) -> list[Any]:
    return [e for d in await client.history(run_id) for e in d.events]


async def test_approval_deadline_escalation_then_decision(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    audit.clear()
    async with Worker([expense], nats=nats_server.url, settings=settings):
        run_id = await client.start("expense", 120, run_id="exp-1", wait=True)

        async def waiting_for_bob() -> bool:
            if ("remind", "bob", "expense") not in audit:
                return False
            st = await client.state(run_id)
            return st.status == "waiting" and "signal:approval.expense" in st.waiting_on

        await wait_for(waiting_for_bob, what="the escalation to bob, then a wait for a decision")
        assert any(a[0] == "escalate" for a in audit)
        await client.signal(
            run_id,
            "approval.expense",
            {"approve": True, "by": "bob", "note": "fine"},
            sender="bob-ui",
        )
        out = await client.result(run_id, timeout=30)
    # Without authentication the payload's claim stands, and says it is one.
    assert out["approved"] is True and out["by"] == "bob" and out["verified"] is False
    assert out["via"] == "decision" and out["stage"] == 1  # decided after the escalation
    # The audit: requests and reminders to alice, the escalation, the request to bob.
    assert audit[0] == ("remind", "alice", "expense")
    assert sum(a == ("remind", "alice", "expense") for a in audit) >= 2  # request + reminder
    assert ("escalate", "alice", "bob", "expense") in audit
    assert audit.index(("escalate", "alice", "bob", "expense")) < audit.index(
        ("remind", "bob", "expense")
    )
    history = await events(client, run_id)
    signal = [e for e in history if isinstance(e, SignalReceived)]
    assert len(signal) == 1 and signal[0].sent_by == "bob-ui"
    assert signal[0].sender_verified is False  # the server has no users: a claim
    assert b'"by":"bob"' in bytes(signal[0].payload)  # the decider is in the history
    steps = [e.name for e in history if isinstance(e, StepCompleted)]
    assert steps.count("escalate") == 1 and steps.count("remind") >= 3
    # Every pause was a recorded wait on a broker timer.
    assert any(isinstance(e, WaitStarted) and e.deadline for e in history)


async def test_approval_final_policy_applies_when_nobody_decides(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    @agent("silent")
    async def silent(ctx: Context, _: None) -> ApprovalDecision:
        return await ctx.approval("x", approvers=["a"], timeout=0.5, on_timeout="approve")

    async with Worker([silent], nats=nats_server.url, settings=settings):
        run_id = await client.start("silent", None, wait=True)
        out = await client.result(run_id, timeout=30)
    assert out["approved"] is True and out["via"] == "policy" and out["by"] == "policy"


async def test_approval_without_by_is_the_senders_claim(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """Without authentication a payload that names nobody is decided by the signal's sender,
    a claim too (``verified`` is false)."""

    @agent("unnamed")
    async def unnamed(ctx: Context, _: None) -> ApprovalDecision:
        return await ctx.approval("x", approvers=["a"], timeout=120)

    async with Worker([unnamed], nats=nats_server.url, settings=settings):
        run_id = await client.start("unnamed", None, wait=True)
        await client.signal(run_id, "approval.x", {"approve": False}, sender="carol-ui")
        out = await client.result(run_id, timeout=30)
    assert out["approved"] is False and out["via"] == "decision" and out["stage"] == 0
    assert out["by"] == "carol-ui" and out["verified"] is False


class JobService:
    """A fake external job system with its own state, advanced by its own task."""

    def __init__(self, ready_after: float) -> None:
        self.ready_after = ready_after
        self.started = time.monotonic()
        self.checks: list[float] = []
        self.done = False
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        await asyncio.sleep(self.ready_after)
        self.done = True

    async def status(self, job: str) -> str | None:
        self.checks.append(time.monotonic())
        return f"{job}: finished" if self.done else None

    def close(self) -> None:
        self._task.cancel()


async def test_poll_with_backoff_until_the_job_is_done(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    service = JobService(ready_after=1.5)

    async def check_job(job: str) -> str | None:
        return await service.status(job)

    @agent("poller")
    async def poller(ctx: Context, job: str) -> str:
        return await ctx.poll(check_job, job, every=0.2, backoff=2.0, max_interval=0.8)

    try:
        async with Worker([poller], nats=nats_server.url, settings=settings):
            run_id = await client.start("poller", "job-7", wait=True)
            assert await client.result(run_id, timeout=30) == "job-7: finished"
    finally:
        service.close()
    gaps = [b - a for a, b in zip(service.checks, service.checks[1:], strict=False)]
    assert len(service.checks) >= 3
    assert gaps[0] >= 0.19 and gaps[1] >= 0.38  # backoff: 0.2 s, then 0.4 s, ...
    assert all(g >= 0.19 for g in gaps) and max(gaps) < 0.8 + 1.0  # capped at max_interval
    history = await events(client, run_id)
    checks = [e for e in history if isinstance(e, StepCompleted) and e.name == "check_job"]
    sleeps = [e for e in history if isinstance(e, WaitCompleted) and e.key == "poll"]
    assert len(checks) == len(service.checks)  # every check is a journaled step
    assert len(sleeps) == len(checks) - 1  # every pause is a broker timer


async def test_poll_cap_suspends_a_run_whose_job_never_finishes(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    calls = {"n": 0}

    def never(job: str) -> None:
        calls["n"] += 1
        return None

    @agent("stubborn", poll_cap=4)
    async def stubborn(ctx: Context, job: str) -> str:
        return await ctx.poll(never, job, every=0.05, backoff=1.0)

    async with Worker([stubborn], nats=nats_server.url, settings=settings):
        run_id = await client.start("stubborn", "job-x", wait=True)

        async def suspended() -> bool:
            return (await client.state(run_id)).status == "suspended"

        await wait_for(suspended, what="the poll cap to suspend the run")
        st = await client.state(run_id)
        assert st.suspended_reason == "cap" and "poll cap of 4" in (st.suspended_detail or "")
        assert calls["n"] == 4  # not failed, not left polling
        seen = len(await client.history(run_id))

        async def settled() -> bool:
            return len(await client.history(run_id)) == seen and calls["n"] == 4

        await wait_for(settled, what="the suspended run to stay still")
        # A human lifts the cap: another 4 checks, then suspended again.
        await client.resume(run_id, "give it more time", by="ops")

        async def suspended_again() -> bool:
            st = await client.state(run_id)
            return st.status == "suspended" and st.cap_resumes == 1

        await wait_for(suspended_again, what="the second cap")
        assert calls["n"] == 8


@agent("expense_days")
async def expense_days(ctx: Context, amount: int) -> dict[str, Any]:
    """The production shape: a day per approver, a reminder every six hours."""
    d = await ctx.approval(
        "expense",
        approvers=["alice", "bob"],
        timeout=timedelta(days=1),
        remind=remind,
        remind_every=timedelta(hours=6),
        escalate=escalate,
        on_timeout="deny",
    )
    return {"approved": d.approved, "via": d.via, "at": d.at.isoformat(), "amount": amount}


@pytest.mark.parametrize("sojourn_agents", [[expense_days]])
async def test_approval_days_of_reminders_and_escalation_under_virtual_time(
    sojourn_env: SojournEnv,
) -> None:
    """The testing kit's virtual time on sojourn's own patterns: two days of reminders and an
    escalation, with nobody deciding, in a moment."""
    audit.clear()
    env = sojourn_env
    start = env.now()
    run_id = await env.start(expense_days, 99)
    out = await env.result(run_id)
    assert out["approved"] is False and out["via"] == "policy"
    decided = datetime.fromisoformat(out["at"])
    assert timedelta(days=2) <= decided - start < timedelta(days=2, minutes=5)
    # Each approver: asked, then reminded every six hours of their day, then escalated.
    assert [a for a in audit if a[0] == "escalate"] == [
        ("escalate", "alice", "bob", "expense"),
        ("escalate", "bob", "None", "expense"),
    ]
    for who in ("alice", "bob"):
        assert sum(a == ("remind", who, "expense") for a in audit) == 4, audit
    reminders = [
        e.at
        for e in await env.history(run_id)
        if isinstance(e, StepCompleted) and e.name == "remind"
    ]
    gaps = [round((b - a) / 3600) for a, b in itertools.pairwise(reminders)]
    assert gaps == [6, 6, 6, 6, 6, 6, 6], gaps
