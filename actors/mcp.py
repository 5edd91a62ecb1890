"""MCP servers' tools as journaled steps, ``ctx.mcp`` (docs/mcp.md).

The documented import path; the code lives in ``sojourn.actors.integrations.mcp``.
"""

from sojourn.actors.integrations.mcp import McpCallLost, McpServer, McpToolError, McpUnavailable

__all__ = ["McpCallLost", "McpServer", "McpToolError", "McpUnavailable"]
