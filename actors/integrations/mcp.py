"""MCP tools as journaled steps: ``ctx.mcp(server, tool, args)`` (``pip install
'sojourn[mcp]'``, the official ``mcp`` SDK; docs/mcp.md).

A server is declared by name on the agent (``@agent(..., mcp=[McpServer(...)])``): a stdio
command the worker starts, or a streamable-HTTP URL. Each call is one step
(``mcp:<server>.<tool>``, kind ``tool``): its start is recorded before the request is sent and
its result after the answer, so a replay returns the recorded result without asking the
server, and a retry, a timeout or a budget applies as to any step. The call carries the step's
idempotency key in its ``_meta`` (``IDEMPOTENCY_META``), the same on every attempt.

What is durable is the journal, not the session: sessions are process resources of the
worker (``_mcp_sessions.py``), opened on first use, reopened after their server was lost or the
worker restarted, closed (a stdio server's process with them) when the worker stops.

A call whose server goes away before it answers (the process died, the connection dropped, no
answer within the timeout) may or may not have been applied: the attempt is in doubt
(``OutcomeUnknown``), settled by the call's ``in_doubt`` policy exactly as a step whose worker
died: ``"retry"`` (an idempotent tool) runs it again on a fresh session, within the retry
policy; ``"ask"`` (at most once) suspends the run until ``sojourn decide``; a reconcile
function is asked by idempotency key.

This module imports the ``mcp`` SDK; ``import sojourn.actors`` does not import this module.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent

from sojourn.schemas.errors import OutcomeUnknown, RetryableError
from sojourn.schemas.names import validate_token

from ..agents.steps import StepInfo, current_step
from ..core.retry import InDoubt, RetryPolicy, step
from ._mcp_sessions import Session, Sessions, sessions

if TYPE_CHECKING:
    from ..agents.context import Context

__all__ = [
    "IDEMPOTENCY_META",
    "McpCallLost",
    "McpServer",
    "McpToolError",
    "McpUnavailable",
    "call",
    "close_sessions",
]

IDEMPOTENCY_META = "sojourn/idempotency-key"
"""The ``_meta`` key of a tool call that carries the step's idempotency key
(``<run_id>/<position>``): a server that deduplicates on it applies a retried call once."""


class McpToolError(Exception):
    """The tool answered with an error (``isError``), or the server refused the request (an
    unknown tool, invalid arguments). Not retried unless the call's ``RetryPolicy`` lists it."""


class McpUnavailable(RetryableError):
    """The server could not be started or reached: the call was never sent. Retried within
    the call's retry policy (3 attempts without one)."""


class McpCallLost(OutcomeUnknown):
    """The server went away before it answered (its process died, its connection dropped, or
    no answer within the call's timeout): the call may or may not have been applied. Settled
    by the call's ``in_doubt`` policy."""


@dataclass(frozen=True, eq=True)
class McpServer:
    """An MCP server an agent's runs may call, by ``name``.

    Args:
        name: what ``ctx.mcp`` calls it by (a subject token: letters, digits, ``-``, ``_``).
        command: a stdio server: the program and its arguments, started by the worker on the
            first call (``env``, ``cwd``: its environment additions and working directory).
        url: a streamable-HTTP server's endpoint (instead of ``command``).
        in_doubt: what a call cut off mid-way is settled by (``"retry"``, ``"ask"`` or a
            reconcile function; see ``sojourn.actors.step``); a call may override it.
        retry: the calls' ``RetryPolicy`` (default: the agent's); a call may override it.
        timeout: seconds a call may wait for its answer before it counts as lost (in doubt).
        cost: USD charged to the run's budget for each answered call, ``costs`` per tool
            (default 0: a call still counts as a step and a tool call).
    """

    name: str
    command: Sequence[str] | None = None
    url: str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    in_doubt: InDoubt = "retry"
    retry: RetryPolicy | None = None
    timeout: float | None = None
    cost: float = 0.0
    costs: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_token(self.name, "MCP server name")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give a command or a url, not both")
        if self.command is not None:
            if isinstance(self.command, str) or not self.command:
                raise ValueError(f"MCP server {self.name!r}: command is a non-empty list")
            object.__setattr__(self, "command", tuple(self.command))
        if self.env is not None:
            object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "costs", dict(self.costs))
        if self.timeout is not None and not 0 < self.timeout < math.inf:
            raise ValueError(f"MCP server {self.name!r}: timeout is a positive number")
        for usd in (self.cost, *self.costs.values()):
            _check_cost(usd)

    def cost_of(self, tool: str) -> float:
        return self.costs.get(tool, self.cost)


def _check_cost(usd: float) -> None:
    if not (math.isfinite(usd) and usd >= 0):
        raise ValueError(f"a tool call's cost is a non-negative number of USD, not {usd!r}")


def servers_of(ctx: Context) -> dict[str, McpServer]:
    """The MCP servers declared on the agent of ``ctx``'s run."""
    agent = getattr(ctx._driver, "agent", None)
    declared: Sequence[McpServer] = getattr(agent, "mcp", ()) or ()
    return {s.name: s for s in declared}


async def call(
    ctx: Context,
    server: str | McpServer,
    tool: str,
    args: Mapping[str, Any] | None = None,
    *,
    in_doubt: InDoubt | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    usd: float | None = None,
) -> Any:
    """``ctx.mcp``: call ``tool`` of ``server`` with ``args`` as a journaled step and return
    its result (see ``Context.mcp``)."""
    spec = _resolve(ctx, server)
    if not isinstance(tool, str) or not tool:
        raise ValueError("ctx.mcp: a tool name is a non-empty string")
    cost = spec.cost_of(tool) if usd is None else usd
    _check_cost(cost)
    wait = spec.timeout if timeout is None else timeout
    arguments = dict(args or {})

    async def body() -> Any:
        return await _call_once(spec, tool, arguments, current_step(), wait, cost)

    fn = _step_fn(
        f"mcp:{spec.name}.{tool}",
        retry if retry is not None else spec.retry,
        in_doubt if in_doubt is not None else spec.in_doubt,
    )
    return await ctx.step(fn, body)


STEP_FNS_MAX = 1024
"""Step functions kept (one per step name and policies): sojourn caches facts per step
function, so calls share a few rather than each making one."""

_STEP_FNS: dict[tuple[str, RetryPolicy | None, Any], Callable[..., Awaitable[Any]]] = {}


def _step_fn(
    name: str, retry: RetryPolicy | None, in_doubt: InDoubt
) -> Callable[..., Awaitable[Any]]:
    key = (name, retry, in_doubt)
    try:
        fn = _STEP_FNS.get(key)
    except TypeError:  # an unhashable reconcile function: a step function of its own
        return step(name=name, kind="tool", retry=retry, in_doubt=in_doubt)(_run_body_copy())
    if fn is None:
        fn = step(name=name, kind="tool", retry=retry, in_doubt=in_doubt)(_run_body_copy())
        if len(_STEP_FNS) >= STEP_FNS_MAX:
            _STEP_FNS.clear()
        _STEP_FNS[key] = fn
    return fn


def _run_body_copy() -> Callable[..., Awaitable[Any]]:
    """A function of its own for each step function (``@step`` sets attributes on it)."""

    async def run_body(body: Callable[[], Awaitable[Any]]) -> Any:
        return await body()

    return run_body


def _resolve(ctx: Context, server: str | McpServer) -> McpServer:
    if isinstance(server, McpServer):
        return server
    declared = servers_of(ctx)
    spec = declared.get(server)
    if spec is None:
        known = ", ".join(sorted(declared)) or "none"
        raise KeyError(f"no MCP server {server!r} is declared on this agent (declared: {known})")
    return spec


async def _call_once(
    spec: McpServer,
    tool: str,
    args: dict[str, Any],
    info: StepInfo,
    timeout: float | None,
    cost: float,
) -> Any:
    """One attempt: the session (opened if need be), the request, its answer."""
    pool = sessions()
    session = await _live_session(pool, spec)
    client = session.client
    assert client is not None
    meta: Any = {IDEMPOTENCY_META: info.idempotency_key}
    try:
        async with asyncio.timeout(timeout):
            result = await client.call_tool(tool, args, meta=meta)
    except TimeoutError:
        raise McpCallLost(
            f"MCP server {spec.name!r}: no answer to {tool!r} within {timeout:g}s"
        ) from None
    except MCPError as e:
        if e.code == CONNECTION_CLOSED:
            await _lost(pool, session)
            raise McpCallLost(f"MCP server {spec.name!r} went away during {tool!r}") from e
        raise McpToolError(f"MCP server {spec.name!r} refused {tool!r}: {e.message}") from e
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as e:
        await _lost(pool, session)
        raise McpCallLost(f"MCP server {spec.name!r} went away during {tool!r}") from e
    if cost:
        info.charge(usd=cost)
    if not isinstance(result, CallToolResult):  # a task or an input request: not supported
        raise McpToolError(f"MCP server {spec.name!r}: {tool!r} did not answer with a result")
    if result.is_error:
        raise McpToolError(f"MCP tool {spec.name}.{tool} failed: {_text(result)}")
    return _value(result)


PING_TIMEOUT = 5.0
"""Seconds a session's server has to answer the ping before a call."""


async def _live_session(pool: Sessions, spec: McpServer) -> Session:
    """An open session of ``spec`` whose server answered a ping just now: a server that died
    while its session was idle is found out before the call is sent, so that call is not in
    doubt (a fresh session is opened once; failing that, the call was never sent)."""
    for _ in range(2):
        try:
            session = await pool.get(spec)
        except Exception as e:
            raise McpUnavailable(f"MCP server {spec.name!r} could not be reached: {e!r}") from e
        assert session.client is not None
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await session.client.send_ping()
            return session
        except (Exception, TimeoutError):
            await pool.drop(session)
    raise McpUnavailable(f"MCP server {spec.name!r} does not answer")


async def _lost(pool: Sessions, session: Session) -> None:
    await pool.drop(session)


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _value(result: CallToolResult) -> Any:
    """What a call returns and the run records: the tool's structured content when it gave
    one, else the text of a text-only answer, else its content blocks as JSON."""
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(c, TextContent) for c in result.content):
        return _text(result)
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]


async def close_sessions() -> None:
    """Close this event loop's MCP sessions now (a stopping worker does it by itself)."""
    from ._mcp_sessions import close_loop_sessions

    await close_loop_sessions()
