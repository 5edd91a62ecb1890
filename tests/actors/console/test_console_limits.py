"""The console shows a run waiting for its slot of a shared rate limit (decision 0046), in a
real browser: its status, and on its timeline a wait for ``limit:<name>`` with the slot as
its deadline. The screenshot docs/img/console-limit.png is taken here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from sojourn.actors import Client, Context, Limit, Worker, agent, step
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from tests.actors.console.conftest import ADMIN_TOKEN, Browser, ReadSide
from tests.actors.console.test_console_browser import IMG, css, sign_in
from tests.actors.gateway.conftest import Files, GatewayProc, running_worker
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(240)


@step(limit="search-api")
async def search(query: str) -> str:
    return f"results for {query}"


@agent("metered", limits={"search-api": Limit(requests="1/min")})
async def metered(ctx: Context, query: str) -> str:
    return await ctx.step(search, query)


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [metered])
    try:
        yield w
    finally:
        await w.stop()


async def test_a_run_waiting_for_its_slot_shows_the_limit_and_the_slot(
    gateway: GatewayProc,
    worker: Worker,
    client: Client,
    read_side: ReadSide,
    chromium: Any,
) -> None:
    await client.start("metered", "first", run_id="m-1")
    assert await client.result("m-1", timeout=30) == "results for first"
    await client.start("metered", "second", run_id="m-2")  # its slot is a minute off

    async def parked() -> bool:
        try:
            st = await client.state("m-2")
        except RunNotFound:
            return False
        return st.waiting_on == ("limit:search-api",)

    await wait_for(parked, 30, what="m-2 waiting for its slot")
    b: Browser = chromium(gateway.url)
    await sign_in(b, ADMIN_TOKEN)
    await b.run(b.driver.get, b.base + "/ui/#/run/m-2")
    wait = "li[data-kind=wait]"
    await b.wait("the wait for the limit", lambda d: d.find_elements(*css(wait)))
    text = await b.text(wait)
    assert "limit:search-api" in text and "waiting" in text and "deadline" in text, text
    await b.wait(
        "the run's status",
        lambda d: d.find_elements(*css("[data-test=run-status] [data-status=waiting]")),
    )
    IMG.mkdir(parents=True, exist_ok=True)
    await b.run(b.driver.save_screenshot, str(IMG / "console-limit.png"))
