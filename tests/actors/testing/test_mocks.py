"""``mock_step``: a step function replaced for a test, under its own name, its calls kept.

The stand-in records what ``current_step()`` says of each call (run, position, attempt,
idempotency key), keeps the step's name (the history reads as production's would) and its
``@step`` retry policy, and the original is back after the block."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from sojourn.actors import Agent, Context, RetryPolicy, agent, current_step, step
from sojourn.actors.testing import SojournEnv, mock_step
from sojourn.schemas.events import StepCompleted, StepFailed, StepStarted

SENT: list[str] = []


async def send_email(address: str, text: str) -> str:
    SENT.append(address)  # the real effect, which a test replaces
    return f"sent to {address}"


@step(retry=RetryPolicy(retry_on=(ConnectionError,), attempts=3, initial_interval=0.01))
async def charge(cents: int) -> int:
    raise AssertionError("the real charge never runs in these tests")


@agent("welcome_mocked")
async def welcome(ctx: Context, address: str) -> str:
    return await ctx.step(send_email, address, "welcome!")


@agent("charge_mocked")
async def charge_twice(ctx: Context, cents: int) -> int:
    return await ctx.step(charge, cents)


async def job_status(job: str) -> str | None:
    raise AssertionError("the real job service is never asked in these tests")


@agent("poller_mocked")
async def wait_for_job(ctx: Context, job: str) -> str:
    return await ctx.poll(job_status, job, every=0.05)


HERE = sys.modules[__name__]


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [welcome, charge_twice, wait_for_job]


async def test_a_stand_in_runs_in_the_steps_place_under_its_name(sojourn_env: SojournEnv) -> None:
    SENT.clear()
    with mock_step(HERE, "send_email", returns="queued") as sent:
        run_id = await sojourn_env.start(welcome, "ada@example.com")
        assert await sojourn_env.result(run_id) == "queued"
    assert SENT == []  # the real function never ran
    (call,) = sent.calls
    assert call.args == ("ada@example.com", "welcome!") and call.kwargs == {}
    assert (call.run_id, call.position, call.attempt) == (run_id, 0, 1)
    assert call.idempotency_key == f"{run_id}/0" and not call.in_doubt
    started = [e for e in await sojourn_env.history(run_id) if isinstance(e, StepStarted)]
    assert [e.name for e in started] == ["send_email"]
    assert HERE.send_email is sent.original  # put back


async def test_a_stand_in_keeps_the_steps_retry_policy(sojourn_env: SojournEnv) -> None:
    def flaky(cents: int) -> int:
        if current_step().attempt == 1:
            raise ConnectionError("card network down")
        return cents

    with mock_step(HERE, "charge", side_effect=flaky) as charged:
        run_id = await sojourn_env.start(charge_twice, 250)
        assert await sojourn_env.result(run_id) == 250
    assert [(c.attempt, c.idempotency_key) for c in charged.calls] == [
        (1, f"{run_id}/0"),
        (2, f"{run_id}/0"),
    ]
    events = await sojourn_env.history(run_id)
    assert [type(e) for e in events if isinstance(e, (StepFailed, StepCompleted))] == [
        StepFailed,
        StepCompleted,
    ]


async def test_a_stand_in_that_raises_fails_the_step_as_the_function_would(
    sojourn_env: SojournEnv,
) -> None:
    with mock_step(HERE, "send_email", raises=ValueError("no such mailbox")) as sent:
        run_id = await sojourn_env.start(welcome, "nobody@example.com")
        with pytest.raises(Exception, match="no such mailbox"):
            await sojourn_env.result(run_id)
    assert len(sent.calls) == 1


def test_mock_step_refuses_what_it_cannot_stand_in_for() -> None:
    with pytest.raises(AttributeError):
        mock_step(HERE, "no_such_function")
    with pytest.raises(ValueError):
        mock_step(HERE, "send_email", returns=1, raises=ValueError())
    m = mock_step(HERE, "send_email")
    with m, pytest.raises(RuntimeError):
        m.__enter__()
    assert HERE.send_email is m.original


async def test_a_polls_checks_are_steps_a_stand_in_answers(sojourn_env: SojournEnv) -> None:
    """``ctx.poll`` runs each check as a step: a stand-in answers "not yet" twice, then the
    job's result, and each check is a call of its own, at a position of its own."""
    answers = iter([None, None, "job-7: done"])
    with mock_step(HERE, "job_status", side_effect=lambda job: next(answers)) as status:
        run_id = await sojourn_env.start(wait_for_job, "job-7")
        assert await sojourn_env.result(run_id) == "job-7: done"
    assert [c.args for c in status.calls] == [("job-7",)] * 3
    assert len({c.position for c in status.calls}) == 3
    assert all(c.attempt == 1 for c in status.calls)
