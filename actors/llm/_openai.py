"""``OpenAIChat``: a client of the chat-completions API (``POST {base_url}/chat/completions``),
which OpenAI, vLLM, Ollama, LiteLLM, OpenRouter, llama.cpp and most gateways speak.

Built on ``httpx`` (one pooled ``AsyncClient`` per model object, HTTP/1.1 keep-alive, per-read
timeouts). Each answer is read with bounds, whatever the server sends: a JSON body of at most
``max_body_bytes``, an event stream of at most ``max_stream_bytes`` with lines of at most
``max_line_bytes``, all of it within ``max_duration`` seconds, decoded into typed structs (a
negative token count or a wrong type is a ``ModelProtocolError``, never a number in a budget).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any, Final

import httpx
import msgspec

from sojourn.schemas.codec import encode, from_raw
from sojourn.schemas.events import BUDGET_LIMIT_MAX, Usage

from ._http import SseParser, clip, error_for_status
from ._prices import PriceTable
from ._types import (
    Message,
    ModelError,
    ModelProtocolError,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ModelUnavailable,
    OnToken,
    ToolCall,
)

__all__ = ["OpenAIChat"]

TOOL_CALLS_MAX: Final = 128
"""Tool calls one answer may make (a streamed tool call's ``index`` is bounded by it)."""

ERROR_BODY_MAX: Final = 64 * 1024
"""Bytes of an error answer read for its message."""

_COUNT = Annotated[int, msgspec.Meta(ge=0, le=int(BUDGET_LIMIT_MAX))]
_NAME = Annotated[str, msgspec.Meta(max_length=1024)]
_MODEL_NAME = re.compile(r"[\x21-\x7e]{1,200}")
_COST = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,12})?(?:[eE]-?[0-9]{1,3})?")


# --- the wire format (only the fields we read; unknown ones are ignored) --------------------


class _Usage(msgspec.Struct):
    prompt_tokens: _COUNT = 0
    completion_tokens: _COUNT = 0
    cost: Annotated[float, msgspec.Meta(ge=0, le=BUDGET_LIMIT_MAX)] | None = None
    """OpenRouter's (and some gateways') own figure, in USD."""


class _Function(msgspec.Struct):
    name: _NAME | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function = msgspec.field(default_factory=_Function)
    id: _NAME | None = None
    index: Annotated[int, msgspec.Meta(ge=0, lt=TOOL_CALLS_MAX)] = 0


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    refusal: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: _NAME | None = None
    index: int = 0


class _Completion(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    model: str | None = None
    id: _NAME | None = None
    error: Any = None


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


class OpenAIChat:
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        model: the provider's model name (``gpt-4o-mini``, ``llama3.1:8b``...).
        base_url: the API root (``http://localhost:11434/v1`` for Ollama,
            ``http://localhost:8000/v1`` for vLLM).
        api_key: sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY``; none is
            sent when there is neither (a local server).
        timeout: seconds to connect, and between two reads of an answer.
        prices: the ``PriceTable`` that prices this model's requests (``ctx.llm`` uses it).
        headers: more headers for every request.
        client: an ``httpx.AsyncClient`` to use (not closed by ``aclose``); default one of
            our own, made at the first request.
        name: the step name's part (``llm:<name>``); default ``model``.
        max_body_bytes, max_stream_bytes, max_line_bytes: the bounds of an answer.
        max_duration: seconds one request may take in all, streaming included.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        timeout: float = 60.0,
        prices: PriceTable | None = None,
        headers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
        name: str | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_stream_bytes: int = 64 * 1024 * 1024,
        max_line_bytes: int = 1024 * 1024,
        max_duration: float = 900.0,
    ) -> None:
        if not isinstance(model, str) or not _MODEL_NAME.fullmatch(model):
            raise ValueError("a model name is 1-200 printable ASCII characters, no spaces")
        if not timeout > 0 or not max_duration > 0:
            raise ValueError("timeout and max_duration are positive seconds")
        self.model = model
        self.name = name or model
        self.base_url = base_url.rstrip("/")
        self.prices = prices
        self.timeout = float(timeout)
        self.max_body_bytes = max_body_bytes
        self.max_stream_bytes = max_stream_bytes
        self.max_line_bytes = max_line_bytes
        self.max_duration = float(max_duration)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Accept": "application/json", **(headers or {})}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._client = client
        self._owns_client = client is None

    def __repr__(self) -> str:
        return f"OpenAIChat({self.model!r}, base_url={self.base_url!r})"

    # --- the pooled client --------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout),
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
                follow_redirects=False,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connections (only of a client this object made)."""
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def __aenter__(self) -> OpenAIChat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- one request ----------------------------------------------------------------------

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The request body for ``request``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_message(m) for m in request.messages],
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.tool_choice is not None:
            choice = request.tool_choice
            body["tool_choice"] = (
                choice
                if choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": choice}}
            )
        for field in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, field)
            if value is not None:
                body[field] = value
        if request.stop:
            body["stop"] = list(request.stop)
        body.update(request.extra)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def request(
        self,
        request: ModelRequest,
        *,
        on_token: OnToken | None = None,
        idempotency_key: str | None = None,
    ) -> ModelResponse:
        """Send ``request``; stream the answer's text to ``on_token`` when given.

        Raises:
            ModelRateLimited: 429 (``retry_after`` from ``Retry-After``).
            ModelUnavailable: 5xx, 408, 409, a timeout, a connection error.
            ModelProtocolError: the answer is malformed, too large or too long.
            ModelRequestRejected: any other 4xx (terminal).
        """
        stream = on_token is not None
        headers = dict(self._headers)
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        content = encode(self.body(request, stream=stream))
        headers["Content-Type"] = "application/json"
        url = f"{self.base_url}/chat/completions"
        try:
            async with asyncio.timeout(self.max_duration):
                async with self.client.stream("POST", url, content=content, headers=headers) as r:
                    if not 200 <= r.status_code < 300:
                        body = await _read(r, ERROR_BODY_MAX, truncate=True)
                        raise error_for_status(
                            r.status_code, r.headers, body, time.time(), f"{self.base_url}"
                        )
                    cost = _header_cost(r.headers)
                    ctype = r.headers.get("content-type", "")
                    if stream and ctype.startswith("text/event-stream"):
                        return await self._streamed(r, on_token, cost)
                    answer = await _read(r, self.max_body_bytes)
                    response = self._decoded(answer, cost)
                    if on_token is not None and response.text:
                        await on_token(response.text)
                    return response
        except ModelError:
            raise
        except TimeoutError as e:
            raise ModelUnavailable(
                f"{self.base_url}: no complete answer within {self.max_duration:g} s"
            ) from e
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError) as e:
            raise ModelRequestRejected(
                f"{self.base_url}: {type(e).__name__}: {clip(str(e))}"
            ) from e
        except httpx.TimeoutException as e:
            raise ModelUnavailable(
                f"{self.base_url}: timed out ({type(e).__name__}, {self.timeout:g} s)"
            ) from e
        except httpx.TransportError as e:
            raise ModelUnavailable(f"{self.base_url}: {type(e).__name__}: {clip(str(e))}") from e

    def _decoded(self, answer: bytes, cost: float | None) -> ModelResponse:
        try:
            got: _Completion = from_raw(answer, _Completion)
        except msgspec.DecodeError as e:
            raise ModelProtocolError(f"{self.base_url}: not a completion: {clip(str(e))}") from e
        if got.error is not None:
            raise ModelUnavailable(f"{self.base_url}: error in answer: {clip(str(got.error))}")
        usage = self._usage(got)
        if not got.choices or got.choices[0].message is None:
            raise ModelProtocolError(f"{self.base_url}: the answer has no choices", usage=usage)
        choice = got.choices[0]
        message = choice.message
        assert message is not None
        calls = tuple(
            ToolCall(
                id=c.id or f"call_{i}",
                name=c.function.name or "",
                arguments=c.function.arguments or "",
            )
            for i, c in enumerate(message.tool_calls or ())
        )
        if len(calls) > TOOL_CALLS_MAX:
            raise ModelProtocolError(f"{self.base_url}: more than {TOOL_CALLS_MAX} tool calls")
        return ModelResponse(
            text=message.content or message.refusal or "",
            tool_calls=calls,
            usage=usage,
            model=self._model_name(got.model),
            finish_reason=choice.finish_reason,
            id=got.id,
            cost=_first(got.usage.cost if got.usage else None, cost),
        )

    async def _streamed(
        self, r: httpx.Response, on_token: OnToken | None, header_cost: float | None
    ) -> ModelResponse:
        """Read an event stream: text deltas go to ``on_token`` as they come (the deltas of
        one network read together, so a slow reader gets fewer, larger pieces)."""
        parser = SseParser(max_line=self.max_line_bytes, max_total=self.max_stream_bytes)
        text: list[str] = []
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        last: _Completion | None = None
        usage_seen: _Usage | None = None
        finish: str | None = None
        done = False
        async for chunk in r.aiter_bytes():
            events = parser.feed(chunk)
            piece: list[str] = []
            for data in events:
                if data.strip() == b"[DONE]":
                    done = True
                    break
                try:
                    got: _Completion = from_raw(data, _Completion)
                except msgspec.DecodeError as e:
                    raise ModelProtocolError(
                        f"{self.base_url}: not a completion chunk: {clip(str(e))}"
                    ) from e
                if got.error is not None:
                    raise ModelUnavailable(
                        f"{self.base_url}: error in stream: {clip(str(got.error))}"
                    )
                last = got
                if got.usage is not None:
                    usage_seen = got.usage
                for choice in got.choices[:1]:
                    delta = choice.delta or choice.message
                    if choice.finish_reason is not None:
                        finish = choice.finish_reason
                    if delta is None:
                        continue
                    if delta.content:
                        piece.append(delta.content)
                    for c in delta.tool_calls or ():
                        slot = calls.setdefault(c.index, ["", "", ""])
                        slot[0] = c.id or slot[0]
                        slot[1] += c.function.name or ""
                        slot[2] += c.function.arguments or ""
            if piece:
                text.extend(piece)
                if on_token is not None:
                    await on_token("".join(piece))
            if done:
                break
        if not done:
            parser.close()
        usage = self._usage(_Completion(usage=usage_seen, model=last.model if last else None))
        if not done and finish is None:
            raise ModelProtocolError(
                f"{self.base_url}: the event stream ended before the answer did", usage=usage
            )
        return ModelResponse(
            text="".join(text),
            tool_calls=tuple(
                ToolCall(id=v[0] or f"call_{i}", name=v[1], arguments=v[2])
                for i, v in sorted(calls.items())
            ),
            usage=usage,
            model=self._model_name(last.model if last else None),
            finish_reason=finish,
            id=last.id if last else None,
            cost=_first(usage_seen.cost if usage_seen else None, header_cost),
        )

    def _usage(self, got: _Completion) -> Usage:
        u = got.usage
        return Usage(
            input_tokens=u.prompt_tokens if u else 0,
            output_tokens=u.completion_tokens if u else 0,
            requests=1,
            model=self._model_name(got.model),
        )

    def _model_name(self, reported: str | None) -> str:
        """The provider's name for the model that answered, if it is a sane one."""
        if reported is not None and _MODEL_NAME.fullmatch(reported):
            return reported
        return self.model


def _first(*costs: float | None) -> float | None:
    return next((c for c in costs if c is not None), None)


def _header_cost(headers: httpx.Headers) -> float | None:
    """LiteLLM's proxy reports a request's cost in ``x-litellm-response-cost``."""
    value = headers.get("x-litellm-response-cost")
    if value is None or not _COST.fullmatch(value.strip()):
        return None
    cost = float(value)
    return cost if math.isfinite(cost) and 0 <= cost <= BUDGET_LIMIT_MAX else None


async def _read(r: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
    """The body of ``r``, at most ``limit`` bytes (more: ``ModelProtocolError``, or with
    ``truncate`` the first ``limit`` bytes)."""
    declared = r.headers.get("content-length", "")
    if not truncate and declared.isdigit() and int(declared) > limit:
        raise ModelProtocolError(f"the answer is {declared} bytes; at most {limit} are read")
    out = bytearray()
    async for chunk in r.aiter_bytes():
        out += chunk
        if len(out) > limit:
            if truncate:
                return bytes(out[:limit])
            raise ModelProtocolError(f"the answer passed {limit} bytes")
    return bytes(out)
