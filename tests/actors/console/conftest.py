"""The console's deployment per test: a real ``sojourn gateway`` process (named admin and
client tokens), an in-process worker, projector and listing service on the session's
nats-server; and headless Chromium (Debian's, driven by Selenium through
``/usr/bin/chromedriver``) for the browser tests."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.broker import EmbeddedServer, Names
from sojourn.projections.listing import ListingService
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.config import Settings
from tests.actors.console import agents
from tests.actors.gateway.conftest import Files, GatewayProc, running_worker, start_gateway

ADMIN_TOKEN = "console-admin-token-0123456789"
CLIENT_TOKEN = "console-client-token-0123456789"
ADMIN_NAME = "ada"
CLIENT_NAME = "bob"

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

T = TypeVar("T")


@pytest.fixture
def files(tmp_path: Path) -> Files:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"{ADMIN_TOKEN} admin {ADMIN_NAME}\n{CLIENT_TOKEN} client {CLIENT_NAME}\n",
        encoding="utf-8",
    )
    keys = tmp_path / "keys"
    keys.write_text(generate_key_file_text("k1"))
    return Files(tokens, keys)


@pytest_asyncio.fixture
async def gateway(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[GatewayProc]:
    g = await start_gateway(nats_server, settings, files)
    try:
        yield g
    finally:
        g.stop()


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [agents.refunds])
    try:
        yield w
    finally:
        await w.stop()


@dataclass
class ReadSide:
    projector: Projector
    listing: ListingService


@pytest_asyncio.fixture
async def read_side(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> AsyncIterator[ReadSide]:
    names = Names(settings.prefix)
    model = await SqliteModel.open(tmp_path / "m.sqlite3", events_stream=names.events_stream)
    projector = Projector(nats=nats_server.url, settings=settings, sink=model, interval=0.2)
    await projector.start()
    listing = ListingService(client.broker, names, model)
    await listing.start()
    try:
        yield ReadSide(projector, listing)
    finally:
        await listing.stop()
        await projector.stop()
        await model.close()


@pytest_asyncio.fixture
async def anonymous(gateway: GatewayProc) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client with no credentials: it signs in, and keeps the cookie it is given."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as c:
        yield c


class Browser:
    """A headless Chromium; every call runs in a thread, so the test's event loop (the
    worker, the projector) keeps running while the browser waits."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def wait(self, what: str, predicate: Callable[[Any], Any], timeout: float = 60) -> Any:
        """``predicate(driver)`` once it is truthy; an element the page re-rendered meanwhile
        (stale) or has not drawn yet is looked for again."""
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
            TimeoutException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        def waiting() -> Any:
            try:
                return WebDriverWait(
                    self.driver,
                    timeout,
                    poll_frequency=0.1,
                    ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
                ).until(predicate)
            except TimeoutException:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None

        return await self.run(waiting)

    async def text(self, selector: str) -> str:
        """The text of the first element ``selector`` matches, once there is one."""

        def found(d: Any) -> str | None:
            text: str = d.find_element("css selector", selector).text
            return text if text else None

        return str(await self.wait(selector, found))

    async def texts(self, selector: str) -> list[str]:
        def found(d: Any) -> list[str]:
            return [e.text for e in d.find_elements("css selector", selector)]

        return list(await self.wait(selector, found))

    async def click(self, selector: str) -> None:
        def clicked(d: Any) -> bool:
            d.find_element("css selector", selector).click()
            return True

        await self.wait(f"{selector} to click", clicked)


@pytest.fixture
def chromium(processes: None) -> Iterator[Callable[[str], Browser]]:
    """Makes browsers (headless Chromium and its chromedriver: processes); each is quit at the
    end. Skipped only when Debian's ``chromium`` and ``chromium-driver`` are not installed
    (``.ci/run`` installs them)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()) and not (
        shutil.which("chromium") and shutil.which("chromedriver")
    ):
        why = (
            "the browser tests need Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run installs them)"
        )
        if os.environ.get("SOJOURN_REQUIRE_BROWSER"):
            pytest.fail(why)  # CI installed them: a missing browser is a failure there
        pytest.skip(why)
    selenium = pytest.importorskip("selenium", reason="the test extra installs selenium")
    del selenium
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    made: list[Any] = []

    def make(base: str) -> Browser:
        options = webdriver.ChromeOptions()
        options.binary_location = (
            CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
        )
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            "--no-first-run",
            "--disable-extensions",
        ):
            options.add_argument(arg)
        driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        driver.set_page_load_timeout(60)
        made.append(driver)
        return Browser(driver, base)

    yield make
    for d in made:
        d.quit()
