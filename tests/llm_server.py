"""A local HTTP server speaking OpenAI's ``/chat/completions``, for the model client's tests.

Started by a test on 127.0.0.1 with a free port (``async with LlmServer() as server``), it
answers each request with the next scripted ``Behaviour`` (``push``), or with ``default`` when
the script is empty, and records every request it got (``seen``: path, headers, JSON body and
the monotonic time it arrived). Behaviours cover what a provider can do to a client: answer,
stream, refuse with a status and headers, hang, never stop streaming, send garbage.

Plain asyncio streams, one request per connection (``Connection: close``): the client's
pooling is not what is under test, its reading of answers is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Forever",
    "Hang",
    "LlmServer",
    "Reply",
    "Seen",
    "Stream",
    "completion",
    "stream_events",
]


@dataclass(frozen=True)
class Seen:
    """One request the server got."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float
    """``time.monotonic()`` when its headers had arrived."""


@dataclass(frozen=True)
class Reply:
    """An answer: ``body`` (JSON-encoded unless bytes) with ``status`` and ``headers``;
    ``length=False`` sends no Content-Length (the body ends when the connection closes)."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    length: bool = True


@dataclass(frozen=True)
class Stream:
    """An event-stream answer: each event is ``data: <json>`` (a ``str`` is sent as is), then
    ``data: [DONE]`` when ``done``; ``delay`` seconds before each event."""

    events: Sequence[Any]
    done: bool = True
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hang:
    """Answer nothing for ``seconds``, then close the connection."""

    seconds: float = 3600.0


@dataclass(frozen=True)
class Forever:
    """An event stream that never ends: ``event`` (raw bytes) over and over, ``delay`` apart."""

    event: bytes = b'data: {"choices": [{"index": 0, "delta": {"content": "la "}}]}\n\n'
    delay: float = 0.0


Behaviour = Reply | Stream | Hang | Forever


def completion(
    text: str | None = "",
    *,
    tool_calls: Sequence[tuple[str, str, str]] = (),
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    model: str = "test-model-2026-01-01",
    id: str = "chatcmpl-1",
    finish_reason: str = "stop",
    cost: float | None = None,
) -> dict[str, Any]:
    """A non-streamed completion; ``tool_calls`` are ``(id, name, arguments)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cost is not None:
        usage["cost"] = cost
    return {
        "id": id,
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def stream_events(
    pieces: Sequence[str],
    *,
    tool_calls: Sequence[tuple[str, str, Sequence[str]]] = (),
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    model: str = "test-model-2026-01-01",
    id: str = "chatcmpl-s1",
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion: one per text piece, tool calls with their
    arguments in fragments (``(id, name, fragments)``), the finish, then the usage chunk
    (``stream_options.include_usage``)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": id,
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces]
    for index, (call_id, name, fragments) in enumerate(tool_calls):
        head = {"index": index, "id": call_id, "type": "function"}
        out.append(chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        out += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": f}}]})
            for f in fragments
        ]
    out.append(chunk({}, "tool_calls" if tool_calls else "stop"))
    out.append(
        {
            "id": id,
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )
    return out


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}


class LlmServer:
    """The server; ``url`` is the API root to give ``OpenAIChat(base_url=...)``."""

    def __init__(self, default: Callable[[Seen], Behaviour] | None = None) -> None:
        self.script: deque[Behaviour] = deque()
        self.default = default or (lambda seen: Reply(completion("ok")))
        self.seen: list[Seen] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        self.script.extend(behaviours)

    async def __aenter__(self) -> LlmServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        at = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        seen = Seen(method, path, headers, body, at)
        self.seen.append(seen)
        if path != "/v1/chat/completions" or method != "POST":
            await self._reply(writer, Reply({"error": {"message": f"no {path}"}}, status=404))
            return
        behaviour = self.script.popleft() if self.script else self.default(seen)
        if isinstance(behaviour, Reply):
            await self._reply(writer, behaviour)
        elif isinstance(behaviour, Stream):
            await self._stream(writer, behaviour)
        elif isinstance(behaviour, Hang):
            await asyncio.sleep(behaviour.seconds)
        else:
            writer.write(self._head(200, {"Content-Type": "text/event-stream"}))
            while True:
                writer.write(behaviour.event)
                await writer.drain()
                await asyncio.sleep(behaviour.delay)

    @staticmethod
    def _head(status: int, headers: dict[str, str]) -> bytes:
        reason = _REASONS.get(status, "Status")
        lines = [f"HTTP/1.1 {status} {reason}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _reply(self, writer: asyncio.StreamWriter, r: Reply) -> None:
        body = r.body if isinstance(r.body, bytes) else json.dumps(r.body).encode()
        headers = {"Content-Type": "application/json", **r.headers}
        if r.length:
            headers["Content-Length"] = str(len(body))
        writer.write(self._head(r.status, headers))
        writer.write(body)
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, s: Stream) -> None:
        writer.write(self._head(200, {"Content-Type": "text/event-stream", **s.headers}))
        await writer.drain()
        for event in s.events:
            if s.delay:
                await asyncio.sleep(s.delay)
            data = event if isinstance(event, str) else json.dumps(event)
            writer.write(f"data: {data}\n\n".encode())
            await writer.drain()
        if s.done:
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
