"""Cancelling runs: durable requests that interrupt a running step
(tests/actors/worker/test_interrupt.py has the rest: timings, sync steps, compensation,
terminate)."""

from __future__ import annotations

import asyncio

import pytest

from sojourn.actors import Client, Context, RunCancelledError, Worker, agent
from sojourn.broker import EmbeddedServer
from sojourn.schemas import (
    CancelRequested,
    RunCancelled,
    StepCompleted,
    StepFailed,
    StepStarted,
)
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

release = asyncio.Event()
ran: list[str] = []


async def hold() -> str:
    ran.append("hold")
    await release.wait()
    return "held"


def after() -> str:
    ran.append("after")
    return "after"


@agent("cancellable")
async def cancellable(ctx: Context, _: None) -> str:
    await ctx.step(hold)
    return await ctx.step(after)


async def test_cancel_a_running_run_interrupts_its_step_and_runs_nothing_after(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    release.clear()
    ran.clear()
    async with Worker([cancellable], nats=nats_server.url, settings=settings):
        run_id = await client.start("cancellable", None, run_id="cancel-running", wait=True)

        async def holding() -> bool:
            return ran == ["hold"]

        await wait_for(holding, what="the first step to run")
        await client.cancel(run_id, "changed my mind", by="ops")

        async def requested() -> bool:
            events = [e for d in await client.history(run_id) for e in d.events]
            return any(isinstance(e, CancelRequested) for e in events)

        await wait_for(requested, what="the cancel request to be recorded")
        # The step is never released while the run lives: only the interrupt can end it (a
        # step that finished before the worker heard of the cancel would be recorded done).
        with pytest.raises(RunCancelledError, match="changed my mind"):
            await client.result(run_id, timeout=30)
        release.set()
    assert ran == ["hold"]  # the step after the cancel never ran
    events = [e for d in await client.history(run_id) for e in d.events]
    names = [type(e).__name__ for e in events]
    assert names[-1] == "RunCancelled"
    # The running step was interrupted (its task cancelled), recorded as such, not retried.
    assert not [e for e in events if isinstance(e, StepCompleted)]
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [(e.position, e.error.type, e.retry_at) for e in failed] == [(0, "Cancelled", None)]
    assert [e.position for e in events if isinstance(e, StepStarted)] == [0]
    cancelled = events[-1]
    assert isinstance(cancelled, RunCancelled) and cancelled.reason == "changed my mind"
    assert await client.status(run_id) == "cancelled"


async def test_cancel_while_no_worker_runs_takes_effect_when_one_starts(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    ran.clear()
    release.clear()  # the first step cannot finish before the cancel is handled
    # Register the agent name once, so the intake knows it, then stop.
    async with Worker([cancellable], nats=nats_server.url, settings=settings):
        pass
    run_id = await client.start("cancellable", None, run_id="cancel-queued")
    await client.cancel(run_id, "not needed")
    async with Worker([cancellable], nats=nats_server.url, settings=settings):

        async def requested() -> bool:
            events = [e for d in await client.history(run_id) for e in d.events]
            return any(isinstance(e, CancelRequested) for e in events)

        await wait_for(requested, what="the cancel request to be recorded")
        release.set()  # a step that is running finishes; the cancel takes effect after it
        with pytest.raises(RunCancelledError):
            await client.result(run_id, timeout=30)
    # Start and cancel are handled in order; the run may begin its first step before the
    # cancel lands, but never gets past it.
    assert "after" not in ran
    assert await client.status(run_id) == "cancelled"


async def test_cancel_of_a_finished_run_changes_nothing(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    release.set()

    @agent("quick")
    async def quick(ctx: Context, _: None) -> str:
        return "done"

    async with Worker([quick], nats=nats_server.url, settings=settings):
        run_id = await client.start("quick", None, wait=True)
        assert await client.result(run_id, timeout=30) == "done"
        before = await client.history(run_id)
        await client.cancel(run_id)
        # A second, ordinary run proves the cancel was processed (same intake, in order).
        probe = await client.start("quick", None, wait=True)
        await client.result(probe, timeout=30)
    assert await client.history(run_id) == before
    assert await client.status(run_id) == "completed"
