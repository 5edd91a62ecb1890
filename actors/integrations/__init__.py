"""Bridges to other agent frameworks (Pydantic AI, LangGraph)."""
