"""The Pydantic AI side of ``mock_model`` and ``mock_mcp``: a scripted model and a scripted
toolset put in place of a ``SojournAgent``'s own, through the integration's test seams
(``MODEL_STAND_INS``, ``TOOLSET_STAND_INS``).

Imported only when a mock's target is a Pydantic AI object, so the kit needs pydantic-ai only
for testing agents that use it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai import Agent
from pydantic_ai import messages as pai
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext, Tool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
from pydantic_ai.usage import RequestUsage

from ..integrations import pydantic_ai as integration
from ..integrations.pydantic_ai import SojournAgent
from ..llm._types import Message, ModelRequest, ModelResponse, ToolCall
from ..llm._types import Tool as LlmTool

if TYPE_CHECKING:
    from .models import ModelMock

__all__ = [
    "is_agent",
    "is_toolset",
    "model_name",
    "put_model_in_place",
    "put_toolset_in_place",
    "scripted_toolset",
]


def is_agent(target: object) -> bool:
    return isinstance(target, (SojournAgent, Agent))


def is_toolset(target: object) -> bool:
    return isinstance(target, AbstractToolset)


def _serves(target: object, owner: SojournAgent[Any, Any]) -> bool:
    return owner is target or owner.agent is target


def model_name(target: SojournAgent[Any, Any] | Agent[Any, Any]) -> str:
    """The name the agent's own model goes by: its ``model_name``, or the name part of a
    ``"provider:name"``."""
    agent = target.agent if isinstance(target, SojournAgent) else target
    model = agent.model
    if isinstance(model, Model):
        return model.model_name
    if isinstance(model, str):
        return model.split(":", 1)[-1]
    return "scripted"


# --- the model ----------------------------------------------------------------------------


def put_model_in_place(mock: ModelMock) -> Callable[[], None]:
    """Make ``mock.target``'s runs use a scripted model answered by ``mock``; returns what
    takes it away."""
    stand_in = _ScriptedModel(mock)
    target = mock.target

    def swap(owner: SojournAgent[Any, Any]) -> Model | None:
        return stand_in if _serves(target, owner) else None

    integration.MODEL_STAND_INS.append(swap)
    return lambda: integration.MODEL_STAND_INS.remove(swap)


class _ScriptedModel(FunctionModel):
    """A Pydantic AI model named as the agent's own, whose answers are ``mock``'s."""

    def __init__(self, mock: ModelMock) -> None:
        async def answer(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
            return _response(await mock.answer(_request(messages, info)))

        super().__init__(answer, model_name=mock.name)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[pai.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


def _request(messages: list[pai.ModelMessage], info: AgentInfo) -> ModelRequest:
    """The conversation as ``ctx.llm`` would send it: what a script reads and a test checks."""
    out: list[Message] = []
    if info.instructions:
        out.append(Message.system(info.instructions))
    for message in messages:
        if isinstance(message, pai.ModelRequest):
            out += [m for part in message.parts if (m := _message(part)) is not None]
        else:
            text = "".join(p.content for p in message.parts if isinstance(p, pai.TextPart))
            calls = tuple(
                ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_json_str())
                for p in message.parts
                if isinstance(p, pai.ToolCallPart)
            )
            out.append(Message.assistant(text or None, calls))
    tools = tuple(
        LlmTool(t.name, t.description or "", t.parameters_json_schema)
        for t in (*info.function_tools, *info.output_tools)
    )
    return ModelRequest(messages=tuple(out), tools=tools)


def _message(part: pai.ModelRequestPart) -> Message | None:
    if isinstance(part, pai.SystemPromptPart):
        return Message.system(part.content)
    if isinstance(part, pai.UserPromptPart):
        content = part.content
        if not isinstance(content, str):
            content = " ".join(c if isinstance(c, str) else repr(c) for c in content)
        return Message.user(content)
    if isinstance(part, pai.ToolReturnPart):
        return Message.tool(part.tool_call_id, part.model_response_str())
    if isinstance(part, pai.RetryPromptPart):
        if part.tool_name is None:
            return Message.user(part.model_response())
        return Message.tool(part.tool_call_id, part.model_response())
    return None


def _response(answer: ModelResponse) -> pai.ModelResponse:
    parts: list[pai.ModelResponsePart] = []
    if answer.text:
        parts.append(pai.TextPart(answer.text))
    parts += [pai.ToolCallPart(c.name, c.arguments, c.id) for c in answer.tool_calls]
    return pai.ModelResponse(
        parts=parts,
        usage=RequestUsage(
            input_tokens=answer.usage.input_tokens, output_tokens=answer.usage.output_tokens
        ),
        provider_response_id=answer.id,
        finish_reason="tool_call" if answer.tool_calls else "stop",
    )


# --- the toolset --------------------------------------------------------------------------


def scripted_toolset(
    server: AbstractToolset[Any],
    tools: Mapping[str, Callable[..., Any] | Tool[Any]],
    record: Callable[[str, dict[str, Any]], None],
) -> AbstractToolset[Any]:
    """A toolset offering ``tools`` (schemas from their signatures, or a ``Tool``'s own) under
    ``server``'s id, each call passed to ``record`` first."""
    listed: list[Tool[Any]] = []
    for name, fn in tools.items():
        if isinstance(fn, Tool):
            if fn.name != name:
                raise ValueError(f"the tool {fn.name!r} is scripted under the name {name!r}")
            listed.append(fn)
        elif callable(fn):
            listed.append(Tool(fn, name=name))
        else:
            raise TypeError(f"the scripted tool {name!r} is a function or a Tool, not {fn!r}")
    toolset_id = getattr(server, "id", None)
    inner = FunctionToolset(listed, id=toolset_id if isinstance(toolset_id, str) else None)
    return _RecordingToolset(wrapped=inner, record=record)


@dataclass(kw_only=True)
class _RecordingToolset(WrapperToolset[Any]):
    """A toolset whose every call is recorded before it runs."""

    record: Callable[[str, dict[str, Any]], None]

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        self.record(name, dict(tool_args))
        return await self.wrapped.call_tool(name, tool_args, ctx, tool)


def put_toolset_in_place(
    server: AbstractToolset[Any], stand_in: AbstractToolset[Any]
) -> Callable[[], None]:
    """Make every ``SojournAgent`` run whose toolsets include ``server`` (itself, not a copy)
    use ``stand_in`` instead; returns what takes it away."""

    def swap(
        owner: SojournAgent[Any, Any], leaf: AbstractToolset[Any]
    ) -> AbstractToolset[Any] | None:
        return stand_in if leaf is server else None

    integration.TOOLSET_STAND_INS.append(swap)
    return lambda: integration.TOOLSET_STAND_INS.remove(swap)
