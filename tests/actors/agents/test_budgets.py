"""Budgets of every kind (issue 13): a looping agent is stopped by each limit, suspended with
the limit named, and raising the limit (``Client.set_budget``, ``sojourn budget``) resumes it
where it stopped, running no completed step again."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections import Counter

import msgspec
import pytest
from prometheus_client import REGISTRY

from sojourn.actors import (
    Budget,
    Client,
    Context,
    Worker,
    agent,
    current_step,
    step,
)
from sojourn.actors.core.state import RunState
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import BudgetChanged, RunResumed, RunSuspended, StepCompleted
from sojourn.schemas.vocabulary import BUDGET_LIMITS
from tests.actors.worker.test_bad_input import send_raw
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

DONE: Counter[int] = Counter()
"""How often each iteration's step really ran (the worker runs in this process)."""


@step(kind="llm")
def think(i: int) -> int:
    """A stand-in for a model request: 10 input and 5 output tokens, one cent."""
    DONE[i] += 1
    current_step().charge(input_tokens=10, output_tokens=5, usd=0.01, requests=1, model="m")
    return i


def act(i: int) -> int:
    DONE[1000 + i] += 1
    return i


@agent("looper")
async def looper(ctx: Context, n: int) -> int:
    """Each turn: one model request, then one tool call."""
    total = 0
    for i in range(n):
        total += await ctx.step(think, i)
        total += await ctx.step(act, i)
    return total


CHECKS: Counter[str] = Counter()


def never_done(job: str) -> None:
    CHECKS[job] += 1


@agent("poller")
async def poller(ctx: Context, job: str) -> str:
    await ctx.poll(never_done, job, every=0.01, backoff=1.0)
    return "never"


@agent("sleeper")
async def sleeper(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step(act, 500 + i)
        await ctx.sleep(0.2)
    return n


async def suspension(client: Client, run_id: str, after: int = 0) -> RunSuspended:
    """Wait for the run's ``after + 1``-th suspension and return it."""

    got: list[RunSuspended] = []

    async def suspended() -> bool:
        with contextlib.suppress(RunNotFound):
            state = await client.state(run_id)
            events = [e for d in await client.history(run_id) for e in d.events]
            found = [e for e in events if isinstance(e, RunSuspended)]
            if state.status == "suspended" and len(found) > after:
                got.append(found[after])
                return True
        return False

    await wait_for(suspended, 60, what=f"suspension {after + 1} of run {run_id}")
    return got[0]


def breaches(limit: str) -> float:
    labels = {"agent": "looper", "limit": limit}
    return REGISTRY.get_sample_value("sojourn_budget_breaches_total", labels) or 0.0


# Each turn charges 15 tokens (10 in, 5 out) and 0.01 usd with its model request, then makes a
# tool call. Each limit is checked before every step: a spending limit used up by the 3rd
# model request stops the 3rd tool call (5 steps done); 6 steps stop the 4th model request; 3
# tool calls stop the 4th tool call (the 4th model request runs: 7 steps done).
LIMITS = [
    ("usd", Budget(usd=0.03), 5),
    ("tokens", Budget(tokens=45), 5),
    ("input_tokens", Budget(input_tokens=30), 5),
    ("output_tokens", Budget(output_tokens=15), 5),
    ("steps", Budget(steps=6), 6),
    ("tool_calls", Budget(tool_calls=3), 7),  # the 4th model request runs, its tool call not
]


@pytest.mark.parametrize(("limit", "budget", "steps_done"), LIMITS, ids=[x[0] for x in LIMITS])
async def test_each_limit_suspends_the_loop_naming_it_and_a_raise_resumes_it(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    limit: str,
    budget: Budget,
    steps_done: int,
) -> None:
    DONE.clear()
    before = breaches(limit)
    async with Worker([looper], nats=nats_server.url, settings=settings):
        run_id = await client.start("looper", 5, budget=budget, wait=True)
        first = await suspension(client, run_id)
        assert first.reason == "budget" and first.limit == limit, first
        assert f"budget {limit} used up" in first.detail
        assert f"--{limit.replace('_', '-')}" in first.detail
        state = await client.state(run_id)
        assert state.steps_completed == steps_done
        assert breaches(limit) == before + 1

        # Raise the limit well past what 5 turns need: the run resumes where it stopped.
        doubled = msgspec.structs.replace(budget, **{limit: getattr(budget, limit) * 4})
        await client.set_budget(run_id, doubled)
        assert await client.result(run_id, timeout=60) == 2 * sum(range(5))

    assert all(n == 1 for n in DONE.values()), DONE  # nothing ran twice
    assert len(DONE) == 10
    events = [e for d in await client.history(run_id) for e in d.events]
    changed = [e for e in events if isinstance(e, BudgetChanged)]
    assert len(changed) == 1 and getattr(changed[0].budget, limit) == getattr(doubled, limit)
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert len(resumed) == 1 and not resumed[0].grant
    final = await client.state(run_id)
    assert final.budget is not None and getattr(final.budget, limit) == getattr(doubled, limit)


async def test_usage_is_recorded_with_each_step_and_folded_into_the_runs_spending(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    DONE.clear()
    async with Worker([looper], nats=nats_server.url, settings=settings):
        run_id = await client.start("looper", 4, wait=True)
        assert await client.result(run_id, timeout=60) == 2 * sum(range(4))
    events = [e for d in await client.history(run_id) for e in d.events]
    done = [e for e in events if isinstance(e, StepCompleted)]
    charged = [e.usage for e in done if e.usage is not None]
    assert len(charged) == 4 and all(u.input_tokens == 10 and u.model == "m" for u in charged)
    s: RunState = await client.state(run_id)
    assert (s.spent_input_tokens, s.spent_output_tokens, s.spent_tokens) == (40, 20, 60)
    assert s.spent_usd == pytest.approx(0.04)
    assert (s.step_attempts, s.model_calls, s.tool_calls) == (8, 4, 4)


async def test_a_poll_budget_suspends_the_poll_naming_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    CHECKS.clear()
    job = f"job-{time.time_ns()}"
    async with Worker([poller], nats=nats_server.url, settings=settings):
        run_id = await client.start("poller", job, budget=Budget(polls=3), wait=True)
        got = await suspension(client, run_id)
        assert got.limit == "polls" and "budget polls used up: 3 of 3" in got.detail
        assert CHECKS[job] == 3
        await client.set_budget(run_id, Budget(polls=5))
        again = await suspension(client, run_id, after=1)
        assert again.limit == "polls"
        assert CHECKS[job] == 5
        await client.cancel(run_id)


async def test_a_wall_time_budget_suspends_the_run_at_its_next_step(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    DONE.clear()
    async with Worker([sleeper], nats=nats_server.url, settings=settings):
        run_id = await client.start("sleeper", 1000, budget=Budget(wall_seconds=1.0), wait=True)
        got = await suspension(client, run_id)
        assert got.limit == "wall_seconds" and "budget wall_seconds used up" in got.detail
        state = await client.state(run_id)
        assert got.at - state.started_at >= 1.0
        ran = sum(1 for k in DONE if k >= 500)
        assert 1 <= ran < 1000
        await client.set_budget(run_id, Budget(wall_seconds=3600.0))

        async def ran_on() -> bool:
            return sum(1 for k in DONE if k >= 500) > ran

        await wait_for(ran_on, 60, what="the run to go on after its wall budget was raised")
        await client.cancel(run_id)
    assert all(n == 1 for n in DONE.values()), DONE


@agent("capped", budget=Budget(steps=2, usd=100.0))
async def capped(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step(act, 2000 + i)
    return n


async def test_a_start_replaces_the_agents_limits_one_by_one(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    DONE.clear()
    async with Worker([capped], nats=nats_server.url, settings=settings):
        own = await client.start("capped", 3, wait=True)
        got = await suspension(client, own)
        assert got.limit == "steps" and "2 of 2" in got.detail
        wider = await client.start("capped", 3, budget=Budget(steps=10), wait=True)
        assert await client.result(wider, timeout=60) == 3
        state = await client.state(wider)
        assert state.budget == Budget(steps=10, usd=100.0)  # the agent's usd stays
        await client.cancel(own)


async def test_hostile_budgets_are_refused_before_anything_is_recorded(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([capped], nats=nats_server.url, settings=settings):
        for body in (
            b'{"input": 1, "budget": {"usdd": 5}}',  # a misspelt limit is no limit: refused
            b'{"input": 1, "budget": {"usd": -1}}',
            b'{"input": 1, "budget": {"steps": 0}}',
            b'{"input": 1, "budget": {"usd": 1e300}}',
            b'{"input": 1, "budget": {"steps": 1.5}}',
            b'{"input": 1, "budget": []}',
        ):
            run_id = f"hostile-{time.time_ns()}"
            subject = client.names.start("capped", None, run_id)
            answer = await send_raw(client.broker, subject, body)
            assert answer["error"]["code"] == "invalid_trigger", (body, answer)  # type: ignore[index]
            with pytest.raises(RunNotFound):
                await client.state(run_id)
        # and a budget change on a live run with nothing in it, or a wrong body
        run_id = await client.start("capped", 5, wait=True)
        await suspension(client, run_id)
        for body, code in (
            (b"{}", "invalid_trigger"),
            (b'{"steps": "many"}', "invalid_trigger"),
            (b"not json", "invalid_json"),  # refused before any decoder, with its own code
            (b'{"wall_seconds": NaN}', "invalid_json"),
        ):
            answer = await send_raw(client.broker, client.names.budget(run_id, "ops"), body)
            assert answer["error"]["code"] == code, (body, answer)  # type: ignore[index]
        assert (await client.state(run_id)).status == "suspended"
        with pytest.raises(ValueError):
            await client.set_budget(run_id, Budget())
        await client.cancel(run_id)


async def test_sojourn_budget_raises_a_limit_from_the_command_line(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    DONE.clear()
    async with Worker([capped], nats=nats_server.url, settings=settings):
        run_id = await client.start("capped", 4, wait=True)
        await suspension(client, run_id)
        base = [PYTHON, "-m", "sojourn.actors.cli", "budget", run_id]
        opts = ["--nats", nats_server.url, "--prefix", settings.prefix]

        def cli_run(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*base, *opts, *extra],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                cwd=ROOT,
            )

        bad = await asyncio.to_thread(cli_run, "--steps", "0")
        assert bad.returncode == 2 and "must be > 0" in bad.stderr
        none = await asyncio.to_thread(cli_run)
        assert none.returncode != 0 and "at least one limit" in none.stderr
        cli = await asyncio.to_thread(cli_run, "--steps", "4")
        assert cli.returncode == 0, cli.stderr
        assert "steps 4 (used 2)" in cli.stdout and "resumes with the new limits" in cli.stdout
        assert await client.result(run_id, timeout=60) == 4


def test_every_limit_has_a_test_or_a_reason() -> None:
    tested = {x[0] for x in LIMITS} | {"polls", "wall_seconds"}
    assert tested == set(BUDGET_LIMITS)


@agent("relay")
async def relay(ctx: Context, turn: int) -> int:
    """A conversation that starts over in a fresh run after every turn."""
    await ctx.step(think, 3000 + turn)
    if turn < 100:
        ctx.continue_as_new(turn + 1)
    return turn


async def test_a_chain_is_held_to_one_budget_across_continue_as_new(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    DONE.clear()
    async with Worker([relay], nats=nats_server.url, settings=settings):
        first = await client.start("relay", 0, budget=Budget(steps=4, usd=10.0), wait=True)

        async def fourth_suspended() -> bool:
            with contextlib.suppress(RunNotFound):
                current = await client.current_run(first)
                state = await client.state(current)
                return state.status == "suspended"
            return False

        await wait_for(fourth_suspended, 60, what="the chain to use up its steps")
        current = await client.current_run(first)
        state = await client.state(current)
        assert state.suspended_reason == "budget" and "steps used up: 4 of 4" in (
            state.suspended_detail or ""
        )
        assert state.carried is not None and state.carried.steps == 4
        assert state.carried.usd == pytest.approx(0.04)
        assert sorted(DONE) == [3000, 3001, 3002, 3003]  # four turns, four runs, one budget
