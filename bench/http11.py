"""A minimal asyncio HTTP/1.1 client for the gateway benchmark: keep-alive requests and
server-sent event streams over plain ``asyncio`` streams.

Why not httpx: a thousand concurrent event streams in one process must cost the bench little
CPU per event, or the bench, not the gateway, sets the delivery lag it measures. This client
does only what the gateway answers with: a status line, headers, then a body framed by
``Content-Length`` or ``Transfer-Encoding: chunked``. Sizes are bounded (a header block, a
chunk, an event), and anything it does not understand raises ``HttpError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

__all__ = ["HttpConnection", "HttpError", "Response", "SseEvent"]

_HEADER_BLOCK_MAX: Final = 64 * 1024
_BODY_MAX: Final = 8 * 1024 * 1024
_CHUNK_MAX: Final = 1024 * 1024
_EVENT_MAX: Final = 1024 * 1024
_STATUS_LINE: Final = re.compile(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?: [^\r\n]*)?\r\n")
_HEADER_LINE: Final = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n]*?)[ \t]*\r\n")
_IDLE_REOPEN: Final = 4.0
"""Seconds idle after which a connection is reopened before use (below uvicorn's 5 s)."""
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,8})(?:;[^\r\n]*)?\r\n")


class HttpError(Exception):
    """The server answered something this client does not take (or closed the connection)."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event: its ``event`` name (``message`` when none was given), its
    ``id`` line (``None`` without one) and its data lines joined with newlines."""

    event: str
    id: str | None
    data: bytes


class HttpConnection:
    """One keep-alive connection to ``host:port``; requests on it go one at a time.

    Every request carries ``Authorization: Bearer <token>``. ``request`` reads a whole body;
    ``open_events`` reads a ``text/event-stream`` body event by event, and leaves the connection
    ready for the next request once the server has ended the body.
    """

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host = host
        self.port = port
        self._auth = f"Authorization: Bearer {token}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._idle_since = 0.0
        self.reopened = 0

    async def open(self) -> HttpConnection:
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, limit=_CHUNK_MAX + 64
        )
        self._idle_since = time.monotonic()
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = self._reader = None

    async def _fresh(self) -> None:
        """Reopen the connection if the server closed it or may be about to: a keep-alive
        server closes an idle connection after a few seconds (uvicorn: 5), and a request
        written into a closing connection is lost (what every pooling client does too)."""
        idle = time.monotonic() - self._idle_since
        if self._reader is None or self._reader.at_eof() or idle > _IDLE_REOPEN:
            await self.close()
            await self.open()
            self.reopened += 1

    async def _send(self, method: str, path: str, body: bytes | None, accept: str) -> None:
        await self._fresh()
        if self._writer is None:
            raise HttpError("the connection is not open")
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAccept: {accept}\r\n"
        ).encode() + self._auth
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
        self._writer.write(head + b"\r\n" + (body or b""))
        import time as _t

        self.last_use = _t.perf_counter()

    async def _head(self) -> tuple[int, dict[str, str]]:
        reader = self._stream()
        try:
            block = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            raise HttpError("the server closed the connection before answering") from e
        except asyncio.LimitOverrunError as e:
            raise HttpError("header block too large") from e
        if len(block) > _HEADER_BLOCK_MAX:
            raise HttpError("header block too large")
        m = _STATUS_LINE.match(block)
        if m is None:
            raise HttpError(f"not an HTTP/1.1 status line: {block[:64]!r}")
        headers: dict[str, str] = {}
        pos = m.end()
        while pos < len(block) - 2:
            h = _HEADER_LINE.match(block, pos)
            if h is None:
                raise HttpError(f"malformed header line: {block[pos : pos + 64]!r}")
            headers[h.group(1).decode().lower()] = h.group(2).decode("latin-1")
            pos = h.end()
        return int(m.group(1)), headers

    def _stream(self) -> asyncio.StreamReader:
        if self._reader is None:
            raise HttpError("the connection is not open")
        return self._reader

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The pieces of a chunked body, as they arrive, until its last (empty) chunk."""
        reader = self._stream()
        while True:
            line = await reader.readuntil(b"\r\n")
            m = _CHUNK_SIZE.fullmatch(line)
            if m is None:
                raise HttpError(f"malformed chunk size line: {line[:32]!r}")
            size = int(m.group(1), 16)
            if size > _CHUNK_MAX:
                raise HttpError(f"chunk of {size} bytes is larger than {_CHUNK_MAX}")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailer fields, ignored
                return
            data = await reader.readexactly(size + 2)
            if data[-2:] != b"\r\n":
                raise HttpError("chunk not followed by CRLF")
            yield data[:-2]

    async def _body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            total = 0
            async for piece in self._chunks():
                total += len(piece)
                if total > _BODY_MAX:
                    raise HttpError("body too large")
                parts.append(piece)
            return b"".join(parts)
        length = headers.get("content-length", "0")
        if not re.fullmatch(r"[0-9]{1,10}", length) or int(length) > _BODY_MAX:
            raise HttpError(f"bad Content-Length {length[:16]!r}")
        return await self._stream().readexactly(int(length))

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """One request and its whole answer."""
        await self._send(method, path, body, "application/json")
        status, headers = await self._head()
        answer = Response(status, headers, await self._body(headers))
        self._idle_since = time.monotonic()
        return answer

    async def open_events(self, path: str) -> AsyncIterator[SseEvent]:
        """``GET path`` as an event stream: returns once the answer's head is in (the stream
        is open), an iterator of its events as they arrive (comments are skipped) until the
        server ends the body. Stopping early leaves the connection unusable: close it.

        Raises:
            HttpError: the answer is not a 200 chunked event stream, or is malformed.
        """
        await self._send("GET", path, None, "text/event-stream")
        status, headers = await self._head()
        if status != 200:
            body = await self._body(headers)
            raise HttpError(f"GET {path}: {status} {body[:200]!r}")
        if headers.get("transfer-encoding", "").lower() != "chunked":
            raise HttpError("an event stream must be chunked (it has no length)")
        return self._events()

    async def _events(self) -> AsyncIterator[SseEvent]:
        buf = b""
        async for piece in self._chunks():
            buf += piece
            while True:
                end = buf.find(b"\n\n")
                if end < 0:
                    break
                block, buf = buf[:end], buf[end + 2 :]
                event = _parse_event(block)
                if event is not None:
                    yield event
            if len(buf) > _EVENT_MAX:
                raise HttpError("event larger than the limit")
        self._idle_since = time.monotonic()


def _parse_event(block: bytes) -> SseEvent | None:
    """One event block (its lines without the blank line that ends it); ``None`` for a block
    of comments only."""
    name = "message"
    event_id: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"event":
            name = value.decode(errors="replace")
        elif field == b"id":
            event_id = value.decode(errors="replace")
        elif field == b"data":
            data.append(value)
    if not data and name == "message" and event_id is None:
        return None
    return SseEvent(name, event_id, b"\n".join(data))
