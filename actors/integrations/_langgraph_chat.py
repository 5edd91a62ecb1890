"""``SojournChatModel``: a LangChain chat model that sends its requests through a sojourn
``Model`` (``OpenAIChat`` for any OpenAI-compatible endpoint, ``ScriptedModel`` offline).

Inside a graph node run by ``SojournGraph`` (a step), each request carries the step's
idempotency key to the provider and charges its tokens and cost to the step, so the run's
budget counts them as it counts ``ctx.llm``'s. Outside a step it is a plain chat model.
LangChain's tool binding works (``bind_tools``): the tools are sent in the OpenAI function
format, and the answer's tool calls come back as ``AIMessage.tool_calls``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from ..agents.steps import current_info
from ..llm import Message, ModelRequest, ModelResponse, PriceTable, Tool, ToolCall
from ..llm._call import priced

__all__ = ["SojournChatModel", "to_messages"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def to_messages(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """LangChain messages as sojourn's chat-completions messages."""
    out: list[Message] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append(Message.system(_text(m.content)))
        elif isinstance(m, HumanMessage):
            out.append(Message.user(_text(m.content)))
        elif isinstance(m, AIMessage):
            calls = tuple(
                ToolCall(id=c["id"] or "", name=c["name"], arguments=json.dumps(c["args"]))
                for c in m.tool_calls
            )
            out.append(Message.assistant(_text(m.content) or None, calls))
        elif isinstance(m, ToolMessage):
            out.append(Message.tool(m.tool_call_id, _text(m.content)))
        else:
            raise TypeError(f"SojournChatModel cannot send a {type(m).__name__}")
    return tuple(out)


def _ai_message(response: ModelResponse) -> AIMessage:
    calls = []
    for c in response.tool_calls:
        try:
            args = json.loads(c.arguments or "{}")
        except ValueError:
            args = {"__raw__": c.arguments}
        calls.append({"name": c.name, "args": args, "id": c.id, "type": "tool_call"})
    usage = response.usage
    return AIMessage(
        content=response.text,
        tool_calls=calls,
        # Not the provider's id as the message's: reducers such as ``add_messages`` replace a
        # message with the same id, and ids are not unique across every provider and proxy.
        usage_metadata={
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
        response_metadata={
            "model_name": response.model,
            "finish_reason": response.finish_reason,
            "id": response.id,
        },
    )


class SojournChatModel(BaseChatModel):
    """A LangChain chat model over a sojourn ``Model``::

        llm = SojournChatModel(model=OpenAIChat("gpt-5", base_url=..., api_key=...))
        answer = await llm.bind_tools([search]).ainvoke(state["messages"])

    Args:
        model: the sojourn ``Model`` that sends the requests.
        prices: a ``PriceTable`` (else the model's own ``prices``) for the cost charged.
    """

    model: Any
    prices: Any = None

    @property
    def _llm_type(self) -> str:
        return "sojourn"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": getattr(self.model, "name", "")}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        specs = []
        for t in tools:
            fn = convert_to_openai_tool(t)["function"]
            specs.append(
                Tool(
                    name=fn["name"],
                    description=fn.get("description", ""),
                    parameters=fn.get("parameters", {"type": "object", "properties": {}}),
                )
            )
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=tuple(specs), **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("SojournChatModel is async: use ainvoke")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = ModelRequest(
            messages=to_messages(messages),
            tools=tuple(kwargs.pop("tools", ())),
            stop=tuple(stop or ()),
            **kwargs,
        )
        info = current_info.get()
        name: str = self.model.name
        response = await self.model.request(
            request, idempotency_key=None if info is None else info.idempotency_key
        )
        table = self.prices or getattr(self.model, "prices", None) or PriceTable()
        usage = priced(response.usage, table, response.cost, response.model or name)
        if info is not None:
            info.charge(usage)
        return ChatResult(generations=[ChatGeneration(message=_ai_message(response))])
