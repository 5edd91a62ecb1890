"""Virtual time in ``SojournEnv``: a run that waits days ends in a moment, its deadlines come
due in their order, ``ctx.now()`` and the history read the virtual clock, and the timers stay
durable (a worker restarted in the middle still has its run woken)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sojourn.actors import Agent, Context, RetryPolicy, agent, step
from sojourn.actors.testing import SojournEnv
from sojourn.actors.worker.worker import Worker
from sojourn.schemas.events import RunStarted, WaitCompleted
from tests.conftest import wait_for

DAY = 86_400.0


@agent("sleeper")
async def sleeper(ctx: Context, days: int) -> list[str]:
    before = ctx.now()
    await ctx.sleep(timedelta(days=days))
    after = ctx.now()
    return [before.isoformat(), after.isoformat()]


@agent("escalating")
async def escalating(ctx: Context, _: None) -> list[str]:
    """Waits three days for ``signed``, reminding after one and escalating after two."""
    seen: list[str] = []
    start = ctx.now()
    for label, days in (("reminder", 1), ("escalation", 2), ("gave up", 3)):
        left = start + timedelta(days=days) - ctx.now()
        got = await ctx.wait_for("signed", timeout=left, type=str)
        if got is not None:
            seen.append(f"signed by {got}")
            return seen
        seen.append(f"{label} at day {round((ctx.now() - start).total_seconds() / DAY)}")
    return seen


@agent("two_sleeps")
async def two_sleeps(ctx: Context, names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        await ctx.sleep(timedelta(hours=1 + i))
        out.append(f"{name}@{ctx.now().isoformat()}")
    return out


attempts: list[float] = []


@step(
    retry=RetryPolicy(
        retry_on=(RuntimeError,), attempts=3, initial_interval=3600.0, max_interval=3600.0, jitter=0
    )
)
async def flaky_call() -> str:
    attempts.append(time.time())
    if len(attempts) < 3:
        raise RuntimeError("not yet")
    return "done"


@step(retry=RetryPolicy(retry_on=(RuntimeError,), attempts=2, initial_interval=2.0, jitter=0))
async def flaky_briefly() -> str:
    attempts.append(time.time())
    if len(attempts) < 2:
        raise RuntimeError("not yet")
    return "done"


@agent("retrying")
async def retrying(ctx: Context, short: bool) -> str:
    return await ctx.step(flaky_briefly if short else flaky_call)


AGENTS: list[Agent[Any, Any]] = [sleeper, escalating, two_sleeps, retrying]


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return AGENTS


async def test_a_run_that_sleeps_three_days_ends_at_once_three_virtual_days_later(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    t0 = time.monotonic()
    run_id = await env.start(sleeper, 3)
    before, after = await env.result(run_id, type=list[str])
    slept = datetime.fromisoformat(after) - datetime.fromisoformat(before)
    assert timedelta(days=3) <= slept < timedelta(days=3, minutes=1)
    assert time.monotonic() - t0 < 60  # a hang guard: days were not waited for
    # The history's timestamps are on the same clock.
    events = await env.history(run_id)
    assert events[-1].at - events[0].at >= 3 * DAY
    assert env.now() >= datetime.fromisoformat(after)


async def test_deadlines_come_due_in_their_order_each_seeing_the_one_before(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    run_id = await env.start(escalating)
    assert await env.result(run_id, type=list[str]) == [
        "reminder at day 1",
        "escalation at day 2",
        "gave up at day 3",
    ]
    waits = [e for e in await env.history(run_id) if isinstance(e, WaitCompleted)]
    assert [w.outcome for w in waits] == ["timeout"] * 3


async def test_advance_moves_time_by_hand_and_a_signal_lands_between_deadlines(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    run_id = await env.start(escalating)
    await env.advance(timedelta(days=1, hours=12))  # the reminder fired, not the escalation
    state = await env.state(run_id)
    assert state.status == "waiting" and "signal:signed" in state.waiting_on
    await env.signal(run_id, "signed", "ada", wait=True)
    assert await env.result(run_id, type=list[str]) == ["reminder at day 1", "signed by ada"]


async def test_advance_fires_sleeps_one_after_the_other_at_their_own_times(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    start = env.now()
    run_id = await env.start(two_sleeps, ["a", "b"])
    await env.advance(timedelta(hours=4))
    out = await env.result(run_id, type=list[str])
    times = [datetime.fromisoformat(x.split("@")[1]) for x in out]
    assert timedelta(hours=1) <= times[0] - start < timedelta(hours=1, minutes=1)
    assert timedelta(hours=3) <= times[1] - start < timedelta(hours=3, minutes=1)


async def test_a_retry_backoff_of_an_hour_is_skipped_and_a_short_one_too(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    attempts.clear()
    run_id = await env.start(retrying, False)
    assert await env.result(run_id, type=str) == "done"
    assert len(attempts) == 3
    state = await env.state(run_id)
    (op,) = [o for o in state.ops if o.kind == "step"]
    assert op.attempts == 3
    attempts.clear()
    run_id = await env.start(retrying, True)  # backs off in the worker's process, on the clock
    assert await env.result(run_id, type=str) == "done"
    assert len(attempts) == 2


async def test_a_timer_survives_a_worker_restart_under_virtual_time(
    sojourn_server: Any,
) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    async with SojournEnv(AGENTS, server=sojourn_server, start_time=start) as env:
        assert env.now() >= start
        run_id = await env.start(sleeper, 2)
        await env.settle()
        assert (await env.state(run_id)).status == "waiting"
        # The worker goes; another comes: the run's timer is the broker's, kept meanwhile.
        await env.worker.stop()
        env._worker = Worker(AGENTS, nats=env.url, settings=env.settings, clock=env.clock)
        await env.worker.start()
        before, after = await env.result(run_id, type=list[str])
        assert datetime.fromisoformat(before) >= start
        slept = datetime.fromisoformat(after) - datetime.fromisoformat(before)
        assert timedelta(days=2) <= slept < timedelta(days=2, minutes=1)
        first = (await env.history(run_id))[0]
        assert isinstance(first, RunStarted) and first.at >= start.timestamp()


async def test_real_time_stays_real_without_virtual_time(sojourn_server: Any) -> None:
    async with SojournEnv([sleeper], server=sojourn_server, virtual_time=False) as env:
        assert env.clock is None
        with pytest.raises(RuntimeError, match="virtual time is off"):
            await env.advance(1)
        assert abs(env.now().timestamp() - time.time()) < 5


@agent("ticker")
async def ticker(ctx: Context, _: None) -> str:
    return ctx.now().isoformat()


@pytest.mark.parametrize("sojourn_agents", [[ticker]])
async def test_a_schedule_fires_on_virtual_time(sojourn_env: SojournEnv) -> None:
    env = sojourn_env
    record = await env.client.add_schedule("hourly", agent="ticker", every="1h")
    assert record.next_fire_at is not None
    until = env.now().timestamp() + 3.5 * 3600
    # Epoch-anchored: on each whole hour from the first fire on.
    expected = 1 + int((until - record.next_fire_at) // 3600)
    await env.advance(timedelta(hours=3, minutes=30))

    async def all_fired() -> bool:
        r = await env.client.schedule("hourly")
        return r is not None and r.counts.started >= expected

    await wait_for(all_fired, what=f"{expected} fires")
    await env.settle()
    r = await env.client.schedule("hourly")
    assert r is not None and r.counts.started == expected
    assert r.last_fire_at is not None and r.last_fire_at <= env.now().timestamp()
    assert r.next_fire_at is not None and r.next_fire_at > env.now().timestamp()


checks: list[datetime] = []


def job_status(job: str) -> str | None:
    checks.append(datetime.now(UTC))
    return f"{job}: done" if len(checks) == 3 else None


@agent("poller")
async def poller(ctx: Context, job: str) -> list[str]:
    start = ctx.now()
    out = await ctx.poll(job_status, job, every=timedelta(hours=1), backoff=2.0)
    return [out, str(round((ctx.now() - start).total_seconds() / 3600))]


@pytest.mark.parametrize("sojourn_agents", [[poller]])
async def test_a_polls_hourly_interval_is_skipped(sojourn_env: SojournEnv) -> None:
    checks.clear()
    run_id = await sojourn_env.start(poller, "job-7")
    # Checks at 0 h, 1 h and 1 + 2 = 3 h.
    assert await sojourn_env.result(run_id, type=list[str]) == ["job-7: done", "3"]
    assert len(checks) == 3
