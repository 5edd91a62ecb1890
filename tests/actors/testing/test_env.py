"""``SojournEnv`` and the plugin's ``sojourn_env``: an agent tested end to end, typed; and an
environment that leaves nothing behind, however its block ends."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sojourn.actors import Agent, Context, agent
from sojourn.actors.testing import SojournEnv
from sojourn.broker import EmbeddedServer
from sojourn.schemas.events import (
    RunCompleted,
    RunStarted,
    SignalReceived,
    StepCompleted,
    WaitCompleted,
)
from tests.conftest import wait_for


class Order(msgspec.Struct, frozen=True):
    item: str
    qty: int


def price(order: Order) -> int:
    return 3 * order.qty


@agent("approve_order")
async def approve_order(ctx: Context, order: Order) -> str:
    """Prices the order, then waits for the signal ``approve`` (who approves it)."""
    total = await ctx.step(price, order)
    who = await ctx.wait_for("approve", type=str)
    return f"{order.item} x{order.qty} = {total}, approved by {who}"


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [approve_order]


async def test_an_agent_with_a_step_and_a_signal(sojourn_env: SojournEnv) -> None:
    env = sojourn_env
    run_id = await env.start(approve_order, Order(item="tea", qty=2))

    async def waiting() -> bool:
        return (await env.state(run_id)).waiting_on == ("signal:approve",)

    await wait_for(waiting, what="the run to wait for approve")
    await env.signal(run_id, "approve", "ada")
    assert await env.result(run_id, type=str) == "tea x2 = 6, approved by ada"

    history = await env.history(run_id)
    assert isinstance(history[0], RunStarted)
    assert history[0].agent == "approve_order"
    steps = [e for e in history if isinstance(e, StepCompleted)]
    assert [(s.name, msgspec.json.decode(s.result)) for s in steps] == [("price", 6)]
    assert any(isinstance(e, SignalReceived) and e.name == "approve" for e in history)
    waits = [e for e in history if isinstance(e, WaitCompleted)]
    assert [(w.key, w.signal, msgspec.json.decode(w.payload)) for w in waits] == [
        ("signal:approve", "approve", "ada")
    ]
    assert isinstance(history[-1], RunCompleted)

    state = await env.state(run_id)
    assert state.status == "completed"
    assert state.steps_completed == 1
    assert state.agent == "approve_order"


async def test_the_env_of_a_test_has_a_prefix_of_its_own(
    sojourn_env: SojournEnv, sojourn_server: EmbeddedServer
) -> None:
    assert sojourn_env.url == sojourn_server.url
    assert sojourn_env.server is None  # shared: the env neither owns nor stops it
    async with SojournEnv([approve_order], server=sojourn_server.url) as other:
        assert other.settings.prefix != sojourn_env.settings.prefix
        run_id = await other.start("approve_order", Order(item="pen", qty=1), run_id="r1")
        assert run_id == "r1"
        assert await sojourn_env.history("r1") == []  # another deployment's run
    assert sojourn_server.running


def _gone(pid: int) -> bool:
    """Whether no nats-server runs as ``pid`` (a zombie's command line is empty)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return b"nats-server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True


class Boom(Exception):
    pass


@pytest.mark.usefixtures("processes")
async def test_an_exception_leaves_no_server_and_no_directory() -> None:
    seen: list[tuple[int, Path]] = []
    with pytest.raises(Boom):
        async with SojournEnv([approve_order]) as env:
            assert env.server is not None and env.server.pid is not None
            assert env.store_dir is not None and env.store_dir.is_dir()
            seen.append((env.server.pid, env.store_dir))
            await env.start(approve_order, Order(item="cup", qty=1))
            raise Boom
    [(pid, store)] = seen
    assert _gone(pid)
    assert not store.exists()


@pytest.mark.usefixtures("processes")
async def test_a_cancellation_leaves_no_server_and_no_directory() -> None:
    seen: list[tuple[int, Path]] = []
    entered = asyncio.Event()

    async def body() -> None:
        async with SojournEnv([approve_order]) as env:
            assert env.server is not None and env.server.pid is not None
            assert env.store_dir is not None
            seen.append((env.server.pid, env.store_dir))
            run_id = await env.start(approve_order, Order(item="cup", qty=1))
            entered.set()
            await env.result(run_id)  # waits for a signal nobody sends

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [(pid, store)] = seen
    assert _gone(pid)
    assert not store.exists()


@pytest.mark.usefixtures("processes")
async def test_a_failed_start_leaves_nothing_behind() -> None:
    env = SojournEnv([approve_order], server="nats://127.0.0.1:1")  # nothing listens there
    with pytest.raises(Exception):  # noqa: B017 - whatever the connect raises
        await env.__aenter__()
    with pytest.raises(RuntimeError, match="not entered"):
        _ = env.client


async def test_the_env_is_usable_only_inside_its_block() -> None:
    env = SojournEnv([approve_order])
    with pytest.raises(RuntimeError, match="not entered"):
        _ = env.worker
    with pytest.raises(RuntimeError, match="not entered"):
        _ = env.url
