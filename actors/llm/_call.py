"""``ctx.llm``: one model request as one journaled step.

The step is named ``llm:<model name>`` and of kind ``llm`` (``StepStarted.kind``), so the run
machine checks the run's budget before it, counts it as a model request (not a tool call),
and replay returns the recorded ``ModelResponse`` without calling the model. Its function
calls ``model.request`` with the step's idempotency key, streams the text to the run's output
stream when asked, prices the usage and charges it with ``current_step().charge``: the
attempt's ``StepCompleted.usage`` (or ``StepFailed.usage``, for what a failed request used),
the run's budget and ``sojourn_spend_total`` all see the same figures.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Protocol

import msgspec

from sojourn.schemas.errors import RetryableError
from sojourn.schemas.events import Usage

from ..agents.steps import current_step
from ..core.retry import RetryPolicy, step
from ._prices import PriceTable
from ._types import Message, Model, ModelRequest, ModelResponse, OnToken, Tool

__all__ = ["LLM_RETRY", "MODEL_STAND_INS", "call_model", "model_request", "priced"]

log = logging.getLogger("sojourn.llm")

LLM_RETRY: Final = RetryPolicy(
    retry_on=(RetryableError, TimeoutError, ConnectionError),
    attempts=6,
    initial_interval=1.0,
    backoff=2.0,
    max_interval=60.0,
)
"""The default policy of model requests: 6 attempts, 1 s doubling to at most 60 s between them,
a 429's ``Retry-After`` instead when the provider gives one. Other errors (a 400, a bad key:
``ModelRequestRejected``) fail the step at once."""

_NO_PRICES: Final = PriceTable()
"""Used when neither the call nor the model has a table: every model unknown, warned once."""

MODEL_STAND_INS: Final[list[Callable[[Model], Model | None]]] = []
"""The test seam of ``sojourn.actors.testing.mock_model``: each function, newest first, is
asked for a stand-in for the model a ``ctx.llm`` call names (``None``: not mine). Empty in
production; nothing but the testing kit adds to it."""


def _stand_in_for(model: Model) -> Model:
    for stand_in in reversed(MODEL_STAND_INS):
        other = stand_in(model)
        if other is not None:
            return other
    return model


def model_request(
    messages: str | Message | Sequence[Message],
    tools: Iterable[Tool] | None,
    options: dict[str, Any],
) -> ModelRequest:
    """The request ``ctx.llm`` sends: a plain ``str`` is one user message."""
    if isinstance(messages, str):
        conversation: tuple[Message, ...] = (Message("user", messages),)
    elif isinstance(messages, Message):
        conversation = (messages,)
    else:
        conversation = tuple(messages)
    if not conversation or not all(isinstance(m, Message) for m in conversation):
        raise TypeError("ctx.llm takes a prompt (str) or a non-empty sequence of Message")
    tool_list = tuple(tools or ())
    if not all(isinstance(t, Tool) for t in tool_list):
        raise TypeError("ctx.llm tools are Tool values")
    try:
        return ModelRequest(messages=conversation, tools=tool_list, **options)
    except TypeError as e:
        fields = ", ".join(f for f in ModelRequest.__struct_fields__ if f not in ("messages",))
        raise TypeError(f"ctx.llm options are {fields}: {e}") from None


def priced(usage: Usage, table: PriceTable, reported: float | None, fallback: str) -> Usage:
    """``usage`` with its cost: the provider's own figure when it gave one, else the table's."""
    model = usage.model or fallback
    usd = (
        reported
        if reported is not None
        else (table.cost(model, usage.input_tokens, usage.output_tokens))
    )
    return msgspec.structs.replace(usage, usd=usd, model=model, requests=usage.requests or 1)


class _ModelStep:
    """The function of one ``ctx.llm`` step. A callable object rather than a closure, and
    unhashable on purpose: the step machinery caches facts about hashable step functions, and
    a cached closure would keep its conversation alive."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        model: Model,
        request: ModelRequest,
        stream: Callable[[str], Any] | None,
        prices: PriceTable,
    ) -> None:
        self.__name__ = f"llm:{model.name}"
        self._model = model
        self._request = request
        self._stream = stream
        self._prices = prices

    async def __call__(self) -> ModelResponse:
        info = current_step()
        on_token: OnToken | None = None
        if self._stream is not None:
            stream = self._stream

            async def on_token(text: str) -> None:
                await stream(text)

        name = self._model.name
        try:
            response = await self._model.request(
                self._request, on_token=on_token, idempotency_key=info.idempotency_key
            )
        except Exception as e:
            used = getattr(e, "usage", None)
            if isinstance(used, Usage):
                info.charge(priced(used, self._prices, None, name))
            raise
        if not isinstance(response, ModelResponse):
            raise TypeError(f"{name}: Model.request returned {type(response).__name__}")
        usage = priced(response.usage, self._prices, response.cost, response.model or name)
        info.charge(usage)
        return msgspec.structs.replace(response, usage=usage)


class StepContext(Protocol):
    """What ``call_model`` needs of its run's ``Context`` (``sojourn.actors.agents.context``),
    named structurally so that this module imports nothing of the agents' context (which
    imports it): no import circle."""

    async def step(self, fn: Callable[[], Awaitable[ModelResponse]], /) -> ModelResponse: ...

    async def stream(self, text: str) -> int: ...


async def call_model(
    ctx: StepContext,
    model: Model,
    messages: str | Message | Sequence[Message],
    tools: Iterable[Tool] | None,
    options: dict[str, Any],
    *,
    stream: bool,
    retry: RetryPolicy | None,
    prices: PriceTable | None,
    limit: str | None = None,
) -> ModelResponse:
    """``ctx.llm``'s body (see ``Context.llm``): ``options`` are its ``ModelRequest`` fields."""
    if not isinstance(getattr(model, "name", None), str) or not callable(
        getattr(model, "request", None)
    ):
        raise TypeError(f"ctx.llm needs a Model (a name and an async request()), not {model!r}")
    if MODEL_STAND_INS:
        model = _stand_in_for(model)
    request = model_request(messages, tools, options)
    table = prices or getattr(model, "prices", None) or _NO_PRICES
    fn = _ModelStep(model, request, ctx.stream if stream else None, table)
    step(name=fn.__name__, retry=retry or LLM_RETRY, kind="llm", limit=limit)(fn)
    result = await ctx.step(fn)
    if isinstance(result, ModelResponse):
        return result
    return msgspec.convert(result, ModelResponse)
