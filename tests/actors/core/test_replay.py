"""``replay_run`` on small hand-written histories: every way code and history can part, and
the ways they legitimately agree (a live frontier, a recorded failure, a cancel)."""

from __future__ import annotations

import asyncio

import msgspec

from sojourn.actors import Context, agent
from sojourn.actors.core.replay import replay_run
from sojourn.schemas.codec import to_raw
from sojourn.schemas.events import (
    CancelRequested,
    ErrorInfo,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
    WaitStarted,
)


class Order(msgspec.Struct):
    n: int


def one(n: int) -> int:
    return n + 1


def two(n: int) -> int:
    return n + 2


def history(*events: RunEvent, input: object = None) -> list[RunEvent]:
    return [
        RunStarted(run_id="r1", agent="a", input=to_raw({"n": 1} if input is None else input)),
        *events,
    ]


def done(p: int, name: str, value: object) -> list[RunEvent]:
    return [
        StepStarted(position=p, name=name, attempt=1),
        StepCompleted(position=p, name=name, attempt=1, result=to_raw(value)),
    ]


@agent("a")
async def steps(ctx: Context, order: Order) -> int:
    a = await ctx.step(one, order.n)
    b = await ctx.step(two, a)
    return b


def test_a_history_up_to_its_live_frontier_replays() -> None:
    result = replay_run(steps, history(*done(0, "one", 2)))
    assert result.ok and result.checked == 1 and result.describe() == "ok"


def test_a_finished_history_replays_to_its_end() -> None:
    result = replay_run(
        steps, history(*done(0, "one", 2), *done(1, "two", 4), RunCompleted(output=to_raw(4)))
    )
    assert result.ok and result.checked == 2


def test_a_renamed_step() -> None:
    result = replay_run(steps, history(*done(0, "first", 2)))
    assert result.describe() == (
        "diverges at position 0: recorded step 'first', code now calls step 'one'"
    )
    assert result.checked == 0


def test_code_that_finishes_before_history_does() -> None:
    @agent("a")
    async def short(ctx: Context, order: Order) -> int:
        return await ctx.step(one, order.n)

    result = replay_run(short, history(*done(0, "one", 2), *done(1, "two", 4)))
    assert result.describe() == "diverges at position 1: recorded step 'two', code now finishes"
    assert result.checked == 1


def test_code_that_raises_where_history_went_on() -> None:
    @agent("a")
    async def broken(ctx: Context, order: Order) -> int:
        await ctx.step(one, order.n)
        raise KeyError("oops")

    result = replay_run(broken, history(*done(0, "one", 2), *done(1, "two", 4)))
    assert not result.ok
    assert result.describe().startswith(
        "diverges at position 1: recorded step 'two', code now raises KeyError"
    )


def test_a_recorded_failure_the_code_does_not_catch_agrees_with_a_failed_run() -> None:
    err = ErrorInfo(type="ValueError", message="no")
    events = history(
        StepStarted(position=0, name="one", attempt=1),
        StepFailed(position=0, name="one", attempt=1, error=err),
        RunFailed(error=err),
    )
    assert replay_run(steps, events).ok


def test_a_completed_run_whose_code_now_fails_diverges() -> None:
    @agent("a")
    async def fails(ctx: Context, order: Order) -> int:
        await ctx.step(one, order.n)
        await ctx.step(two, 2)
        raise RuntimeError("new bug")

    events = history(*done(0, "one", 2), *done(1, "two", 4), RunCompleted(output=to_raw(4)))
    result = replay_run(fails, events)
    assert "code now raises RuntimeError: new bug" in result.describe()


def test_an_input_the_code_no_longer_accepts() -> None:
    result = replay_run(steps, history(*done(0, "one", 2), input={"n": "one"}))
    assert result.describe().startswith(
        "diverges at position 0: recorded the run's input, code now rejects it: ValidationError"
    )


def test_awaiting_something_outside_ctx_is_reported_not_hung() -> None:
    @agent("a")
    async def sleepy(ctx: Context, order: Order) -> int:
        await ctx.step(one, order.n)
        await asyncio.sleep(3600)
        return 0

    result = replay_run(sleepy, history(*done(0, "one", 2), *done(1, "two", 4)))
    assert not result.ok and "outside ctx" in result.describe()


def test_a_caught_divergence_is_still_one() -> None:
    @agent("a")
    async def sloppy(ctx: Context, order: Order) -> int:
        try:
            await ctx.step(two, order.n)
        except Exception:
            pass
        return 0

    result = replay_run(sloppy, history(*done(0, "one", 2)))
    assert (
        result.describe()
        == "diverges at position 0: recorded step 'one', code now calls step 'two'"
    )


def test_an_open_wait_and_a_cancel_are_frontiers() -> None:
    @agent("a")
    async def waits(ctx: Context, order: Order) -> int:
        await ctx.step(one, order.n)
        got = await ctx.wait_for("go")
        return int(got)

    parked = history(
        *done(0, "one", 2),
        WaitStarted(position=1, key="signal:go", signals=("go",)),
    )
    assert replay_run(waits, parked).ok
    assert replay_run(waits, [*parked, CancelRequested(reason="user")]).ok


def test_patch_markers_replay_on_either_branch() -> None:
    @agent("a")
    async def patched(ctx: Context, order: Order) -> int:
        if ctx.patched("use-two"):
            return await ctx.step(two, order.n)
        return await ctx.step(one, order.n)

    old = history(*done(0, "one", 2))
    new = history(
        ValueRecorded(position=0, kind="patch", value=to_raw("use-two")), *done(1, "two", 3)
    )
    assert replay_run(patched, old).ok
    assert replay_run(patched, new).ok
    assert replay_run(steps, new).describe() == (
        "diverges at position 0: recorded ctx.patched('use-two'), code now calls step 'one'"
    )
