"""An operator's pause: a run holds at its next step (the step in flight finishes and is
recorded), stays held across a worker's death, and goes on from there on unpause; a pause
lifted before the run reached a step costs nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from sojourn.actors import Agent, Context, agent
from sojourn.actors.testing import SojournEnv
from sojourn.schemas.events import PauseLifted, PauseRequested, RunResumed, RunSuspended
from tests.conftest import wait_for

ran: Counter[str] = Counter()
in_step = asyncio.Event()
release = asyncio.Event()


async def slow(name: str) -> str:
    ran[name] += 1
    in_step.set()
    await release.wait()
    return name


def quick(name: str) -> str:
    ran[name] += 1
    return name


@agent("pausable")
async def pausable(ctx: Context, _: None) -> list[str]:
    out = [await ctx.step(quick, "a"), await ctx.step(slow, "b")]
    got = await ctx.wait_for("go", type=str)
    out.append(await ctx.step(quick, got))
    return out


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [pausable]


@pytest.fixture(autouse=True)
def fresh() -> None:
    ran.clear()
    in_step.clear()
    release.clear()


async def suspended(env: SojournEnv, run_id: str) -> bool:
    st = await env.state(run_id)
    return st.status == "suspended" and st.suspended_reason == "manual"


async def test_a_run_paused_mid_step_records_the_step_and_holds_until_unpaused(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    run_id = await env.start(pausable)
    await asyncio.wait_for(in_step.wait(), 30)
    await env.client.pause(run_id, "investigating", by="ops")
    release.set()
    await env.signal(run_id, "go", "c", wait=True)
    await wait_for(lambda: suspended(env, run_id), what="the run held")
    await env.settle()
    state = await env.state(run_id)
    assert [op.status for op in state.ops] == ["completed", "completed", "completed"]
    assert ran == Counter({"a": 1, "b": 1})  # the step after the wait did not run
    (held,) = [e for e in await env.history(run_id) if isinstance(e, RunSuspended)]
    assert held.reason == "manual" and "paused by ops: investigating" in held.detail
    # A worker that dies (and another that comes) changes nothing: the run stays held.
    dead = env.worker
    dead.kill()
    await env._replace_worker(dead)
    await env.settle()
    assert await suspended(env, run_id) and ran["c"] == 0
    await env.client.unpause(run_id, by="ops")
    assert await env.result(run_id) == ["a", "b", "c"]
    assert ran == Counter({"a": 1, "b": 1, "c": 1})
    kinds = [type(e) for e in await env.history(run_id)]
    assert kinds.count(PauseRequested) == 1 and kinds.count(RunResumed) == 1


async def test_a_pause_lifted_before_the_next_step_lets_the_run_go_on(
    sojourn_env: SojournEnv,
) -> None:
    env = sojourn_env
    release.set()
    run_id = await env.start(pausable)
    await wait_for(lambda: _waiting_for_go(env, run_id), what="the run waiting for go")
    await env.client.pause(run_id, by="ops")
    await env.client.pause(run_id, by="ops")  # twice: one pause
    await wait_for(lambda: _paused(env, run_id), what="the pause recorded")
    await env.client.unpause(run_id, by="ops")
    await wait_for(lambda: _unpaused(env, run_id), what="the pause lifted")
    await env.signal(run_id, "go", "c", wait=True)
    assert await env.result(run_id) == ["a", "b", "c"]
    events = await env.history(run_id)
    assert [type(e) for e in events if isinstance(e, (PauseRequested, PauseLifted))] == [
        PauseRequested,
        PauseLifted,
    ]
    assert not any(isinstance(e, RunSuspended) for e in events)


async def _waiting_for_go(env: SojournEnv, run_id: str) -> bool:
    return "signal:go" in (await env.state(run_id)).waiting_on


async def _paused(env: SojournEnv, run_id: str) -> bool:
    return (await env.state(run_id)).pause is not None


async def _unpaused(env: SojournEnv, run_id: str) -> bool:
    return any(isinstance(e, PauseLifted) for e in await env.history(run_id))


async def test_a_pause_of_an_ended_run_is_refused_by_the_cli(
    sojourn_env: SojournEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    from sojourn.actors.cli import main

    env = sojourn_env
    release.set()
    run_id = await env.start(pausable)
    await env.signal(run_id, "go", "c")
    await env.result(run_id)
    args = ["--nats", env.url, "--prefix", env.settings.prefix, run_id]
    code = await asyncio.to_thread(main, ["pause", *args])
    assert code != 0 and "has ended" in capsys.readouterr().err
    code = await asyncio.to_thread(main, ["unpause", *args])
    assert code != 0 and "not paused" in capsys.readouterr().err
