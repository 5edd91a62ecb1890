"""Servers the examples talk to (not agents): ``notes_mcp``, the MCP server of
``examples/mcp_tools.py``."""
