"""Model requests as journaled steps: ``ctx.llm(model, messages)``.

A ``Model`` is anything with a ``name`` and an async ``request``; two ship: ``OpenAIChat`` (any
OpenAI-compatible ``/chat/completions`` endpoint: OpenAI, vLLM, Ollama, LiteLLM, OpenRouter)
and ``ScriptedModel`` (offline and deterministic, for examples and tests). A ``PriceTable``
turns a request's tokens into USD. See docs/llm.md.

Example:
    >>> from sojourn.actors import Context, agent
    >>> from sojourn.actors.llm import ScriptedModel
    >>> model = ScriptedModel(["Hello, Ada!"])
    >>> @agent("hello")
    ... async def hello(ctx: Context, name: str) -> str:
    ...     answer = await ctx.llm(model, f"Greet {name}.")
    ...     return answer.text
"""

from ._call import LLM_RETRY
from ._openai import OpenAIChat
from ._prices import Price, PriceTable
from ._scripted import ScriptedModel
from ._types import (
    Message,
    Model,
    ModelError,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ModelUnavailable,
    OnToken,
    Tool,
    ToolCall,
)

__all__ = [
    "LLM_RETRY",
    "Message",
    "Model",
    "ModelError",
    "ModelProtocolError",
    "ModelRateLimited",
    "ModelRequest",
    "ModelRequestRejected",
    "ModelResponse",
    "ModelUnavailable",
    "OnToken",
    "OpenAIChat",
    "Price",
    "PriceTable",
    "ScriptedModel",
    "Tool",
    "ToolCall",
]
