"""``ScriptedModel``: an offline, deterministic model for examples and tests.

It answers from a script: a list of answers given in order (a ``ModelResponse``, a ``str``,
an exception to raise, or a function of the request), or one function that answers every
request. Usage is made up but consistent: a request's input tokens are the words of its
messages, the output tokens the words of the answer (and of its tool calls' arguments). It
streams its text word by word, and can be told to fail given calls with a 429-like
``ModelRateLimited`` to exercise retries.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from sojourn.schemas.errors import TerminalError
from sojourn.schemas.events import Usage

from ._prices import PriceTable
from ._types import ModelRateLimited, ModelRequest, ModelResponse, OnToken

__all__ = ["Answer", "ScriptedModel", "words"]

Answer = (
    ModelResponse
    | str
    | BaseException
    | Callable[[ModelRequest], ModelResponse | str | Awaitable[ModelResponse | str]]
)
"""One scripted answer: a response, its text, an error to raise, or a function of the
request (sync or async) returning a response or a text."""


def words(text: str | None) -> int:
    """The made-up token count of ``text``: its whitespace-separated words."""
    return len(text.split()) if text else 0


def _input_tokens(request: ModelRequest) -> int:
    total = 0
    for m in request.messages:
        total += words(m.content) + sum(words(c.arguments) for c in m.tool_calls)
    return total


class ScriptedModel:
    """A model that answers from a script, offline.

    Args:
        script: the answers in call order, or one function answering every request.
        name: the model's name (the step is ``llm:<name>``).
        fail: calls (1-based, counting every request this object gets) that raise
            ``ModelRateLimited`` first, with the given ``retry_after`` (seconds or ``None``).
        delay: seconds between streamed words.
        prices: a ``PriceTable`` for this model (default: it is free).

    Attributes:
        calls: requests received so far (replays do not call a model: this does not grow).
        requests, keys: each request received, and its idempotency key.
    """

    def __init__(
        self,
        script: Sequence[Answer] | Callable[[ModelRequest], Any],
        *,
        name: str = "scripted",
        fail: Mapping[int, float | None] | Iterable[int] = (),
        delay: float = 0.0,
        prices: PriceTable | None = None,
    ) -> None:
        self.name = name
        self.prices = prices if prices is not None else PriceTable({name: (0.0, 0.0)})
        self._script: Sequence[Answer] | None = None
        self._answer: Callable[[ModelRequest], Any] | None = None
        if callable(script):
            self._answer = script
        else:
            self._script = list(script)
        self.fail: dict[int, float | None] = (
            dict(fail) if isinstance(fail, Mapping) else dict.fromkeys(fail, None)
        )
        self.delay = delay
        self.calls = 0
        self.requests: list[ModelRequest] = []
        self.keys: list[str | None] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ScriptedModel({self.name!r}, calls={self.calls})"

    async def request(
        self,
        request: ModelRequest,
        *,
        on_token: OnToken | None = None,
        idempotency_key: str | None = None,
    ) -> ModelResponse:
        with self._lock:
            self.calls += 1
            call = self.calls
            self.requests.append(request)
            self.keys.append(idempotency_key)
        if call in self.fail:
            raise ModelRateLimited(
                f"scripted 429 on call {call}", retry_after=self.fail[call], usage=None
            )
        response = await self._respond(request, call)
        if on_token is not None and response.text:
            for i, word in enumerate(response.text.split(" ")):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await on_token(word if i == 0 else " " + word)
        return response

    async def _respond(self, request: ModelRequest, call: int) -> ModelResponse:
        if self._answer is not None:
            answer: Any = self._answer
        else:
            assert self._script is not None
            served = call - sum(1 for c in self.fail if c <= call)
            if served > len(self._script):
                raise TerminalError(
                    f"scripted model {self.name!r} has {len(self._script)} answers; "
                    f"request {served} has none"
                )
            answer = self._script[served - 1]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            answer = answer(request)
            if inspect.isawaitable(answer):
                answer = await answer
        if isinstance(answer, str):
            answer = ModelResponse(text=answer, finish_reason="stop")
        if not isinstance(answer, ModelResponse):
            raise TypeError(f"a scripted answer is a ModelResponse or a str, not {answer!r}")
        usage = answer.usage
        if usage == Usage():
            usage = Usage(
                input_tokens=_input_tokens(request),
                output_tokens=words(answer.text)
                + sum(words(c.arguments) for c in answer.tool_calls),
                requests=1,
                model=self.name,
            )
        finish = answer.finish_reason or ("tool_calls" if answer.tool_calls else "stop")
        return msgspec.structs.replace(
            answer,
            usage=usage,
            model=answer.model or self.name,
            finish_reason=finish,
            id=answer.id or f"scripted-{call}",
        )
