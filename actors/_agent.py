"""Agents: the unit users write. ``@agent("name")`` turns an async function into an ``Agent``.

There is no global registry: an ``Agent`` is a plain object you hand to a ``Worker`` (or that
``--app MODULE`` finds as a module-level attribute), so two test modules can define agents with
the same name without stepping on each other.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import msgspec

from sojourn.broker.names import validate_token

from ._retry import RetryPolicy

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["Agent", "agent"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

AgentFn = Callable[["Context", I], Awaitable[O]]
"""``async def fn(ctx, input) -> output``."""
NoInputFn = Callable[["Context"], Awaitable[O]]
"""``async def fn(ctx) -> output``: an agent that takes no input."""


@dataclass(frozen=True, slots=True)
class Budget:
    """What one run may spend (as reported with ``ctx.spend``) before it is suspended.

    A run that reaches a limit is suspended with reason ``budget`` (visible in ``sojourn
    status``, counted in ``sojourn_budget_breaches_total``); ``sojourn resume RUN`` grants it
    the same budget again.
    """

    usd: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("usd", "tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Budget.{name} must be positive, not {value}")


class Agent(Generic[I, O]):
    """A named, durable agent: its function plus the types of its input and output.

    Args:
        name: the agent's wire name (``sojourn.start.<name>``); a subject token.
        fn: ``async def fn(ctx, input) -> output``.
        version: recorded in every run it starts (``RunStarted.code_version``), so a replay on
            different code can be told apart.
        poll_cap: how many ``ctx.poll`` checks a run may make before it is suspended.
        retry: the default ``RetryPolicy`` of this agent's steps (``@step(retry=...)``
            overrides it per step); none by default: a failing step fails at once.
        budget: what one run may spend (``ctx.spend``) before it is suspended.
    """

    def __init__(
        self,
        name: str,
        fn: AgentFn[I, O] | NoInputFn[O],
        *,
        version: str | None = None,
        poll_cap: int = 1000,
        retry: RetryPolicy | None = None,
        budget: Budget | None = None,
    ) -> None:
        validate_token(name, "agent name")
        if poll_cap < 1:
            raise ValueError("poll_cap must be >= 1")
        self.name = name
        self.fn = fn
        self.version = version
        self.poll_cap = poll_cap
        self.retry = retry
        self.budget = budget
        hints = _hints(fn)
        params = list(inspect.signature(fn).parameters)
        self.takes_input = len(params) > 1
        self.input_type: Any = hints.get(params[1], Any) if self.takes_input else Any
        self.output_type: Any = hints.get("return", Any)
        self._input_decoder = msgspec.json.Decoder(self.input_type)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def call(self, ctx: Context, input: I) -> Awaitable[O]:
        """The agent's coroutine for one activation: ``fn(ctx, input)``, or ``fn(ctx)`` for an
        agent that takes no input."""
        if self.takes_input:
            return cast(AgentFn[I, O], self.fn)(ctx, input)
        return cast(NoInputFn[O], self.fn)(ctx)

    def decode_input(self, raw: bytes) -> I:
        """Decode and validate raw JSON input. Raises ``msgspec.ValidationError``."""
        value: I = self._input_decoder.decode(raw)
        return value

    def input_schema(self) -> dict[str, Any]:
        try:
            return msgspec.json.schema(self.input_type)
        except (TypeError, ValueError):
            return {}

    def __repr__(self) -> str:
        return f"Agent({self.name!r})"


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def agent(
    name: str,
    *,
    version: str | None = None,
    poll_cap: int = 1000,
    retry: RetryPolicy | None = None,
    budget: Budget | None = None,
) -> Callable[[AgentFn[I, O] | NoInputFn[O]], Agent[I, O]]:
    """Decorate ``async def fn(ctx, input) -> output`` (or ``async def fn(ctx) -> output``)
    into an ``Agent``.

    Example:
        >>> from sojourn.actors import agent
        >>> @agent("echo")
        ... async def echo(ctx, text: str) -> str:
        ...     return text
        >>> echo.name, echo.input_type
        ('echo', <class 'str'>)
    """

    def wrap(fn: AgentFn[I, O] | NoInputFn[O]) -> Agent[I, O]:
        return Agent(name, fn, version=version, poll_cap=poll_cap, retry=retry, budget=budget)

    return wrap
