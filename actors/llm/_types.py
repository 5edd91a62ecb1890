"""What a model request and its answer are, as journaled values, and what a model is.

Every type here is a frozen msgspec ``Struct``: a ``ModelResponse`` is a step's result, stored
in the run's history and decoded back identically on replay, so an agent's code sees the same
answer on the first execution and on every replay after it.

The errors say what a failed request means for the run's retry policy: ``ModelRateLimited``
and ``ModelUnavailable`` (a 429, a 5xx, a timeout, a broken connection) and
``ModelProtocolError`` (an answer that is not one) are ``RetryableError``s, retried within the
step's attempts, a 429's ``Retry-After`` as the delay; ``ModelRequestRejected`` (any other 4xx:
a bad key, a bad request) is a ``TerminalError``: sending it again would be refused again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from sojourn.schemas.errors import RateLimited, RetryableError, TerminalError
from sojourn.schemas.events import Usage

__all__ = [
    "Message",
    "Model",
    "ModelError",
    "ModelProtocolError",
    "ModelRateLimited",
    "ModelRequest",
    "ModelRequestRejected",
    "ModelResponse",
    "ModelUnavailable",
    "OnToken",
    "Role",
    "Tool",
    "ToolCall",
]

Role = Literal["system", "user", "assistant", "tool"]

OnToken = Callable[[str], Awaitable[None]]
"""Called with each piece of text as a streaming model produces it (``ctx.stream`` under
``ctx.llm(..., stream=True)``)."""


class ToolCall(msgspec.Struct, frozen=True):
    """A tool the model asked to call: ``arguments`` is the JSON text the model wrote (it may
    not be valid JSON: decode it in a tool step and tell the model when it is not)."""

    id: str
    name: str
    arguments: str = "{}"


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One message of a conversation, in the chat-completions shape every provider takes."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    """For an ``assistant`` message: the tool calls it made."""
    tool_call_id: str | None = None
    """For a ``tool`` message: the call it answers."""
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str | None, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return cls("assistant", content, tool_calls)

    @classmethod
    def tool(cls, call_id: str, content: str) -> Message:
        """The result of the tool call ``call_id``, for the model's next request."""
        return cls("tool", content, tool_call_id=call_id)


class Tool(msgspec.Struct, frozen=True):
    """A function the model may call: ``parameters`` is the JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One request to a model. ``extra`` is merged into the provider's request body as is
    (``{"seed": 7}``, ``{"response_format": {...}}``, ``{"max_completion_tokens": 500}``)."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    tool_choice: str | None = None
    """``auto``, ``none``, ``required``, or the name of one tool the model must call."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A model's answer, as journaled: replay returns exactly this.

    ``usage`` is what the request used; under ``ctx.llm`` its ``usd`` is the request's cost
    (the provider's own figure, ``cost``, when it reports one, else the price table's).
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    model: str = ""
    """The model that answered, as the provider names it."""
    finish_reason: str | None = None
    """``stop``, ``length``, ``tool_calls``, ``content_filter``... as the provider says."""
    id: str | None = None
    cost: float | None = None
    """What the provider itself said the request cost in USD (OpenRouter, LiteLLM), if it did."""

    def message(self) -> Message:
        """This answer as the ``assistant`` message to append to the conversation."""
        return Message("assistant", self.text or None, self.tool_calls)


@runtime_checkable
class Model(Protocol):
    """What ``ctx.llm`` calls. Implement it for any provider (see ``docs/llm.md``).

    ``name`` names the step (``llm:<name>``): keep it stable, replay checks it. ``request``
    sends one request and returns the answer; it calls ``on_token`` with each piece of text
    as it arrives when given (a model that cannot stream may call it once with the whole
    text, or not at all), passes ``idempotency_key`` to the provider where its API takes one
    (the same on every attempt of the step), and raises ``RetryableError`` for what may work
    later (``retry_after``: a 429's ``Retry-After``) and ``TerminalError`` for what will not.
    An error may carry ``usage`` (a ``Usage``): what the failed request used anyway.

    A model object may also have ``prices`` (a ``PriceTable``): ``ctx.llm`` prices the
    request's usage with it unless the call names its own.
    """

    name: str

    async def request(
        self,
        request: ModelRequest,
        *,
        on_token: OnToken | None = None,
        idempotency_key: str | None = None,
    ) -> ModelResponse: ...


class ModelError(Exception):
    """Mixin of the model errors below: what the provider said, and what the request used."""

    status: int | None = None
    usage: Usage | None = None


class _ProviderRetryable(ModelError, RetryableError):
    """What a provider answered that is worth another attempt: its HTTP status (``status``,
    else the class's ``default_status``), the delay it asked for (``retry_after``) and what the
    request used."""

    default_status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
    ) -> None:
        RetryableError.__init__(self, message, retry_after=retry_after)
        self.status = self.default_status if status is None else status
        self.usage = usage


class ModelRateLimited(_ProviderRetryable, RateLimited):
    """429 (or 503 with ``Retry-After``): the provider asks us to come back later;
    ``retry_after`` (seconds, at most an hour) is the run's delay before the next attempt."""

    default_status = 429


class ModelUnavailable(_ProviderRetryable):
    """A 5xx, 408 or 409, a timeout or a connection that failed: worth another attempt."""


class ModelProtocolError(ModelError, RetryableError):
    """The provider's answer is not one: invalid JSON, a wrong shape, a negative count, larger
    than the client accepts, a stream that never ends. Retried like a 5xx (a proxy that cut a
    body short is the common cause); a server that always answers so fails the step once its
    attempts are used up."""

    def __init__(self, message: str, *, usage: Usage | None = None) -> None:
        RetryableError.__init__(self, message)
        self.usage = usage


class ModelRequestRejected(ModelError, TerminalError):
    """A 4xx other than 408, 409 and 429 (an invalid key, an unknown model, a malformed
    request): the step fails at once with the provider's message."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        TerminalError.__init__(self, message)
        self.status = status
