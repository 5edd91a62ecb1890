"""LangGraph graphs as durable sojourn runs (docs/langgraph.md).

The documented import path; the code lives in ``sojourn.actors.integrations.langgraph``.
"""

from sojourn.actors.integrations.langgraph import (
    Answer,
    SojournChatModel,
    SojournGraph,
    approval,
    ask,
    from_json,
    to_json,
)

__all__ = ["Answer", "SojournChatModel", "SojournGraph", "approval", "ask", "from_json", "to_json"]
