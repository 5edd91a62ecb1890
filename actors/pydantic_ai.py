"""Pydantic AI agents as durable sojourn runs (docs/pydantic-ai.md).

The documented import path; the code lives in ``sojourn.actors.integrations.pydantic_ai``.
"""

from sojourn.actors.integrations.pydantic_ai import Price, Prices, SojournAgent

__all__ = ["Price", "Prices", "SojournAgent"]
