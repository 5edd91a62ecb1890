"""The MCP sessions a worker process holds: one per declared server, opened on first use,
reopened after it was lost, closed when the worker stops (``sojourn.actors.integrations.mcp``).

A session is a process resource, never journaled: what a run records is each tool call's
result. Its transport (a stdio server process, or a streamable-HTTP connection) and its
``ClientSession`` are async context managers of anyio, which must be entered and left by one
task: each session has a task of its own that holds them open until the session is closed or
its server goes away.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from sojourn.broker.tasks import cancel_and_wait

from ..worker.tasks import on_stop

if TYPE_CHECKING:
    from .mcp import McpServer

__all__ = ["OPEN_TIMEOUT", "Session", "Sessions", "sessions"]

log = logging.getLogger("sojourn.mcp")

OPEN_TIMEOUT = 30.0
"""Seconds a server may take to start and answer ``initialize``."""

CLOSE_GRACE = 5.0
"""Seconds a session's task has to close its transport (a stdio server is then killed)."""


class Session:
    """One open session: the ``ClientSession`` and the task that holds it open."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: ClientSession | None = None
        self._opened: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._task = asyncio.create_task(self._hold(), name=f"sojourn-mcp {server.name}")

    @property
    def alive(self) -> bool:
        return not self._task.done() and not self._closing.is_set()

    async def opened(self) -> ClientSession:
        async with asyncio.timeout(OPEN_TIMEOUT):
            return await asyncio.shield(self._opened)

    async def _hold(self) -> None:
        try:
            async with _transport(self.server) as (read, write), ClientSession(read, write) as c:
                await c.initialize()
                self.client = c
                self._opened.set_result(c)
                await self._closing.wait()
        except BaseException as e:
            if not self._opened.done():
                self._opened.set_exception(e if isinstance(e, Exception) else ConnectionError())
            if not isinstance(e, Exception):
                raise
            log.info("MCP server %r: session ended: %r", self.server.name, e)

    async def close(self) -> None:
        self._closing.set()
        if not self._opened.done():
            self._task.cancel()
        await asyncio.wait([self._task], timeout=CLOSE_GRACE)  # a clean close first
        await cancel_and_wait(self._task, CLOSE_GRACE)


def _transport(server: McpServer) -> AbstractAsyncContextManager[Any]:
    if server.url is not None:
        return _http(server.url)
    assert server.command is not None
    command, *args = server.command
    params = StdioServerParameters(
        command=command,
        args=list(args),
        env=dict(server.env) if server.env is not None else None,
        cwd=server.cwd,
    )
    return stdio_client(params)


@asynccontextmanager
async def _http(url: str) -> AsyncIterator[Any]:
    async with streamable_http_client(url) as streams:
        yield streams[0], streams[1]


class Sessions:
    """The open sessions of one event loop (a worker's), by server name."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, server: McpServer) -> Session:
        """The open session of ``server`` (opened now if it has none, or its last one ended,
        or a different server was declared under its name)."""
        lock = self._locks.setdefault(server.name, asyncio.Lock())
        async with lock:
            s = self._open.get(server.name)
            if s is not None and s.alive and s.server == server:
                return s
            if s is not None:
                await s.close()
            s = Session(server)
            self._open[server.name] = s
        try:
            await s.opened()
        except BaseException:
            await self.drop(s)
            raise
        return s

    async def drop(self, session: Session) -> None:
        """Close ``session`` (its server went away mid-call): the next call opens another."""
        if self._open.get(session.server.name) is session:
            del self._open[session.server.name]
        await session.close()

    async def close(self) -> None:
        """Close every session (a stdio server's process ends with it)."""
        open_, self._open = list(self._open.values()), {}
        await asyncio.gather(*(s.close() for s in open_))

    def __len__(self) -> int:
        return len(self._open)


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Sessions] = (
    weakref.WeakKeyDictionary()
)


def sessions() -> Sessions:
    """The sessions of the running event loop (the worker's)."""
    loop = asyncio.get_running_loop()
    s = _BY_LOOP.get(loop)
    if s is None:
        s = _BY_LOOP[loop] = Sessions()
        on_stop(s.close)  # a stopping worker closes them (its stdio servers end)
    return s


async def close_loop_sessions() -> None:
    """Close the running loop's sessions, if any were opened."""
    s = _BY_LOOP.get(asyncio.get_running_loop())
    if s is not None:
        await s.close()
