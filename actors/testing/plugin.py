"""sojourn's pytest plugin: a deployment per test on one nats-server per test process.

Installed with sojourn and loaded by pytest itself (the ``pytest11`` entry point ``sojourn``),
it offers three fixtures:

- ``sojourn_server`` (session): one ``EmbeddedServer`` per test process, so one per
  pytest-xdist worker, with its store in a fresh temporary directory; stopped and the
  directory removed at the end of the session.
- ``sojourn_agents`` (function): the agents ``sojourn_env`` serves; ``[]`` here, overridden by
  a fixture of the same name in a test module or a ``conftest.py``.
- ``sojourn_env`` (function, async): a ``SojournEnv`` serving ``sojourn_agents`` on
  ``sojourn_server``, with a deployment prefix of its own, entered for the test and exited
  after it.

A test module::

    import pytest
    from sojourn.actors.testing import SojournEnv
    from myapp.agents import greeter

    @pytest.fixture
    def sojourn_agents():
        return [greeter]

    @pytest.mark.asyncio
    async def test_greets(sojourn_env: SojournEnv) -> None:
        run_id = await sojourn_env.start(greeter, {"name": "Ada"})
        assert await sojourn_env.result(run_id, type=str) == "Hello, Ada!"

``sojourn_env`` runs in the event loop pytest-asyncio gives async fixtures by default
(``asyncio_default_fixture_loop_scope``, the fixture's own scope when unset); a test in a loop
of another scope (``@pytest.mark.asyncio(loop_scope=...)``) should make its own ``SojournEnv``.

When ``$SOJOURN_TEST_PIDFILE`` names a file, ``sojourn_server`` appends a line
``<pid> <store dir>`` to it for each server it starts: how a harness running pytest in a
subprocess checks that nothing outlived the session.

The module imports pytest, and pytest-asyncio when it is installed (without it, pytest and
every other test still work, and a test asking for ``sojourn_env`` fails saying what it
needs); sojourn itself is imported when a fixture is first used, so that loading the plugin
costs a session that does not use it nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

try:  # the async fixture needs it; a project without it keeps a working pytest
    import pytest_asyncio
except ImportError:
    pytest_asyncio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from sojourn.broker import EmbeddedServer

    from ..agents.agent import Agent
    from .env import SojournEnv

__all__ = ["PIDFILE_ENV", "sojourn_agents", "sojourn_env", "sojourn_server"]

PIDFILE_ENV: Final = "SOJOURN_TEST_PIDFILE"
"""The environment variable naming the file ``sojourn_server`` records its servers in."""

SERVER_PREFIX: Final = "sojourn-server-"
"""The name prefix of the session server's temporary store directory."""

_START_TIMEOUT: Final = 60.0
_STOP_TIMEOUT: Final = 30.0


class HostedServer:
    """An ``EmbeddedServer`` owned by an event loop of its own, in a thread of its own.

    This is why ``sojourn_server`` is a synchronous fixture that works in every pytest-asyncio
    configuration. An ``EmbeddedServer`` belongs to the loop that started it: that loop
    reaps the process and copies its output to the log (a pipe nobody reads fills up and
    blocks the server). A session-scoped async fixture would need a session-scoped loop, which
    pytest-asyncio's default settings do not give (each test gets a loop of its own), and
    that loop runs only while a session-loop test or fixture runs: the server's output would
    go unread in between. A loop running in a daemon thread for the whole session has neither
    problem, and the server is still sojourn's own ``EmbeddedServer`` (version check, config,
    readiness, ``die_with_parent``, the atexit kill) rather than a second launcher.

    The thread is the server's parent thread for Linux's ``PR_SET_PDEATHSIG``: it outlives
    the server, which ``stop()`` stops before it ends the thread.
    """

    def __init__(self) -> None:
        self.store_dir = Path(tempfile.mkdtemp(prefix=SERVER_PREFIX))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sojourn-test-server", daemon=True
        )
        self._server: EmbeddedServer | None = None
        # The session may end without the fixture's teardown (a second Ctrl-C): this is the
        # last word. Registered before the server starts, so it runs after the broker's own
        # atexit kill (handlers run last registered first).
        atexit.register(self._last_resort)

    def start(self) -> EmbeddedServer:
        """Start the thread's loop and the server on it; return the running server."""
        from sojourn.broker import EmbeddedServer

        self._thread.start()
        server = EmbeddedServer(store_dir=self.store_dir, port=0)
        self._server = server
        self._call(server.start(), _START_TIMEOUT)
        return server

    def stop(self) -> None:
        """Kill the server (and reap it), then stop the loop and its thread, and remove the
        store directory. A kill, not a graceful stop: the store is removed next, so nothing in
        it needs flushing, and a session's thousands of streams take a graceful stop tens of
        seconds to close."""
        try:
            server = self._server
            if server is not None and self._thread.is_alive():
                server.kill()
                self._call(server.stop(), _STOP_TIMEOUT)  # reaps the killed process
        finally:
            if self._thread.is_alive():
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(_STOP_TIMEOUT)
            if not self._thread.is_alive() and not self._loop.is_closed():
                self._loop.close()
            shutil.rmtree(self.store_dir, ignore_errors=True)
            atexit.unregister(self._last_resort)

    def _call(self, coro: Any, timeout: float) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            future.result(timeout)
        except BaseException:
            future.cancel()  # a KeyboardInterrupt while waiting: stop the coroutine too
            raise

    def _last_resort(self) -> None:
        if self._server is not None:
            self._server.kill()
        shutil.rmtree(self.store_dir, ignore_errors=True)


def _record(server: EmbeddedServer) -> None:
    path = os.environ.get(PIDFILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{server.pid} {server.store_dir}\n")


@pytest.fixture(scope="session")
def sojourn_server() -> Iterator[EmbeddedServer]:
    """One nats-server with JetStream for this test process (each xdist worker has its own),
    on a free loopback port, its store in a temporary directory; killed and removed at the
    end of the session. ``HostedServer`` says why this fixture is synchronous."""
    hosted = HostedServer()
    try:
        server = hosted.start()
        _record(server)
        yield server
    finally:
        hosted.stop()


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    """The agents ``sojourn_env``'s worker serves: none here. Override this fixture in a test
    module or a ``conftest.py`` to list yours."""
    return []


async def _sojourn_env(
    sojourn_agents: list[Agent[Any, Any]], sojourn_server: EmbeddedServer
) -> AsyncIterator[SojournEnv]:
    """A ``SojournEnv`` serving ``sojourn_agents`` on ``sojourn_server`` under a prefix of its
    own, entered for the test and exited after it (worker stopped, client closed)."""
    from .env import SojournEnv

    async with SojournEnv(sojourn_agents, server=sojourn_server) as env:
        yield env


def _sojourn_env_needs_pytest_asyncio() -> None:
    """``sojourn_env`` without pytest-asyncio installed: the test fails saying so."""
    pytest.fail(
        "the sojourn_env fixture is async and needs pytest-asyncio: pip install pytest-asyncio",
        pytrace=False,
    )


sojourn_env: Any = (
    pytest.fixture(_sojourn_env_needs_pytest_asyncio, name="sojourn_env")
    if pytest_asyncio is None
    else pytest_asyncio.fixture(_sojourn_env, name="sojourn_env")
)
"""The ``sojourn_env`` fixture (see ``_sojourn_env``); without pytest-asyncio, one that fails
the test that asks for it, while every other test of the session runs as usual."""
