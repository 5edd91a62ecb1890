"""A stop ends even when a cancel is swallowed on the way.

A cancel that lands while nats-py waits on a subscription's inner task can be lost there
(``asyncio.wait_for`` in Python 3.11 may return a result that raced the cancel); agent code
can swallow one too. ``sojourn dev`` then hung on SIGINT about once in fifteen stops under
load, waiting for the watchdog's loop. These tests swallow the cancel on purpose.

A stop also ends whatever became of the server: a ``sojourn worker`` process gets SIGTERM
after its nats-server was killed or frozen (issue 12).
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
from collections.abc import Coroutine
from typing import Any

import pytest

from sojourn.actors import Client, Context, Watchdog, Worker, agent
from sojourn.actors.worker.collector import YOUNG_THRESHOLD
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.health import Liveness
from tests.actors.ops.test_health import CliProc


async def ends(stop: Coroutine[Any, Any, None], deadline: float = 60.0) -> bool:
    """Whether ``stop`` finishes on its own within ``deadline`` seconds. Not ``wait_for``: its
    cancel on timeout would be one more cancel, and a stop that finishes after it counts as
    done. A stop still running at the deadline is cancelled until it ends."""
    task = asyncio.create_task(stop)
    done, _ = await asyncio.wait({task}, timeout=deadline)
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    return task in done


class SwallowingWatchdog(Watchdog):
    """A scan that waits on an inner task which swallows the first cancel and returns a
    result: how ``asyncio.wait_for`` inside nats-py can lose a cancel (the outer task is never
    told)."""

    scanning = asyncio.Event()
    swallowed = 0

    async def scan(self) -> dict[str, Liveness]:
        SwallowingWatchdog.scanning.set()
        return await asyncio.create_task(self._inner())

    async def _inner(self) -> dict[str, Liveness]:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if SwallowingWatchdog.swallowed:
                raise  # only the first one
            SwallowingWatchdog.swallowed += 1
        return {}


async def test_a_watchdog_stops_although_its_scan_swallowed_the_cancel(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    wd = await SwallowingWatchdog(nats=nats_server.url, settings=settings).start()
    await asyncio.wait_for(SwallowingWatchdog.scanning.wait(), 60)
    assert await ends(wd.stop()), "the stop waited for a loop that lost its cancel"
    assert SwallowingWatchdog.swallowed == 1


stubborn_started = asyncio.Event()
stubborn_tasks: list[asyncio.Task[Any]] = []


async def stubborn() -> str:
    """A step that ignores the first cancel (then gives up on the second)."""
    task = asyncio.current_task()
    assert task is not None
    stubborn_tasks.append(task)
    stubborn_started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(3600)
    return "never"


@agent("stubborn")
async def stubborn_agent(ctx: Context) -> str:
    return await ctx.step(stubborn)


async def test_a_worker_stops_within_its_grace_although_a_step_swallowed_the_cancel(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    worker = await Worker([stubborn_agent], nats=nats_server.url, settings=settings).start()
    try:
        await client.start("stubborn")
        await asyncio.wait_for(stubborn_started.wait(), 60)
        assert await ends(worker.stop(grace=0.5)), "the stop waited for the step"
    finally:
        for t in stubborn_tasks:
            t.cancel()  # the second cancel ends it
        await asyncio.gather(*stubborn_tasks, return_exceptions=True)


@pytest.mark.parametrize("fate", ["killed", "frozen"])
async def test_an_idle_worker_process_exits_on_sigterm_whatever_became_of_its_server(
    own_server: EmbeddedServer, settings: Settings, fate: str
) -> None:
    """Issue 12: an idle ``sojourn worker`` whose server had gone did not exit on SIGTERM
    within 6 s. Its "stopped" heartbeat waited 5 s for an ack that could not come, and closing
    the connection then wrote the heartbeat nats-py had buffered for the reconnect to the dead
    socket and raised (exit 1, with a traceback). A frozen (SIGSTOPped) server, which nothing
    has noticed yet, cost the 5 s and a 2 s flush."""
    worker = CliProc(
        "worker", "--app", "tests.apps.cli_agents", "--nats", own_server.url,
        "--prefix", settings.prefix, "--log-level", "debug",
    )  # fmt: skip
    try:
        await worker.line(re.compile(rb"ready; press Ctrl-C to stop\s*"))
        assert own_server.pid is not None
        if fate == "killed":
            own_server.kill()
            # Wait until the worker knows: it is reconnecting.
            await worker.line(re.compile(rb".*NATS \(.*\): .*(refused|EOF).*\s*"))
        else:
            os.kill(own_server.pid, signal.SIGSTOP)
        code, took = await worker.terminate(timeout=20)
        print(f"{fate} server: the worker exited {took:.2f}s after SIGTERM")
        assert code == 0, f"exit code {code} after {took:.2f}s:\n{worker.output}"
        assert "Traceback" not in worker.output, worker.output
        assert worker.output.rstrip().endswith("stopped"), worker.output
    finally:
        worker.kill()


@agent("idle")
async def idle_agent(ctx: Context) -> int:
    return 1


async def _leftovers(before: set[asyncio.Task[Any]], deadline: float = 30.0) -> list[str]:
    """The tasks started since ``before`` that are still alive after ``deadline`` seconds (or
    none, as soon as all have ended)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline
    while True:
        me = asyncio.current_task()
        alive = [t for t in asyncio.all_tasks() if t not in before and t is not me]
        if not alive or loop.time() > until:
            return [f"{t.get_name()}: {t.get_coro()!r}" for t in alive]
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_worker_stopped_or_killed_leaves_no_task_behind(
    nats_server: EmbeddedServer, settings: Settings, how: str
) -> None:
    before = set(asyncio.all_tasks())
    thresholds = gc.get_threshold()
    worker = await Worker([idle_agent], nats=nats_server.url, settings=settings).start()
    c = await Client.connect(nats_server.url, settings=settings)
    try:
        await c.start("idle", run_id="idle-1")
        assert await c.result("idle-1", timeout=60) == 1
    finally:
        await c.close()
    assert gc.get_threshold()[0] >= YOUNG_THRESHOLD  # tuned while it runs
    if how == "stop":
        await worker.stop()
    else:
        worker.kill()  # what SojournEnv.explore_crashes does to a worker
    assert await _leftovers(before) == []
    assert gc.get_threshold() == thresholds  # and put back


async def test_a_worker_whose_start_fails_leaves_no_task_behind(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    before = set(asyncio.all_tasks())
    worker = Worker([idle_agent], nats=nats_server.url, settings=settings)

    async def refused(*_: object) -> None:
        raise RuntimeError("the first beat is refused")

    worker.heartbeats.beat = refused  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError, match="first beat"):
        await worker.start()
    assert await _leftovers(before) == []
