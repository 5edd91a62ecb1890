"""Retries on a real nats-server: every failed attempt is a ``StepFailed`` with its ``retry_at``,
every backoff a broker timer, so a retry schedule is history, not process memory.

An in-process ``Worker`` serves the agents below, except for the crash test, which SIGKILLs
worker processes (``tests.apps.retry_agents``) during a backoff.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from sojourn.actors import (
    Client,
    Context,
    RetryableError,
    RetryPolicy,
    StepError,
    TerminalError,
    Worker,
    agent,
    current_step,
    step,
)
from sojourn.broker import EmbeddedServer
from sojourn.schemas import RunEvent, StepCompleted, StepFailed, StepStarted
from sojourn.schemas.config import Settings
from tests.conftest import wait_for
from tests.procs import WorkerProc

MODULE = "tests.apps.retry_agents"

calls: Counter[tuple[str, str]] = Counter()
"""(run id, step name) -> how many times its body ran."""


def _attempt() -> int:
    info = current_step()
    calls[(info.run_id, info.name)] += 1
    return info.attempt


FAST = RetryPolicy(retry_on=(ConnectionError,), attempts=4, initial_interval=0.2, jitter=0)


@step(retry=FAST)
def flaky() -> str:
    """Fails twice, then works."""
    attempt = _attempt()
    if attempt <= 2:
        raise ConnectionError(f"connection reset (attempt {attempt})")
    return f"ok on attempt {attempt}"


@step(retry=RetryPolicy(retry_on=(ConnectionError,), attempts=4, initial_interval=0.05, jitter=0))
def down() -> str:
    raise ConnectionError(f"still down (attempt {_attempt()})")


@step(retry=FAST)
def wrong_type() -> str:
    _attempt()
    raise ValueError("not a connection problem")


@step(
    retry=RetryPolicy(
        retry_on=(TerminalError, Exception), attempts=4, initial_interval=0.05, jitter=0
    )
)
def terminal() -> str:
    _attempt()
    raise TerminalError("card declined")


def throttled() -> str:
    """No policy at all: RetryableError alone asks for a retry."""
    attempt = _attempt()
    if attempt <= 2:
        raise RetryableError("429", retry_after=0.3)
    return f"ok on attempt {attempt}"


def throttled_down() -> str:
    _attempt()
    raise RetryableError("429", retry_after=0.05)


SLOW_POLICY = RetryPolicy(retry_on=(ConnectionError,), attempts=2, initial_interval=4.0, jitter=0)


@step(retry=SLOW_POLICY)
def retry_after_wins() -> str:
    """The policy would wait 4 s; the error says 0.2 s."""
    attempt = _attempt()
    if attempt == 1:
        raise RetryableError("429", retry_after=0.2)
    return f"ok on attempt {attempt}"


@step(retry=SLOW_POLICY)
def retry_after_capped() -> str:
    """RetryableError is retried within the policy's attempts (2 here, not the default 3)."""
    _attempt()
    raise RetryableError("429", retry_after=0.05)


@step(retry=RetryPolicy(retry_on=(ConnectionError,), attempts=2, initial_interval=1.0, jitter=0))
def backs_off() -> str:
    attempt = _attempt()
    if attempt == 1:
        raise ConnectionError("reset")
    return "ok"


CASES = {
    f.__name__: f
    for f in (
        flaky,
        down,
        wrong_type,
        terminal,
        throttled,
        throttled_down,
        retry_after_wins,
        retry_after_capped,
        backs_off,
    )
}


@agent("retrier")
async def retrier(ctx: Context, case: str) -> dict[str, Any]:
    try:
        return {"ok": await ctx.step(CASES[case])}
    except StepError as e:
        return {"error": e.error_type}


# --- an agent-level policy, overridden per step -----------------------------------------------


def plain_flaky() -> str:
    attempt = _attempt()
    if attempt == 1:
        raise ConnectionError("reset")
    return f"ok on attempt {attempt}"


def plain_down() -> str:
    _attempt()
    raise ConnectionError("down")


OVERRIDE = RetryPolicy(retry_on=(KeyError,), attempts=2, initial_interval=0.05, jitter=0)


@step(retry=OVERRIDE)
def override_connection() -> str:
    """The step's policy does not list ConnectionError: the agent's policy must not apply."""
    _attempt()
    raise ConnectionError("down")


@step(retry=OVERRIDE)
def override_key() -> str:
    _attempt()
    raise KeyError("missing")


@step(name="named_only")
def named_only() -> str:
    """Decorated, but without a policy of its own: the agent's applies."""
    attempt = _attempt()
    if attempt == 1:
        raise ConnectionError("reset")
    return "ok"


AGENT_CASES = {
    f.__name__: f for f in (plain_flaky, plain_down, override_connection, override_key, named_only)
}


@agent(
    "agent_policy",
    retry=RetryPolicy(retry_on=(ConnectionError,), attempts=3, initial_interval=0.05, jitter=0),
)
async def agent_policy(ctx: Context, case: str) -> dict[str, Any]:
    try:
        return {"ok": await ctx.step(AGENT_CASES[case])}
    except StepError as e:
        return {"error": e.error_type}


# --- helpers -----------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    w = Worker([retrier, agent_policy], nats=nats_server.url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


def attempts_of(events: list[RunEvent]) -> list[tuple[str, int, float | None]]:
    """``(kind, attempt, retry_at)`` of every step event, in order (``retry_at`` only for
    failures)."""
    out: list[tuple[str, int, float | None]] = []
    for e in events:
        if isinstance(e, StepStarted):
            out.append(("started", e.attempt, None))
        elif isinstance(e, StepFailed):
            out.append(("failed", e.attempt, e.retry_at))
        elif isinstance(e, StepCompleted):
            out.append(("completed", e.attempt, None))
    return out


def failures(events: list[RunEvent]) -> list[StepFailed]:
    return [e for e in events if isinstance(e, StepFailed)]


def kinds(events: list[RunEvent]) -> list[tuple[str, int]]:
    return [(k, a) for k, a, _ in attempts_of(events)]


async def run_case(client: Client, agent_name: str, case: str) -> tuple[str, Any]:
    run_id = await client.start(agent_name, case, wait=True)
    return run_id, await client.result(run_id, timeout=30)


CLOCKS = 0.002
"""Slack between a worker's monotonic sleep and wall-clock ``at`` stamps."""


# --- retry policies ----------------------------------------------------------------------------


async def test_fails_twice_then_succeeds_with_exponential_backoff(
    client: Client, worker: Worker
) -> None:
    run_id, out = await run_case(client, "retrier", "flaky")
    assert out == {"ok": "ok on attempt 3"}
    events = await events_of(client, run_id)
    assert kinds(events) == [
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("failed", 2),
        ("started", 3),
        ("completed", 3),
    ]
    f1, f2 = failures(events)
    assert f1.error.type == "ConnectionError" and "attempt 1" in f1.error.message
    assert f1.retry_at is not None and f2.retry_at is not None
    # retry_at - failure time follows initial_interval * backoff ** (attempt - 1), no jitter.
    assert abs((f1.retry_at - f1.at) - 0.2) < 0.05, f1.retry_at - f1.at
    assert abs((f2.retry_at - f2.at) - 0.4) < 0.05, f2.retry_at - f2.at
    starts = [e for e in events if isinstance(e, StepStarted)]
    # No attempt starts before its retry is due.
    assert starts[1].at >= f1.retry_at - CLOCKS
    assert starts[2].at >= f2.retry_at - CLOCKS
    assert calls[(run_id, "flaky")] == 3
    state = await client.state(run_id)
    assert state.status == "completed" and state.anomalies == ()
    op = state.op(0)
    assert op is not None and op.status == "completed" and op.attempts == 3


async def test_state_shows_waiting_for_the_retry_while_backing_off(
    client: Client, worker: Worker
) -> None:
    run_id = await client.start("retrier", "backs_off", wait=True)

    async def backing_off() -> bool:
        return (await client.state(run_id)).status == "waiting"

    await wait_for(backing_off, timeout=10, what="the run to wait for its retry")
    state = await client.state(run_id)
    assert state.waiting_on == ("retry:backs_off",)
    (failed,) = failures(await events_of(client, run_id))
    assert failed.retry_at is not None and state.deadline == failed.retry_at
    assert calls[(run_id, "backs_off")] == 1  # the second attempt is not due yet
    assert await client.result(run_id, timeout=30) == {"ok": "ok"}
    state = await client.state(run_id)
    assert state.status == "completed" and state.waiting_on == () and state.deadline is None
    assert calls[(run_id, "backs_off")] == 2


async def test_attempts_exhausted_is_a_step_error_and_the_last_failure_is_final(
    client: Client, worker: Worker
) -> None:
    run_id, out = await run_case(client, "retrier", "down")
    assert out == {"error": "ConnectionError"}
    events = await events_of(client, run_id)
    fails = failures(events)
    assert [f.attempt for f in fails] == [1, 2, 3, 4]
    assert all(f.retry_at is not None for f in fails[:3])
    assert fails[-1].retry_at is None
    assert kinds(events)[-1] == ("failed", 4)
    assert calls[(run_id, "down")] == 4
    state = await client.state(run_id)
    assert state.status == "completed"
    op = state.op(0)
    assert op is not None and op.status == "failed" and op.deadline is None


async def test_an_exception_not_in_retry_on_fails_at_once(client: Client, worker: Worker) -> None:
    run_id, out = await run_case(client, "retrier", "wrong_type")
    assert out == {"error": "ValueError"}
    events = await events_of(client, run_id)
    assert kinds(events) == [("started", 1), ("failed", 1)]
    assert failures(events)[0].retry_at is None
    assert calls[(run_id, "wrong_type")] == 1


async def test_terminal_error_fails_at_once_even_if_listed(client: Client, worker: Worker) -> None:
    run_id, out = await run_case(client, "retrier", "terminal")
    assert out == {"error": "TerminalError"}
    events = await events_of(client, run_id)
    assert kinds(events) == [("started", 1), ("failed", 1)]
    assert failures(events)[0].retry_at is None
    assert calls[(run_id, "terminal")] == 1


async def test_retryable_error_is_retried_after_retry_after_without_a_policy(
    client: Client, worker: Worker
) -> None:
    run_id, out = await run_case(client, "retrier", "throttled")
    assert out == {"ok": "ok on attempt 3"}
    events = await events_of(client, run_id)
    f1, f2 = failures(events)
    for f in (f1, f2):
        assert f.error.type == "RetryableError"
        assert f.retry_at is not None and abs((f.retry_at - f.at) - 0.3) < 0.05
    starts = [e for e in events if isinstance(e, StepStarted)]
    assert f1.retry_at is not None and f2.retry_at is not None
    assert starts[1].at >= f1.retry_at - CLOCKS
    assert starts[2].at >= f2.retry_at - CLOCKS
    assert calls[(run_id, "throttled")] == 3


async def test_retryable_error_without_a_policy_gets_three_attempts(
    client: Client, worker: Worker
) -> None:
    run_id, out = await run_case(client, "retrier", "throttled_down")
    assert out == {"error": "RetryableError"}
    fails = failures(await events_of(client, run_id))
    assert [(f.attempt, f.retry_at is None) for f in fails] == [(1, False), (2, False), (3, True)]
    assert calls[(run_id, "throttled_down")] == 3


async def test_retry_after_wins_over_the_policy_interval(client: Client, worker: Worker) -> None:
    run_id, out = await run_case(client, "retrier", "retry_after_wins")
    assert out == {"ok": "ok on attempt 2"}
    (f1,) = failures(await events_of(client, run_id))
    assert f1.retry_at is not None
    assert abs((f1.retry_at - f1.at) - 0.2) < 0.05, f1.retry_at - f1.at  # not the policy's 4 s


async def test_retryable_error_stays_within_the_policy_attempts(
    client: Client, worker: Worker
) -> None:
    run_id, out = await run_case(client, "retrier", "retry_after_capped")
    assert out == {"error": "RetryableError"}
    fails = failures(await events_of(client, run_id))
    assert [(f.attempt, f.retry_at is None) for f in fails] == [(1, False), (2, True)]
    assert calls[(run_id, "retry_after_capped")] == 2


async def test_agent_policy_applies_to_undecorated_steps(client: Client, worker: Worker) -> None:
    run_id, out = await run_case(client, "agent_policy", "plain_flaky")
    assert out == {"ok": "ok on attempt 2"}
    assert kinds(await events_of(client, run_id)) == [
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("completed", 2),
    ]
    run_id, out = await run_case(client, "agent_policy", "plain_down")
    assert out == {"error": "ConnectionError"}
    fails = failures(await events_of(client, run_id))
    assert [(f.attempt, f.retry_at is None) for f in fails] == [(1, False), (2, False), (3, True)]
    # A step decorated only to set its name still gets the agent's policy.
    run_id, out = await run_case(client, "agent_policy", "named_only")
    assert out == {"ok": "ok"}
    assert calls[(run_id, "named_only")] == 2


async def test_step_policy_overrides_the_agent_policy(client: Client, worker: Worker) -> None:
    # The step's policy replaces the agent's: ConnectionError is not in its retry_on.
    run_id, out = await run_case(client, "agent_policy", "override_connection")
    assert out == {"error": "ConnectionError"}
    assert kinds(await events_of(client, run_id)) == [("started", 1), ("failed", 1)]
    assert calls[(run_id, "override_connection")] == 1
    # ...and its attempts (2) count, not the agent's (3).
    run_id, out = await run_case(client, "agent_policy", "override_key")
    assert out == {"error": "KeyError"}
    fails = failures(await events_of(client, run_id))
    assert [(f.attempt, f.retry_at is None) for f in fails] == [(1, False), (2, True)]
    assert calls[(run_id, "override_key")] == 2


# --- a retry schedule survives a crash --------------------------------------------------------


def log_rows(log: Path) -> list[tuple[str, int, str, str, int]]:
    """``(event, pid, step, key, attempt)`` rows of ``tests.apps.retry_agents``'s log."""
    if not log.exists():
        return []
    rows = []
    for raw in log.read_text().splitlines():
        event, pid, name, key, attempt = raw.split()
        rows.append((event, int(pid), name, key, int(attempt)))
    return rows


async def test_retry_schedule_survives_sigkill_during_backoff(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    url = nats_server.url
    env = {"SOJOURN_TEST_LOG": str(log), "SOJOURN_RETRY_AFTER": "4"}
    first = WorkerProc(url, settings.prefix, MODULE, lease_ttl=2.0, **env)
    second: WorkerProc | None = None
    try:
        await first.ready()
        run_id = await client.start("throttled", 1, run_id="backoff-crash", wait=True)

        async def failed_with_retry_at() -> bool:
            return any(f.retry_at is not None for f in failures(await events_of(client, run_id)))

        await wait_for(failed_with_retry_at, timeout=20, what="the first attempt to fail")
        first.kill()  # mid-backoff: the worker was sleeping until retry_at
        (failed,) = failures(await events_of(client, run_id))
        assert failed.retry_at is not None and failed.retry_at > failed.at + 3.5
        second = WorkerProc(url, settings.prefix, MODULE, lease_ttl=2.0, **env)
        await second.ready()
        assert await asyncio.wait_for(client.result(run_id), 30) == [10, 20]
    finally:
        first.stop()
        if second is not None:
            second.stop()

    events = await events_of(client, run_id)
    starts = [e for e in events if isinstance(e, StepStarted) and e.name == "throttled"]
    assert [s.attempt for s in starts] == [1, 2]
    assert failed.retry_at is not None
    assert starts[1].at >= failed.retry_at - CLOCKS, starts[1].at - failed.retry_at
    done = [e for e in events if isinstance(e, StepCompleted) and e.name == "throttled"]
    assert [d.attempt for d in done] == [2]
    execs = [r for r in log_rows(log) if r[0] == "exec" and r[2] == "throttled"]
    assert [(pid, attempt) for _, pid, _, _, attempt in execs] == [
        (first.proc.pid, 1),
        (second.proc.pid, 2),
    ]
    assert (await client.state(run_id)).anomalies == ()
