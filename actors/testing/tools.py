"""``mock_mcp``: an MCP server's tools replaced, for a test, by scripted functions, calls kept.

For the MCP servers an agent reaches through the Pydantic AI integration (``ctx.mcp``'s own
servers are tested against a real server, docs/mcp.md): there a server is a toolset of the
agent (``pydantic_ai.mcp.MCPToolset``, sojourn's ``McpToolset``, or any ``AbstractToolset``),
and ``SojournAgent`` runs each of its tool calls as a step (``tool:<name>``; ``mcp:...`` for an
``McpToolset``'s). ``mock_mcp(server, tools)`` puts a toolset
of scripted functions in the server's place in every ``SojournAgent`` run for a ``with``
block, so an agent that uses a server in production is tested without one::

    from sojourn.actors.testing import mock_mcp
    from myapp.agents import docs_server            # MCPToolset("https://docs.example/mcp")

    def search(query: str) -> list[str]:
        return ["https://docs.example/durable"]

    async def test_research(sojourn_env) -> None:
        with mock_mcp(docs_server, {"search": search}) as docs:
            run_id = await sojourn_env.start("researcher", {"topic": "durability"})
            await sojourn_env.result(run_id)
        (call,) = docs.calls
        assert call.tool == "search" and call.arguments == {"query": "durability"}
        assert call.idempotency_key == f"{run_id}/{call.position}"

What is covered: the server's tools as the model sees them (the scripted tools, named as the
keys, their JSON schemas from the functions' signatures, or a ``pydantic_ai.Tool``'s own) and
their calls (arguments validated as Pydantic AI validates a function tool's; a ``ModelRetry``,
``ToolFailed``, ``ApprovalRequired`` or ``CallDeferred`` a function raises is handled as the
server's would be); wrappers around the server (``server.prefixed("docs")``, ``filtered``,
``approval_required``...) stay and apply to the stand-in. The server is never started or
asked. Not covered: its resources, prompts, instructions (``include_instructions``), sampling,
elicitation and notifications, and the conversion of MCP content (a function returns what the
tool's result is after pydantic-ai's conversion: a string, a dict...). A tool the model calls
that is not scripted is unknown to the agent, as a tool the server does not list would be.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from ..agents.steps import current_step

__all__ = ["MCPCall", "MCPMock", "mock_mcp"]


@dataclass(frozen=True, slots=True)
class MCPCall:
    """One call of a scripted tool: which tool, which execution of which step, what
    arguments (as validated)."""

    tool: str
    run_id: str
    position: int
    attempt: int
    idempotency_key: str
    in_doubt: bool
    arguments: dict[str, Any]


class MCPMock:
    """The toolset ``mock_mcp`` puts in ``server``'s place; ``calls`` lists every call of its
    tools, oldest first, across every run that made one."""

    def __init__(self, server: Any, tools: Mapping[str, Callable[..., Any] | Any]) -> None:
        from . import _pydantic_ai  # pydantic-ai is needed only here

        if not _pydantic_ai.is_toolset(server):
            raise TypeError(f"mock_mcp stands in for a Pydantic AI toolset, not {server!r}")
        self.server = server
        self.calls: list[MCPCall] = []
        self.toolset = _pydantic_ai.scripted_toolset(server, dict(tools), self._record)
        self._remove: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"MCPMock({self.server!r}, calls={len(self.calls)})"

    def _record(self, tool: str, arguments: dict[str, Any]) -> None:
        s = current_step()
        step = (s.run_id, s.position, s.attempt, s.idempotency_key, s.in_doubt)
        self.calls.append(MCPCall(tool, *step, arguments=arguments))

    def __enter__(self) -> Self:
        if self._remove is not None:
            raise RuntimeError(f"the stand-in for {self.server!r} is already in place")
        from . import _pydantic_ai

        self._remove = _pydantic_ai.put_toolset_in_place(self.server, self.toolset)
        return self

    def __exit__(self, *exc: object) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()


def mock_mcp(server: Any, tools: Mapping[str, Callable[..., Any] | Any]) -> MCPMock:
    """Scripted stand-ins for the tools of ``server`` (an MCP server's toolset, as given to the
    Pydantic AI agent), in place for a ``with`` block; see the module docstring.

    Args:
        server: the toolset object the agent was given (``MCPToolset(...)``; any Pydantic AI
            ``AbstractToolset`` works). Wrappers around it are kept; a copy is not matched.
        tools: tool name to a function (sync or async; a first parameter annotated
            ``RunContext`` gets the run context) or a ``pydantic_ai.Tool`` of that name.

    Raises:
        TypeError: ``server`` is not a toolset, or a tool is neither a function nor a ``Tool``.
        ValueError: a ``Tool`` is given under a name that is not its own.
    """
    return MCPMock(server, tools)
