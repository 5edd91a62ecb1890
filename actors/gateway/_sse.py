"""Server-sent events (the WHATWG ``text/event-stream`` format) from an async iterator.

An event stream may be idle for hours (a run waiting on a human): a comment line every
``keepalive`` seconds keeps proxies and load balancers from closing it, and lets the server
notice a client that went away. The source is read by a task of its own into a small queue, so
waiting for the next event with a timeout never cancels the source mid-read (a reader holds
subscriptions that must be dropped cleanly, by closing it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator
from typing import Final, Protocol

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ._http import HttpProblem

__all__ = ["EventStreams", "encode_event", "sse_events"]

log = logging.getLogger("sojourn.gateway")

_END: Final = b"event: end\ndata: {}\n\n"
_SETTLE: Final = 1.0
"""Seconds an ended stream waits for its reader task to stop."""
_LAST_EVENT_ID_MAX: Final = 20
"""Digits of an event stream's resume point (``Last-Event-ID``, ``after``)."""
_QUEUED: Final = 64
"""Events read ahead of a slow client; past that the source waits (back pressure)."""


def encode_event(event: str, event_id: int | None, data: bytes) -> bytes:
    """One event: ``data`` (JSON) as a single ``data:`` line. What sojourn encodes is compact,
    but a stored value is copied as it was written (a forged chunk's ``value`` may hold line
    breaks between its elements), and a line break would end the event there. Outside strings
    a line break in JSON is only whitespace (inside one it is escaped), so each becomes a
    space: the same value, on one line."""
    if b"\n" in data or b"\r" in data:
        data = data.replace(b"\r", b" ").replace(b"\n", b" ")
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return head.encode() + b"data: " + data + b"\n\n"


async def sse_events(
    source: AsyncIterator[tuple[str, int | None, bytes]],
    keepalive: float,
    closing: asyncio.Event | None = None,
) -> AsyncIterator[bytes]:
    """The events of ``source`` (``(event, id, data)``), a keepalive comment whenever it is
    quiet for ``keepalive`` seconds, ``event: end`` when it is exhausted, ``event: error`` if
    it fails. When ``closing`` is set (the gateway stops) the stream ends at once without
    ``end``: the run has not ended, and the client reconnects with ``Last-Event-ID``."""
    queue: asyncio.Queue[tuple[str, int | None, bytes] | BaseException | None] = asyncio.Queue(
        _QUEUED
    )

    async def pump() -> None:
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # told to the client as an error event, below
            await queue.put(e)
        finally:
            closer = getattr(source, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    task = asyncio.create_task(pump())
    closed = asyncio.ensure_future((closing or asyncio.Event()).wait())
    try:
        yield b": sojourn\n\n"  # headers and a first byte at once: the client knows it is on
        while True:
            if queue.empty():
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, closed}, timeout=keepalive, return_when=FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    if closed.done():
                        yield b": closing\n\n"
                        return
                    yield b": keepalive\n\n"
                    continue
                item = get.result()
            else:
                item = queue.get_nowait()
            if item is None:
                yield _END
                return
            if isinstance(item, BaseException):
                log.warning("event stream failed: %s", item)
                yield encode_event("error", None, b'{"code": "internal"}')
                return
            yield encode_event(*item)
    finally:
        closed.cancel()
        task.cancel()
        # Bounded: a cancel can be swallowed inside a library (Python 3.11's wait_for may
        # return a result that raced it); a stream that has ended must not hang its response.
        done, _ = await asyncio.wait({task}, timeout=_SETTLE)
        if done:
            if not task.cancelled():
                task.exception()  # retrieved: not reported as never retrieved
        else:
            task.cancel()
            log.warning("an event stream's reader did not stop within %.0f s", _SETTLE)


class _StreamsConfig(Protocol):
    @property
    def max_streams(self) -> int: ...

    @property
    def keepalive(self) -> float: ...


class EventStreams:
    """The gateway's event streams (a mixin): at most ``config.max_streams`` open at once,
    each resumable from an offset, each ended cleanly when the gateway closes."""

    config: _StreamsConfig
    streams_open: int
    closing: asyncio.Event

    @staticmethod
    def _resume_from(request: Request, param: str) -> int:
        """Where an event stream resumes: ``Last-Event-ID`` (a reconnecting browser sends it)
        over the ``param`` query parameter, 0 without either."""
        text = request.headers.get("last-event-id") or request.query_params.get(param) or "0"
        if not text.isdigit() or len(text) > _LAST_EVENT_ID_MAX:
            raise HttpProblem("invalid_header", f"{param} / Last-Event-ID must be an offset")
        return int(text)

    def _admit_stream(self) -> None:
        if self.streams_open >= self.config.max_streams:
            raise HttpProblem(
                "unavailable",
                f"this gateway holds {self.streams_open} event streams, its limit: try another "
                "gateway or later",
                headers={"Retry-After": "5"},
            )

    def _sse(self, events: AsyncIterator[tuple[str, int | None, bytes]]) -> StreamingResponse:
        async def counted() -> AsyncIterator[bytes]:
            self.streams_open += 1
            try:
                async for chunk in sse_events(events, self.config.keepalive, self.closing):
                    yield chunk
            finally:
                self.streams_open -= 1

        return StreamingResponse(
            counted(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
