"""Shared fixtures: one real nats-server per test session, an isolated deployment per test.

Every test gets its own subject/stream prefix, so tests share the server but never each
other's streams. Fault tests that kill, freeze or restart the server start their own
(``own_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings

ROOT = Path(__file__).resolve().parent.parent


@pytest_asyncio.fixture(scope="session")
async def nats_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(store_dir=tmp_path_factory.mktemp("nats"), port=0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A nats-server of the test's own, to kill (``kill()``, then ``start()`` again on the same
    store and port), freeze (SIGSTOP its ``pid``) or stop; stopped at the end, thawed first."""
    server = EmbeddedServer(store_dir=tmp_path / "nats", port=0)
    await server.start()
    try:
        yield server
    finally:
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)
        await server.stop()


@pytest.fixture(autouse=True)
def _no_worker_process_outlives_its_test() -> Iterator[None]:
    yield
    from tests.procs import reap_strays  # tests.procs imports this module

    reap_strays()


@pytest.fixture
def settings() -> Settings:
    """A fresh deployment prefix per test, with a short lease so take-overs are quick."""
    return Settings(prefix=f"t{uuid.uuid4().hex[:10]}", lease_ttl=2.0)


@pytest_asyncio.fixture
async def client(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Client]:
    c = await Client.connect(nats_server.url, settings=settings)
    try:
        yield c
    finally:
        await c.close()


async def wait_for(
    predicate: Callable[[], Awaitable[bool]],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll an async predicate until it holds; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await predicate():
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def subprocess_env(**extra: str) -> dict[str, Any]:
    """Environment for child Python processes: the repo root importable (for tests.apps)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


PYTHON = sys.executable
