"""Per-step timeouts, ``@step(timeout=...)``: an attempt past it fails with ``StepTimeout`` (a
``TimeoutError``), retried as the step's policy says; an async one is cancelled, a sync one
abandoned."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from sojourn.actors import (
    Client,
    Context,
    RetryPolicy,
    RunFailedError,
    Worker,
    agent,
    current_step,
    step,
)
from sojourn.actors.worker.interrupt import StepGuard, StepInterrupted
from sojourn.broker import EmbeddedServer
from sojourn.schemas import RunEvent, StepCompleted, StepFailed, StepTimeout
from sojourn.schemas.config import Settings

attempts: list[int] = []


@step(timeout=0.3, retry=RetryPolicy(retry_on=(TimeoutError,), attempts=3, initial_interval=0.05))
async def flaky_upstream() -> str:
    n = current_step().attempt
    attempts.append(n)
    if n < 3:
        await asyncio.sleep(60)  # hangs: cut off by the timeout
    return f"answered on attempt {n}"


@agent("times_out_then_works")
async def times_out_then_works(ctx: Context, _: None) -> str:
    return await ctx.step(flaky_upstream)


@step(timeout=timedelta(milliseconds=300))
async def always_hangs() -> str:
    attempts.append(current_step().attempt)
    await asyncio.sleep(60)
    return "never"


@agent("times_out_for_good")
async def times_out_for_good(ctx: Context, _: None) -> str:
    return await ctx.step(always_hangs)


release = threading.Event()


@step(timeout=0.3)
def hangs_in_a_thread() -> str:
    release.wait(60)
    return "late"


@agent("sync_times_out")
async def sync_times_out(ctx: Context, _: None) -> str:
    return await ctx.step(hangs_in_a_thread)


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


def failed(events: list[RunEvent]) -> list[StepFailed]:
    return [e for e in events if isinstance(e, StepFailed)]


async def test_a_step_past_its_timeout_fails_and_retries_per_its_policy(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    attempts.clear()
    async with Worker([times_out_then_works], nats=nats_server.url, settings=settings):
        run_id = await client.start("times_out_then_works", None, wait=True)
        assert await client.result(run_id, timeout=30) == "answered on attempt 3"
    assert attempts == [1, 2, 3]
    events = await events_of(client, run_id)
    assert [(e.attempt, e.error.type) for e in failed(events)] == [
        (1, "StepTimeout"),
        (2, "StepTimeout"),
    ]
    assert all(e.retry_at is not None for e in failed(events))
    assert "timeout of 0.3s" in failed(events)[0].error.message
    assert [e.attempt for e in events if isinstance(e, StepCompleted)] == [3]


async def test_without_a_policy_a_timed_out_step_fails_for_good(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    attempts.clear()
    async with Worker([times_out_for_good], nats=nats_server.url, settings=settings):
        run_id = await client.start("times_out_for_good", None, wait=True)
        with pytest.raises(RunFailedError, match="StepTimeout"):
            await client.result(run_id, timeout=30)
    assert attempts == [1]
    events = await events_of(client, run_id)
    assert [(e.attempt, e.error.type, e.retry_at) for e in failed(events)] == [
        (1, "StepTimeout", None)
    ]
    assert "was cancelled" in failed(events)[0].error.message


async def test_a_sync_step_past_its_timeout_is_abandoned(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    release.clear()
    try:
        async with Worker([sync_times_out], nats=nats_server.url, settings=settings):
            run_id = await client.start("sync_times_out", None, wait=True)
            with pytest.raises(RunFailedError, match="StepTimeout"):
                await client.result(run_id, timeout=30)
    finally:
        release.set()
    (only,) = failed(await events_of(client, run_id))
    assert only.error.type == "StepTimeout"
    assert "abandoned" in only.error.message and "discarded" in only.error.message


def test_step_timeout_is_a_timeout_error_and_must_be_positive() -> None:
    assert issubclass(StepTimeout, TimeoutError)
    for bad in (0, -1, timedelta(0), float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            step(timeout=bad)


async def test_the_guard_alone_bounds_and_interrupts_a_call() -> None:
    """``StepGuard`` without a server: a result, a timeout, an interrupt, a step's error."""
    guard = StepGuard()

    async def quick(x: int) -> int:
        return x + 1

    async def slow() -> None:
        await asyncio.sleep(60)

    def boom() -> None:
        raise KeyError("k")

    assert await guard.run(quick, (1,), {}) == 2
    with pytest.raises(StepTimeout):
        await guard.run(slow, (), {}, timeout=0.05)
    with pytest.raises(KeyError):
        await guard.run(boom, (), {})
    task = asyncio.ensure_future(guard.run(slow, (), {}))
    await asyncio.sleep(0)  # the attempt is in flight once the task has begun
    assert guard.in_flight == 1
    assert guard.interrupt("the run was cancelled") == 1

    with pytest.raises(StepInterrupted) as caught:
        await task
    assert caught.value.error.type == "Cancelled"
    assert guard.in_flight == 0
