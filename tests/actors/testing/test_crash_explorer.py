"""The crash explorer: an agent that keeps its effects in steps passes at every seam; one that
sends its welcome email outside a step fails, with the seam and the step named."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from sojourn.actors import Agent, Context, agent, current_step
from sojourn.actors.testing import CrashExplorationFailed, SojournEnv

sent: list[str] = []
"""The outside world: one entry per email the provider delivered (deduplicated by key)."""
keys: set[str] = set()


def send_email(to: str) -> str:
    """An email provider that deduplicates by idempotency key, as a real one does."""
    key = current_step().idempotency_key
    if key not in keys:
        keys.add(key)
        sent.append(f"welcome:{to}")
    return key


def send_unkeyed(to: str) -> None:
    sent.append(f"welcome:{to}")


def provision(to: str) -> str:
    key = current_step().idempotency_key
    if key not in keys:
        keys.add(key)
        sent.append(f"account:{to}")
    return f"acct-{to}"


@agent("explored_child")
async def explored_child(ctx: Context, to: str) -> str:
    return await ctx.step(provision, to)


@agent("good_onboarding")
async def good_onboarding(ctx: Context, to: str) -> dict[str, Any]:
    await ctx.step(send_email, to)
    signed = await ctx.wait_for("docs.signed", timeout=timedelta(days=3))
    account = await ctx.child("explored_child", to, type=str)
    await ctx.sleep(timedelta(days=1))
    return {"signed": signed, "account": account}


@agent("bad_onboarding")
async def bad_onboarding(ctx: Context, to: str) -> str:
    send_unkeyed(to)  # outside a step: runs again on every replay
    await ctx.step(provision, to)
    return "done"


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [good_onboarding, bad_onboarding, explored_child]


def effects() -> Counter[str]:
    return Counter(e.split(":")[0] for e in sent)


@pytest.mark.slow(27)
async def test_an_agent_with_every_effect_in_a_step_ends_alike_at_every_seam(
    sojourn_env: SojournEnv,
) -> None:
    sent.clear()
    keys.clear()
    result = await sojourn_env.explore_crashes(
        good_onboarding, "ada@example.com", signals={"docs.signed": "ada"}, effects=effects
    )
    print(result.summary())
    names = {s.name for s in result.seams}
    # The seams this flow passes: a step's effect, a recorded signal, a child's start,
    # replays, acks.
    assert {"after_step", "intake_recorded", "child_spawned", "before_ack"} <= names
    assert result.explored == len(result.seams) >= 8
    assert result.clean.status == "completed"
    assert result.clean.output == {"signed": "ada", "account": "acct-ada@example.com"}
    assert all(c.outcome == result.clean for c in result.crashes)


async def test_an_effect_outside_a_step_fails_the_exploration_naming_seam_and_step(
    sojourn_env: SojournEnv,
) -> None:
    sent.clear()
    keys.clear()
    with pytest.raises(CrashExplorationFailed) as failed:
        await sojourn_env.explore_crashes(bad_onboarding, "bo@example.com", effects=effects)
    text = str(failed.value)
    assert "crashed at after_step #1 (step 'provision' at position 0)" in text
    assert "effect 'welcome' happened 2 times, the clean run 1" in text
    assert "history:" in text and "StepStarted" in text


async def test_a_crashed_worker_is_replaced_at_once_so_what_arrives_meanwhile_is_served(
    sojourn_env: SojournEnv,
) -> None:
    # The explorer's kill at a seam: the worker dies where it stands. What the broker delivers
    # after that (here a start; in an exploration a timer firing or a redelivery) waits for a
    # worker; a wait for quiet that looked only at the dead one would wait forever.
    from sojourn.actors.testing.explorer import _Driver

    env = sojourn_env
    dead = env.worker
    _Driver(env, {}, None, 30.0).crash()
    run_id = await env.client.start("explored_child", "zoe@example.com")
    await env.settle(timeout=30.0)
    assert env.worker is not dead and dead.executing == 0
    assert await env.result(run_id, type=str) == "acct-zoe@example.com"


@agent("busy_forever")
async def busy_forever(ctx: Context, _: None) -> None:
    await ctx.step(never_returns)


async def never_returns() -> None:
    await asyncio.Event().wait()


async def test_a_deployment_that_never_quiets_fails_settle_naming_what_is_busy(
    sojourn_server: Any,
) -> None:
    async with SojournEnv([busy_forever], server=sojourn_server) as env:
        await env.start(busy_forever)
        with pytest.raises(TimeoutError, match=r"within 2 s: .*1 run\(s\) executing"):
            await env.settle(timeout=2.0)


async def test_an_exploration_whose_run_never_ends_fails_within_its_timeout(
    sojourn_server: Any,
) -> None:
    # Every wait of an explored run is under its timeout, the waits for quiet included.
    async with SojournEnv([busy_forever], server=sojourn_server) as env:
        with pytest.raises(TimeoutError, match=r"run clean-\S+ did not end within 3 s"):
            await env.explore_crashes(busy_forever, timeout=3.0)
