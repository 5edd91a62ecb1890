"""OpenAI Agents SDK agents as durable sojourn runs (docs/openai-agents.md).

The documented import path; the code lives in ``sojourn.actors.integrations.openai_agents``.
"""

from sojourn.actors.integrations.openai_agents import SojournRunner, durable_tool, run_context

__all__ = ["SojournRunner", "durable_tool", "run_context"]
