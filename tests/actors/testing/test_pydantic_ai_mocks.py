"""``mock_model`` and ``mock_mcp`` under the Pydantic AI integration: a ``SojournAgent``'s model
and an MCP server's tools replaced for a test. The agent's own model and its server fail any
test that reaches them; the stand-ins keep production's step names (``llm:<model name>``,
``tool:<prefixed tool name>``) and prices, and every call is kept with its step."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool

from sojourn.actors import Agent as SojournAgentDef
from sojourn.actors import Context, RetryPolicy, agent, current_step
from sojourn.actors.integrations import pydantic_ai as integration
from sojourn.actors.integrations.pydantic_ai import Price, SojournAgent
from sojourn.actors.llm import Message
from sojourn.actors.llm import ModelResponse as LlmResponse
from sojourn.actors.testing import SojournEnv, mock_mcp, mock_model, turn
from sojourn.schemas.events import StepCompleted, StepFailed, StepStarted


def production_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise AssertionError("the production model was called")


class DocsServer(AbstractToolset[Any]):
    """What an ``MCPToolset`` is to the agent: a toolset whose tools live elsewhere. This one
    has no server behind it: listing or calling its tools fails the test."""

    @property
    def id(self) -> str | None:
        return "docs"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        raise AssertionError("the MCP server was asked for its tools")

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        raise AssertionError("the MCP server was called")


DOCS = DocsServer()
research = Agent(
    FunctionModel(production_model, model_name="prod-model"),
    toolsets=[DOCS.prefixed("docs")],
    instructions="Research the topic with the docs server.",
)
durable = SojournAgent(
    research,
    prices={"prod-model": Price(input=2.0, output=8.0)},
    tool_retry=RetryPolicy(retry_on=(ConnectionError,), attempts=3, initial_interval=0.01),
)


@agent("pai_research_mocked")
async def researcher(ctx: Context, topic: str) -> str:
    result = await durable.run(ctx, f"Research {topic}")
    return str(result.output)


async def ignore_events(ctx: RunContext[Any], events: AsyncIterable[Any]) -> None:
    async for _ in events:
        pass


@agent("pai_streaming_mocked")
async def streaming(ctx: Context, topic: str) -> str:
    """With an event stream handler, pydantic-ai streams its model requests."""
    result = await durable.run(ctx, f"Research {topic}", event_stream_handler=ignore_events)
    return str(result.output)


@pytest.fixture
def sojourn_agents() -> list[SojournAgentDef[Any, Any]]:
    return [researcher, streaming]


def search(query: str, limit: int = 3) -> list[str]:
    """Search the docs."""
    return [f"https://docs.example/{query}"][:limit]


async def test_a_scripted_model_calls_a_scripted_mcp_tool(sojourn_env: SojournEnv) -> None:
    script = [
        turn(calls=[("docs_search", {"query": "durability"})], tokens=(300, 30)),
        turn("Found https://docs.example/durability", tokens=(600, 60)),
    ]
    with mock_model(durable, script) as model, mock_mcp(DOCS, {"search": search}) as docs:
        run_id = await sojourn_env.start(researcher, "durability")
        assert await sojourn_env.result(run_id) == "Found https://docs.example/durability"
    assert integration.MODEL_STAND_INS == [] and integration.TOOLSET_STAND_INS == []

    (call,) = docs.calls
    # The arguments as validated against the scripted function: its defaults filled in.
    assert (call.tool, call.arguments) == ("search", {"query": "durability", "limit": 3})
    assert (call.run_id, call.attempt) == (run_id, 1)
    assert call.idempotency_key == f"{run_id}/{call.position}"

    first, second = model.calls
    assert model.name == "prod-model"
    assert first.request.messages[0] == Message.system("Research the topic with the docs server.")
    assert first.request.messages[-1] == Message.user("Research durability")
    docs_tool = {t.name: t for t in first.request.tools}["docs_search"]
    assert docs_tool.description == "Search the docs."
    assert set(docs_tool.parameters["properties"]) == {"query", "limit"}
    tool_message = second.request.messages[-1]
    assert tool_message.role == "tool" and tool_message.tool_call_id == "call-1-1"
    assert json.loads(tool_message.content or "") == ["https://docs.example/durability"]
    assert [c.position for c in model.calls] == [0, 2] and call.position == 1
    assert all(c.idempotency_key == f"{run_id}/{c.position}" for c in model.calls)

    history = await sojourn_env.history(run_id)
    started = [e.name for e in history if isinstance(e, StepStarted)]
    assert started == ["llm:prod-model", "tool:docs_search", "llm:prod-model"]
    state = await sojourn_env.state(run_id)
    assert state.spent_tokens == 990 and state.model_calls == 2
    expected = (900 * 2.0 + 90 * 8.0) / 1_000_000  # the SojournAgent's prices for prod-model
    assert state.spent_usd == pytest.approx(expected)


async def test_a_scripted_tool_that_fails_once_is_retried_under_the_same_key(
    sojourn_env: SojournEnv,
) -> None:
    async def flaky(query: str) -> str:
        if current_step().attempt == 1:
            raise ConnectionError("the docs server hung up")
        return f"found {query}"

    script: list[LlmResponse | str] = [turn(calls={"docs_search": {"query": "retries"}}), "done"]
    with mock_model(research, script) as model, mock_mcp(DOCS, {"search": flaky}) as docs:
        run_id = await sojourn_env.start(researcher, "retries")
        assert await sojourn_env.result(run_id) == "done"
    assert [(c.attempt, c.arguments) for c in docs.calls] == [
        (1, {"query": "retries"}),
        (2, {"query": "retries"}),
    ]
    assert docs.calls[0].idempotency_key == docs.calls[1].idempotency_key
    assert model.calls[1].request.messages[-1].content == "found retries"
    history = await sojourn_env.history(run_id)
    failed = [e for e in history if isinstance(e, StepFailed)]
    assert [e.error.type for e in failed] == ["ConnectionError"]
    assert sum(isinstance(e, StepCompleted) for e in history) == 3


async def test_a_streamed_request_is_answered_from_the_script(sojourn_env: SojournEnv) -> None:
    script = [turn("streamed answer", tokens=(5, 2))]
    with mock_model(durable, script) as model, mock_mcp(DOCS, {"search": search}):
        run_id = await sojourn_env.start(streaming, "streams")
        assert await sojourn_env.result(run_id) == "streamed answer"
    (call,) = model.calls
    assert call.request.messages[-1] == Message.user("Research streams")
    completed = [e for e in await sojourn_env.history(run_id) if isinstance(e, StepCompleted)]
    assert [(e.name, e.usage and e.usage.input_tokens) for e in completed] == [
        ("llm:prod-model", 5)
    ]


def test_the_stand_ins_are_taken_away_however_the_block_ends() -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        mock_model(durable, ["x"]),
        mock_mcp(DOCS, {"search": search}),
    ):
        assert len(integration.MODEL_STAND_INS) == len(integration.TOOLSET_STAND_INS) == 1
        raise RuntimeError("boom")
    assert integration.MODEL_STAND_INS == [] and integration.TOOLSET_STAND_INS == []
    with pytest.raises(TypeError):
        mock_mcp(object(), {"search": search})
    with pytest.raises(TypeError):
        mock_mcp(DOCS, {"search": "not a function"})
    assert mock_model(durable, ["x"], name="other").name == "other"
