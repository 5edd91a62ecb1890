"""Agents: the unit users write. ``@agent("name")`` turns an async function into an ``Agent``.

There is no global registry: an ``Agent`` is a plain object you hand to a ``Worker`` (or that
``--app MODULE`` finds as a module-level attribute), so two test modules can define agents with
the same name without stepping on each other.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, cast

import msgspec

from sojourn.schemas.concurrency import Concurrency
from sojourn.schemas.events import Budget
from sojourn.schemas.guard import check_depth
from sojourn.schemas.limits import Limit, validate_limit_name
from sojourn.schemas.names import validate_token

from ..core.retry import RetryPolicy

if TYPE_CHECKING:
    from ..integrations.mcp import McpServer
    from .context import Context

__all__ = ["Agent", "AgentOptions", "agent"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

AgentFn = Callable[["Context", I], Awaitable[O]]
"""``async def fn(ctx, input) -> output``."""
NoInputFn = Callable[["Context"], Awaitable[O]]
"""``async def fn(ctx) -> output``: an agent that takes no input."""
Compensation = Callable[["Context", Any], Awaitable[None]]
"""``async def fn(ctx, input) -> None``: what a cancelled run does before it ends."""


class AgentOptions(TypedDict, total=False):
    """The keyword arguments of ``Agent`` (see there), as ``@agent`` passes them on."""

    version: str | None
    poll_cap: int
    retry: RetryPolicy | None
    budget: Budget | None
    on_cancel: Compensation | None
    lifetime: float | int | timedelta | None
    mcp: Sequence[McpServer]
    limits: Mapping[str, Limit]
    concurrency: Concurrency | None


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
        budget: what one run may use (money, tokens, steps, tool calls, polls, wall time)
            before it is suspended; a start may replace any of its limits for one run.
        on_cancel: ``async def fn(ctx, input) -> None``, the compensation: run after a
            cancel stopped the agent's code (its steps journaled like any), before the run
            ends ``cancelled``; ``terminate`` skips it.
        lifetime: the longest a run may live (seconds or ``timedelta``, from its start):
            past it the run is cancelled, its compensation run and its children cancelled,
            also while it is parked on a wait (a broker timer wakes it).
        mcp: the MCP servers its runs call by name (``ctx.mcp``; the mcp extra, docs/mcp.md).
        limits: shared rate limits its steps use by name (``@step(limit=...)``,
            ``ctx.llm(..., limit=...)``), declared for the whole deployment: a limit that does
            not exist yet is created with this rate; one that does keeps its own (docs/guide.md,
            "Shared rate limits").
        concurrency: at most ``limit`` live runs per key, the key made from each run's input
            (``Concurrency(key=lambda input: input.tenant, limit=5)``); a run beyond it is
            queued until a slot frees (docs/guide.md, "Concurrency keys"; decision 0048).
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
        on_cancel: Compensation | None = None,
        lifetime: float | int | timedelta | None = None,
        mcp: Sequence[McpServer] = (),
        limits: Mapping[str, Limit] | None = None,
        concurrency: Concurrency | None = None,
    ) -> None:
        validate_token(name, "agent name")
        if concurrency is not None and not isinstance(concurrency, Concurrency):
            raise TypeError("concurrency is a Concurrency(key=..., limit=...)")
        self.concurrency = concurrency
        self.limits = declared_limits(limits)
        if poll_cap < 1:
            raise ValueError("poll_cap must be >= 1")
        if on_cancel is not None and not inspect.iscoroutinefunction(on_cancel):
            raise TypeError("on_cancel must be an async function: async def fn(ctx, input)")
        self.on_cancel = on_cancel
        self.lifetime = lifetime_seconds(lifetime)
        self.mcp = tuple(mcp)
        names = [s.name for s in self.mcp]
        if len(set(names)) != len(names):
            raise ValueError(f"agent {name!r}: two MCP servers have the same name")
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
            return cast("AgentFn[I, O]", self.fn)(ctx, input)
        return cast("NoInputFn[O]", self.fn)(ctx)

    def compensate(self, ctx: Context, input: I) -> Awaitable[None]:
        """The compensation's coroutine (``on_cancel`` is set): ``fn(ctx, input)``."""
        assert self.on_cancel is not None
        return self.on_cancel(ctx, input)

    def decode_input(self, raw: bytes) -> I:
        """Decode and validate raw JSON input. Raises ``msgspec.ValidationError`` (or
        ``msgspec.DecodeError``: not JSON, or nested past ``guard.RECORD_DEPTH``)."""
        check_depth(raw)
        value: I = self._input_decoder.decode(raw)
        return value

    def input_schema(self) -> dict[str, Any]:
        try:
            return msgspec.json.schema(self.input_type)
        except (TypeError, ValueError):
            return {}

    def __repr__(self) -> str:
        return f"Agent({self.name!r})"


def declared_limits(limits: Mapping[str, Limit] | None) -> dict[str, Limit]:
    """Declared shared rate limits, checked: names and ``Limit`` values."""
    out: dict[str, Limit] = {}
    for name, limit in (limits or {}).items():
        validate_limit_name(name)
        if not isinstance(limit, Limit):
            raise TypeError(f"limit {name!r} is declared with a Limit(...), not {limit!r}")
        out[name] = limit
    return out


def lifetime_seconds(lifetime: float | int | timedelta | None) -> float | None:
    """A run's maximum lifetime as seconds, checked: a positive number or ``timedelta``."""
    if lifetime is None:
        return None
    seconds = lifetime.total_seconds() if isinstance(lifetime, timedelta) else float(lifetime)
    if not 0 < seconds < float("inf"):
        raise ValueError(f"a run's lifetime must be a positive duration, not {lifetime!r}")
    return seconds


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def agent(
    name: str, **options: Unpack[AgentOptions]
) -> Callable[[AgentFn[I, O] | NoInputFn[O]], Agent[I, O]]:
    """Decorate ``async def fn(ctx, input) -> output`` (or ``async def fn(ctx) -> output``)
    into an ``Agent``; ``options`` are ``Agent``'s keyword arguments (``AgentOptions``).

    Example:
        >>> from sojourn.actors import agent
        >>> @agent("echo")
        ... async def echo(ctx, text: str) -> str:
        ...     return text
        >>> echo.name, echo.input_type
        ('echo', <class 'str'>)
    """

    unknown = sorted(options.keys() - AgentOptions.__annotations__.keys())
    if unknown:
        raise TypeError(f"agent() got an unexpected keyword argument {unknown[0]!r}")

    def wrap(fn: AgentFn[I, O] | NoInputFn[O]) -> Agent[I, O]:
        return Agent(name, fn, **options)

    return wrap
