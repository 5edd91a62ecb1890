"""End-to-end runs on a real nats-server: exact histories and replay."""

from __future__ import annotations

import msgspec
import pytest

from sojourn.actors import Agent, Client, Context, StepError, Worker, agent, current_step
from sojourn.broker import EmbeddedServer
from sojourn.schemas import (
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)
from sojourn.schemas.config import Settings


class Order(msgspec.Struct, frozen=True):
    item: str
    qty: int


class Receipt(msgspec.Struct, frozen=True):
    lines: list[str]
    keys: list[str]


def line(item: str, i: int) -> str:
    return f"{item}#{i}"


def key() -> str:
    return current_step().idempotency_key


def make_steps_agent(n: int) -> Agent[Order, Receipt]:
    @agent("steps")
    async def steps(ctx: Context, order: Order) -> Receipt:
        lines, keys = [], []
        for i in range(n):
            lines.append(await ctx.step(line, order.item, i))
            keys.append(await ctx.step(key))
        return Receipt(lines=lines, keys=keys)

    return steps


async def test_n_step_run_has_exactly_the_expected_history(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    n = 5
    async with Worker([make_steps_agent(n)], nats=nats_server.url, settings=settings):
        run_id = await client.start("steps", Order(item="tea", qty=2), run_id="exact-1", wait=True)
        result = await client.result(run_id, timeout=30, type=Receipt)

    assert result.lines == [f"tea#{i}" for i in range(n)]
    assert result.keys == [f"exact-1/{2 * i + 1}" for i in range(n)]
    history = await client.history(run_id)
    events = [e for d in history for e in d.events]
    kinds = [type(e).__name__ for e in events]
    expected = ["RunStarted"]
    for _ in range(2 * n):
        expected += ["StepStarted", "StepCompleted"]
    expected += ["RunCompleted"]
    assert kinds == expected
    # One append per step: the run's RunStarted goes out with the first step's start
    # (worker/opening.py), and completion k shares a message with start k+1.
    assert len(history) == 1 + 2 * n
    assert [type(e).__name__ for e in history[0].events] == ["RunStarted", "StepStarted"]
    assert [d.seq for d in history] == sorted(d.seq for d in history)
    started = [e for e in events if isinstance(e, StepStarted)]
    assert [e.position for e in started] == list(range(2 * n))
    assert all(e.attempt == 1 for e in started)
    assert isinstance(events[0], RunStarted) and events[0].agent == "steps"
    done = [e for e in events if isinstance(e, StepCompleted)]
    assert [msgspec.json.decode(bytes(e.result)) for e in done][:2] == ["tea#0", "exact-1/1"]
    final = events[-1]
    assert isinstance(final, RunCompleted)
    assert msgspec.json.decode(bytes(final.output), type=Receipt) == result
    assert await client.status(run_id) == "completed"


async def test_journaled_values_replay_identically(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    seen: list[tuple[str, str, float]] = []

    def noop() -> None:
        return None

    @agent("values")
    async def values(ctx: Context, _: None) -> list[str]:
        now, uid, rnd = ctx.now(), ctx.uuid(), ctx.random()
        seen.append((now.isoformat(), str(uid), rnd))
        await ctx.step(noop)
        return [now.isoformat(), str(uid), repr(rnd)]

    async with Worker([values], nats=nats_server.url, settings=settings):
        run_id = await client.start("values", None, wait=True)
        out = await client.result(run_id, timeout=30)
    history = await client.history(run_id)
    recorded = [e for d in history for e in d.events if isinstance(e, ValueRecorded)]
    assert [e.kind for e in recorded] == ["now", "uuid", "random"]
    assert [e.position for e in recorded] == [0, 1, 2]
    assert out == [seen[0][0], seen[0][1], repr(seen[0][2])]


async def test_step_failure_is_recorded_and_fails_the_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    @agent("fails")
    async def fails(ctx: Context, x: int) -> int:
        return await ctx.step(boom, x)

    async with Worker([fails], nats=nats_server.url, settings=settings):
        run_id = await client.start("fails", 7, wait=True)
        with pytest.raises(Exception, match="bad 7") as info:
            await client.result(run_id, timeout=30)
    assert type(info.value).__name__ == "RunFailedError"
    events = [e for d in await client.history(run_id) for e in d.events]
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert len(failed) == 1 and failed[0].error.type == "ValueError"
    assert isinstance(events[-1], RunFailed)
    assert events[-1].error.type == "StepError"
    assert await client.status(run_id) == "failed"


async def test_caught_step_error_lets_the_run_continue(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    def flaky() -> str:
        raise RuntimeError("nope")

    def fallback() -> str:
        return "fallback"

    @agent("recovers")
    async def recovers(ctx: Context, _: None) -> str:
        try:
            return await ctx.step(flaky)
        except StepError as e:
            assert e.error_type == "RuntimeError"
            return await ctx.step(fallback)

    async with Worker([recovers], nats=nats_server.url, settings=settings):
        run_id = await client.start("recovers", None, wait=True)
        assert await client.result(run_id, timeout=30) == "fallback"


async def test_nondeterminism_parks_the_run_and_keeps_history(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    import asyncio

    gate = asyncio.Event()

    def first() -> int:
        return 1

    async def wait_gate() -> int:
        await gate.wait()
        return 2

    @agent("drift")
    async def v1(ctx: Context, _: None) -> int:
        await ctx.step(first)
        return await ctx.step(wait_gate)

    def other() -> int:
        return 3

    @agent("drift")
    async def v2(ctx: Context, _: None) -> int:
        return await ctx.step(other)  # position 0 was recorded as 'first'

    from tests.conftest import wait_for

    w1 = Worker([v1], nats=nats_server.url, settings=settings)
    await w1.start()
    run_id = await client.start("drift", None, wait=True)

    async def second_step_started() -> bool:
        st = await client.state(run_id)
        return len(st.ops) == 2

    await wait_for(second_step_started, what="the second step to start")
    await w1.stop(grace=0.1)  # a "deploy": the run is interrupted mid-step
    before = await client.history(run_id)
    async with Worker([v2], nats=nats_server.url, settings=settings):

        async def suspended() -> bool:
            return await client.status(run_id) == "suspended"

        await wait_for(suspended, what="the run to be parked")
    gate.set()
    state = await client.state(run_id)
    assert state.suspended_reason == "nondeterminism"
    assert "recorded as step 'first'" in (state.suspended_detail or "")
    assert "'other'" in (state.suspended_detail or "")
    after = await client.history(run_id)
    assert [d.events for d in after[: len(before)]] == [d.events for d in before]
    assert len(after) == len(before) + 1  # only the suspension was added


async def test_graceful_stop_records_finished_steps_before_leaving(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """A deploy stops a worker while a run waits between steps: the finished step is recorded,
    so the next worker does not run it again."""
    import asyncio

    from tests.conftest import wait_for

    counts: dict[str, int] = {"first": 0}

    def first() -> str:
        counts["first"] += 1
        return "one"

    def second() -> str:
        return "two"

    @agent("deploy")
    async def before(ctx: Context, _: None) -> str:
        await ctx.step(first)
        await asyncio.sleep(3600)  # not a step: the completion of `first` is still buffered
        return "unreachable"

    @agent("deploy")
    async def after(ctx: Context, _: None) -> str:
        a = await ctx.step(first)
        return a + await ctx.step(second)

    w1 = Worker([before], nats=nats_server.url, settings=settings, flush_delay=3600)
    await w1.start()
    run_id = await client.start("deploy", None, wait=True)

    async def first_ran() -> bool:
        return counts["first"] == 1

    await wait_for(first_ran, what="the first step to run")
    await w1.stop(grace=0.1)
    async with Worker([after], nats=nats_server.url, settings=settings):
        assert await client.result(run_id, timeout=30) == "onetwo"
    assert counts["first"] == 1


async def test_idempotency_headers_carry_the_step_key(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    from sojourn.actors import idempotency_headers

    def call_api() -> dict[str, str]:
        return idempotency_headers()

    @agent("http")
    async def http(ctx: Context, _: None) -> dict[str, str]:
        await ctx.step(line, "x", 0)
        return await ctx.step(call_api)

    async with Worker([http], nats=nats_server.url, settings=settings):
        run_id = await client.start("http", None, run_id="idem-1", wait=True)
        assert await client.result(run_id, timeout=30) == {"Idempotency-Key": "idem-1/1"}
    with pytest.raises(RuntimeError, match="only available inside"):
        idempotency_headers()
