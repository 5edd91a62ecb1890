"""Bridges to other agent frameworks (Pydantic AI)."""
