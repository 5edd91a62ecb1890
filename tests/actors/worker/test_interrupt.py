"""A cancel that always works, on a real nats-server: a running step is interrupted (an async
one cancelled, a sync one abandoned), a lost notice costs seconds, the compensation runs once
(also across a worker SIGKILL), terminate skips it, and a parent's cancel reaches its
children, mid-step too."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from sojourn.actors import Client, Context, RunCancelledError, Worker, agent
from sojourn.broker import Delivery, EmbeddedServer
from sojourn.schemas import (
    CancelTaken,
    RunCancelled,
    RunEvent,
    StepCompleted,
    StepFailed,
    StepStarted,
    decode_events,
)
from sojourn.schemas.config import Settings
from tests.conftest import wait_for
from tests.procs import WorkerProc

started: dict[str, asyncio.Event] = {}
ran: list[str] = []


def _started(name: str) -> asyncio.Event:
    return started.setdefault(name, asyncio.Event())


async def long_call() -> str:
    ran.append("long_call")
    _started("long_call").set()
    await asyncio.sleep(60)
    return "too late"


def after() -> str:
    ran.append("after")
    return "after"


@agent("sixty")
async def sixty(ctx: Context, _: None) -> str:
    await ctx.step(long_call)
    return await ctx.step(after)


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def ended_cancelled(client: Client, run_id: str) -> RunCancelled:
    async def done() -> bool:
        return await client.status(run_id) == "cancelled"

    await wait_for(done, what=f"run {run_id} to end cancelled")
    end = (await events_of(client, run_id))[-1]
    assert isinstance(end, RunCancelled)
    return end


def failures(events: list[RunEvent]) -> list[tuple[int, str, str]]:
    return [(e.position, e.name, e.error.type) for e in events if isinstance(e, StepFailed)]


# --- interrupting ------------------------------------------------------------------------------


async def test_a_cancel_during_a_60s_async_step_interrupts_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    ran.clear()
    _started("long_call").clear()
    async with Worker([sixty], nats=nats_server.url, settings=settings):
        run_id = await client.start("sixty", None, run_id="sixty-1", wait=True)
        await wait_for(
            lambda: asyncio.sleep(0, _started("long_call").is_set()), what="the 60 s step"
        )
        # Watch the run's event subject live: the moment RunCancelled is stored, we see it.
        seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def on_event(msg: Delivery) -> None:
            if any(isinstance(e, RunCancelled) for e in decode_events(msg.data)):
                if not seen.done():
                    seen.set_result(time.monotonic())

        sub = await client.broker.subscribe(client.names.events(run_id), cb=on_event)
        await client.broker.flush()
        await client.cancel(run_id, "user pressed stop")
        returned = time.monotonic()
        at = await asyncio.wait_for(seen, 30)
        await sub.unsubscribe()
        # The step would run 60 s: the cancel interrupted it. How soon (the target is under a
        # second) is bench.takeover's figure (docs/benchmarks.md), not an assertion here.
        print(f"\ncancel returned -> RunCancelled stored: {(at - returned) * 1000:.0f} ms")
        with pytest.raises(RunCancelledError, match="user pressed stop"):
            await client.result(run_id, timeout=30)
    events = await events_of(client, run_id)
    assert ran == ["long_call"]
    assert failures(events) == [(0, "long_call", "Cancelled")]
    failed = next(e for e in events if isinstance(e, StepFailed))
    assert failed.retry_at is None and "task was cancelled" in failed.error.message
    assert not [e for e in events if isinstance(e, StepCompleted)]


hung = threading.Event()
thread_started = threading.Event()
thread_done = threading.Event()


def hung_sync() -> str:
    thread_started.set()
    hung.wait(120)  # a blocking call nobody can interrupt
    thread_done.set()
    return "finally"


@agent("sync_hang")
async def sync_hang(ctx: Context, _: None) -> str:
    return await ctx.step(hung_sync)


async def test_a_hung_sync_step_is_abandoned_and_recorded_so(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    for e in (hung, thread_started, thread_done):
        e.clear()
    try:
        async with Worker([sync_hang], nats=nats_server.url, settings=settings):
            run_id = await client.start("sync_hang", None, run_id="sync-hang", wait=True)
            await wait_for(lambda: asyncio.sleep(0, thread_started.is_set()), what="the sync step")
            await client.cancel(run_id, "stuck")
            end = await ended_cancelled(client, run_id)
            assert end.reason == "stuck"
            assert not thread_done.is_set()  # the thread still hangs: the cancel did not wait
            hung.set()  # its result, when it comes, is discarded
            await wait_for(lambda: asyncio.sleep(0, thread_done.is_set()), what="the thread")
            probe = await client.start("sync_hang", None, run_id="sync-probe", wait=True)
            assert await client.result(probe, timeout=30) == "finally"  # the worker is fine
    finally:
        hung.set()
    events = await events_of(client, run_id)
    assert failures(events) == [(0, "hung_sync", "Abandoned")]
    failed = next(e for e in events if isinstance(e, StepFailed))
    assert "cannot be stopped" in failed.error.message and "discarded" in failed.error.message
    assert not [e for e in events if isinstance(e, StepCompleted)]
    assert isinstance(events[-1], RunCancelled)


async def test_a_lost_notice_costs_seconds_not_forever(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """The worker hears no notice at all (as after a reconnect that lost it): the activation's
    own look at its run's last event, every few seconds, finds the cancel."""
    ran.clear()
    _started("long_call").clear()
    async with Worker([sixty], nats=nats_server.url, settings=settings) as worker:
        await worker.interrupts.close()  # deaf to notices
        run_id = await client.start("sixty", None, run_id="deaf", wait=True)
        await wait_for(
            lambda: asyncio.sleep(0, _started("long_call").is_set()), what="the 60 s step"
        )
        await client.cancel(run_id, "no notice")
        await ended_cancelled(client, run_id)
        assert worker.interrupts.notices == 0
    assert failures(await events_of(client, run_id)) == [(0, "long_call", "Cancelled")]
    assert ran == ["long_call"]


# --- compensation ------------------------------------------------------------------------------

comp_log: list[str] = []


async def charge(order: str) -> str:
    comp_log.append("charge")
    return f"ch-{order}"


async def refund(order: str) -> str:
    comp_log.append("refund")
    return f"refunded {order}"


async def notify(order: str) -> str:
    comp_log.append("notify")
    return "ok"


async def undo(ctx: Context, order: str) -> None:
    await ctx.step(refund, order)
    await ctx.step(notify, order)


@agent("shop", on_cancel=undo)
async def shop(ctx: Context, order: str) -> str:
    await ctx.step(charge, order)
    await ctx.step(long_call)
    return "shipped"


async def test_the_compensation_runs_once_after_a_cancel(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    comp_log.clear()
    _started("long_call").clear()
    async with Worker([shop], nats=nats_server.url, settings=settings):
        run_id = await client.start("shop", "o1", run_id="shop-1", wait=True)
        await wait_for(
            lambda: asyncio.sleep(0, _started("long_call").is_set()), what="the long step"
        )
        await client.cancel(run_id, "customer changed their mind")
        end = await ended_cancelled(client, run_id)
    assert comp_log == ["charge", "refund", "notify"]
    assert end.reason == "customer changed their mind" and end.compensation_error is None
    events = await events_of(client, run_id)
    taken = [e for e in events if isinstance(e, CancelTaken)]
    assert [(t.stopped_at, t.compensate_at) for t in taken] == [(1, 2)]
    done = [(e.position, e.name) for e in events if isinstance(e, StepCompleted)]
    assert done == [(0, "charge"), (2, "refund"), (3, "notify")]
    assert failures(events) == [(1, "long_call", "Cancelled")]


async def boom(order: str) -> str:
    comp_log.append("boom")
    raise ValueError("refund service down")


async def failing_undo(ctx: Context, order: str) -> None:
    await ctx.step(boom, order)
    comp_log.append("not reached")


@agent("shop_bad_undo", on_cancel=failing_undo)
async def shop_bad_undo(ctx: Context, order: str) -> str:
    await ctx.step(long_call)
    return "shipped"


async def test_a_failing_compensation_still_ends_the_run_cancelled(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    comp_log.clear()
    _started("long_call").clear()
    async with Worker([shop_bad_undo], nats=nats_server.url, settings=settings):
        run_id = await client.start("shop_bad_undo", "o2", run_id="shop-2", wait=True)
        await wait_for(
            lambda: asyncio.sleep(0, _started("long_call").is_set()), what="the long step"
        )
        await client.cancel(run_id, "stop")
        end = await ended_cancelled(client, run_id)
    assert comp_log == ["boom"]
    assert end.reason == "stop"
    assert end.compensation_error is not None
    assert end.compensation_error.type == "StepError"
    assert "refund service down" in end.compensation_error.message
    assert failures(await events_of(client, run_id)) == [
        (0, "long_call", "Cancelled"),
        (1, "boom", "ValueError"),
    ]


def log_rows(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_the_compensation_runs_once_across_a_worker_sigkill_in_its_middle(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    url, prefix = nats_server.url, settings.prefix
    app = "tests.apps.compensating"
    first = await WorkerProc(url, prefix, app, SOJOURN_TEST_LOG=str(log)).ready()
    try:
        run_id = await client.start("compensating", "o7", run_id="comp-kill", wait=True)

        async def rows(*want: str) -> bool:
            return log_rows(log) == list(want)

        await wait_for(lambda: rows("book 1", "wait_for_payment 1"), what="the main code")
        await client.cancel(run_id, "order withdrawn")
        await wait_for(
            lambda: rows("book 1", "wait_for_payment 1", "release_booking 1", "notify_customer 1"),
            what="the compensation's last step to begin",
        )
        first.kill()
    finally:
        first.kill()
    second = await WorkerProc(url, prefix, app, SOJOURN_TEST_LOG=str(log)).ready()
    try:
        end = await ended_cancelled(client, run_id)
    finally:
        second.stop()
    assert end.reason == "order withdrawn" and end.compensation_error is None
    # Nothing completed ran again; the step cut off by the kill ran again, as attempt 2.
    assert log_rows(log) == [
        "book 1",
        "wait_for_payment 1",
        "release_booking 1",
        "notify_customer 1",
        "notify_customer 2",
    ]
    events = await events_of(client, run_id)
    assert len([e for e in events if isinstance(e, CancelTaken)]) == 1
    done = [(e.position, e.name) for e in events if isinstance(e, StepCompleted)]
    assert done == [(0, "book"), (2, "release_booking"), (3, "notify_customer")]


# --- terminate ---------------------------------------------------------------------------------


async def test_terminate_interrupts_the_step_and_skips_the_compensation(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    comp_log.clear()
    _started("long_call").clear()
    async with Worker([shop], nats=nats_server.url, settings=settings):
        run_id = await client.start("shop", "o3", run_id="shop-3", wait=True)
        await wait_for(
            lambda: asyncio.sleep(0, _started("long_call").is_set()), what="the long step"
        )
        await client.terminate(run_id, "runaway")
        end = await ended_cancelled(client, run_id)
    assert end.terminated and end.reason == "terminated: runaway"
    assert comp_log == ["charge"]  # no refund, no notify
    events = await events_of(client, run_id)
    assert not [e for e in events if isinstance(e, CancelTaken)]
    assert failures(events) == [(1, "long_call", "Cancelled")]


async def slow_refund(order: str) -> str:
    comp_log.append("slow_refund")
    _started("slow_refund").set()
    await asyncio.sleep(60)
    return "refunded"


async def slow_undo(ctx: Context, order: str) -> None:
    await ctx.step(slow_refund, order)
    comp_log.append("not reached")


@agent("shop_slow_undo", on_cancel=slow_undo)
async def shop_slow_undo(ctx: Context, order: str) -> str:
    await ctx.step(long_call)
    return "shipped"


async def test_terminate_stops_a_compensation_under_way(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    comp_log.clear()
    for name in ("long_call", "slow_refund"):
        _started(name).clear()
    async with Worker([shop_slow_undo], nats=nats_server.url, settings=settings):
        run_id = await client.start("shop_slow_undo", "o4", run_id="shop-4", wait=True)
        await wait_for(lambda: asyncio.sleep(0, _started("long_call").is_set()), what="step")
        await client.cancel(run_id, "stop")
        await wait_for(
            lambda: asyncio.sleep(0, _started("slow_refund").is_set()), what="the compensation"
        )
        await client.terminate(run_id)
        end = await ended_cancelled(client, run_id)
    assert end.terminated and end.reason == "terminated: stop"
    assert comp_log == ["slow_refund"]
    assert failures(await events_of(client, run_id)) == [
        (0, "long_call", "Cancelled"),
        (1, "slow_refund", "Cancelled"),
    ]


# --- children ----------------------------------------------------------------------------------


async def kid_work(x: int) -> int:
    ran.append(f"kid {x}")
    _started(f"kid {x}").set()
    await asyncio.sleep(60)
    return x


@agent("busy_kid")
async def busy_kid(ctx: Context, x: int) -> int:
    return await ctx.step(kid_work, x)


async def parent_work() -> str:
    ran.append("parent")
    _started("parent").set()
    await asyncio.sleep(60)
    return "parent"


@agent("busy_parent")
async def busy_parent(ctx: Context, mode: str) -> str:
    h = await ctx.start_child(busy_kid, 1 if mode == "mid_step" else 2)
    if mode == "mid_step":
        await ctx.step(parent_work)  # the parent is cancelled in here
    await h.result()  # (or here, parked on its child)
    return "done"


@pytest.mark.parametrize("mode", ["mid_step", "waiting"])
async def test_a_parents_cancel_reaches_its_children_mid_step(
    nats_server: EmbeddedServer, settings: Settings, client: Client, mode: str
) -> None:
    """The parent is cancelled in the middle of its own step, or parked on its child; either
    way the child, in the middle of its step, is interrupted and ends cancelled too."""
    ran.clear()
    kid = 1 if mode == "mid_step" else 2
    for name in ("parent", f"kid {kid}"):
        _started(name).clear()
    async with Worker([busy_parent, busy_kid], nats=nats_server.url, settings=settings):
        run_id = await client.start("busy_parent", mode, run_id=f"parent-{mode}", wait=True)
        child_id = f"{run_id}-c0"
        await wait_for(lambda: asyncio.sleep(0, _started(f"kid {kid}").is_set()), what="kid")
        if mode == "mid_step":
            await wait_for(lambda: asyncio.sleep(0, _started("parent").is_set()), what="parent")
        await client.cancel(run_id, "everything stops")
        await ended_cancelled(client, run_id)
        child_end = await ended_cancelled(client, child_id)
    assert run_id in child_end.reason
    assert failures(await events_of(client, child_id)) == [(0, "kid_work", "Cancelled")]
    if mode == "mid_step":
        assert failures(await events_of(client, run_id)) == [(1, "parent_work", "Cancelled")]
    starts = [e for e in await events_of(client, child_id) if isinstance(e, StepStarted)]
    assert len(starts) == 1  # the child's step ran once, and was not retried
