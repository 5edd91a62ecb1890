"""Running the gateway's ASGI app with uvicorn inside a process that owns its signals.

``sojourn gateway`` and ``sojourn dev`` stop on SIGINT/SIGTERM through their own handler
(the CLI's ``StopSignal``), so uvicorn's signal capture is turned off and the server is told to
exit instead. The socket is bound here, before uvicorn starts, so port 0 picks a free port whose
number is known and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from sojourn.schemas.errors import SojournError

__all__ = ["GatewayServer"]

GRACE = 5.0
"""Seconds open requests (event streams never end by themselves) get when the gateway stops."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process's own handler stops the gateway (``GatewayServer.stop``)


class GatewayServer:
    """The app served on ``host:port`` until ``stop``."""

    def __init__(self, app: Starlette, host: str, port: int, *, log_level: str = "warning") -> None:
        self._sock = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
        )
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise SojournError(
                f"the gateway cannot listen on {host}:{port}: {e.strerror}"
            ) from None
        self._sock.listen(2048)
        self._sock.setblocking(False)
        bound: Any = self._sock.getsockname()
        self.host = host
        self.port = int(bound[1])
        config = uvicorn.Config(
            app,
            lifespan="on",
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=int(GRACE),
            server_header=False,
            loop="none",
        )
        self._app = app
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        """Serve; return the URL once the app's startup (its broker connection) is done.

        Raises:
            SojournError: the app did not start (the reason is in the log).
        """
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                with contextlib.suppress(BaseException):
                    self._task.result()
                self._sock.close()
                raise SojournError("the gateway did not start (see the log above)")
            await asyncio.sleep(0.02)
        return self.url

    async def stop(self) -> None:
        """End the event streams (their clients reconnect elsewhere with ``Last-Event-ID``),
        stop accepting, give open requests ``GRACE`` seconds, close the app's client."""
        closing = getattr(self._app.state, "closing", None)
        if isinstance(closing, asyncio.Event):
            closing.set()
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        self._sock.close()
