"""``McpToolset``: an MCP server declared for ``ctx.mcp`` (``McpServer``) as a Pydantic AI
toolset, so a ``SojournAgent``'s model can call its tools and each call goes through
``ctx.mcp`` (needs both extras: ``sojourn[mcp,pydantic-ai]``; docs/mcp.md).

The tools are listed through the worker's session of the server (not journaled: the server
must list the same tools on replay, as any MCP toolset's). A call is not wrapped in the
integration's ``tool:<name>`` step: ``SojournAgent`` sees the mark this toolset puts on its
tools' definitions (``JOURNALS_ITSELF``) and lets ``ctx.mcp`` journal it, as the step
``mcp:<server>.<tool>`` under the server's in-doubt policy, retry policy, timeout and cost. A
tool's error answer is given to the model as a ``ModelRetry``, as pydantic-ai's own MCP
toolsets do. ``mock_mcp`` stands in for an ``McpToolset`` as for any toolset.
"""

from __future__ import annotations

import contextvars
from typing import Any

from mcp.types import PaginatedRequestParams
from pydantic_ai.exceptions import ModelRetry, UserError
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from sojourn.schemas.errors import StepError

from ..agents.context import Context
from ._mcp_sessions import sessions
from .mcp import McpServer, McpToolError, _live_session

__all__ = ["JOURNALS_ITSELF", "RUN_CONTEXT", "McpToolset"]

JOURNALS_ITSELF = "sojourn_mcp_server"
"""The ``ToolDefinition.metadata`` key that marks a tool whose calls ``ctx.mcp`` journals (its
value: the server's name); wrappers such as ``prefixed`` keep it."""

RUN_CONTEXT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "sojourn_mcp_toolset_context", default=None
)
"""The sojourn run's ``Context`` while ``SojournAgent`` hands a marked call to the toolset."""

_ANY_ARGS = SchemaValidator(schema=core_schema.any_schema())


class McpToolset(AbstractToolset[Any]):
    """The tools of ``server``, for a Pydantic AI agent run by ``SojournAgent``.

    Args:
        server: the MCP server (``McpServer``); its policies apply to every call.
        max_retries: how often the model may retry a tool after an error answer.
    """

    def __init__(self, server: McpServer, *, max_retries: int = 1) -> None:
        self.server = server
        self.max_retries = max_retries

    @property
    def id(self) -> str | None:
        return f"sojourn-mcp-{self.server.name}"

    @property
    def label(self) -> str:
        return f"McpToolset({self.server.name!r})"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        session = await _live_session(sessions(), self.server)
        assert session.client is not None
        tools: dict[str, ToolsetTool[Any]] = {}
        cursor: str | None = None
        while True:
            page = None if cursor is None else PaginatedRequestParams(cursor=cursor)
            listed = await session.client.list_tools(params=page)
            for t in listed.tools:
                definition = ToolDefinition(
                    name=t.name,
                    description=t.description,
                    parameters_json_schema=dict(t.input_schema),
                    metadata={JOURNALS_ITSELF: self.server.name},
                )
                tools[t.name] = ToolsetTool(
                    toolset=self,
                    tool_def=definition,
                    max_retries=self.max_retries,
                    args_validator=_ANY_ARGS,
                )
            cursor = listed.next_cursor
            if not cursor:
                return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        run = RUN_CONTEXT.get()
        if run is None:
            raise UserError(f"{self.label}: its tools are called only in SojournAgent runs")
        try:
            return await run.mcp(self.server, name, tool_args)
        except StepError as e:
            if e.error_type == McpToolError.__name__:
                raise ModelRetry(str(e)) from e
            raise
