"""A Pydantic AI agent calling an MCP server's tools through ``McpToolset`` and ``ctx.mcp``
(a real nats-server, a real stdio server: ``tests/mcp_ledger_server.py``), and ``mock_mcp``
standing in for such a toolset without starting the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent as PaiAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sojourn.actors import Agent, Client, Context, Worker
from sojourn.actors.integrations.mcp_toolset import McpToolset
from sojourn.actors.pydantic_ai import SojournAgent
from sojourn.actors.testing import mock_mcp
from sojourn.broker import EmbeddedServer
from sojourn.schemas import StepStarted
from sojourn.schemas.config import Settings
from tests.actors.integrations.test_mcp import Ledger
from tests.apps.mcp_agents import ledger_server


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls ``ledger_put`` once, then says what it answered."""
    returns = [
        p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)
    ]
    if not returns:
        assert "ledger_put" in [t.name for t in info.function_tools]
        return ModelResponse(parts=[ToolCallPart("ledger_put", {"key": "p1", "value": "x"})])
    return ModelResponse(parts=[TextPart(f"done: {returns[-1].content}")])


def agents(ledger: Ledger) -> tuple[Agent[Any, Any], McpToolset]:
    toolset = McpToolset(ledger_server(str(ledger.path)))
    pai = PaiAgent(FunctionModel(model), toolsets=[toolset.prefixed("ledger")])
    durable = SojournAgent(pai)

    async def assistant(ctx: Context, prompt: str) -> str:
        result = await durable.run(ctx, prompt)
        return str(result.output)

    return Agent("mcp_assistant", assistant), toolset


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


async def test_an_mcp_toolset_call_is_an_mcp_step(
    nats_server: EmbeddedServer, client: Client, settings: Settings, ledger: Ledger
) -> None:
    agent, _ = agents(ledger)
    async with Worker([agent], nats=nats_server.url, settings=settings):
        run_id = await client.start("mcp_assistant", "go", run_id="pai-mcp")
        output = await client.result(run_id, timeout=60)
    assert "'seen': 1" in output and "'key': 'p1'" in output
    names = [
        e.name for d in await client.history(run_id) for e in d.events if isinstance(e, StepStarted)
    ]
    assert "mcp:ledger.put" in names and not [n for n in names if n.startswith("tool:")]
    assert len(ledger.calls("put", "p1")) == 1


async def test_mock_mcp_stands_in_for_an_mcp_toolset(
    nats_server: EmbeddedServer, client: Client, settings: Settings, ledger: Ledger
) -> None:
    agent, toolset = agents(ledger)

    def put(key: str, value: str) -> str:
        return f"scripted {key}={value}"

    with mock_mcp(toolset, {"put": put}) as stand_in:
        async with Worker([agent], nats=nats_server.url, settings=settings):
            run_id = await client.start("mcp_assistant", "go", run_id="pai-mock")
            assert await client.result(run_id, timeout=60) == "done: scripted p1=x"
    (call,) = stand_in.calls
    assert call.tool == "put" and call.arguments == {"key": "p1", "value": "x"}
    assert ledger.servers() == []  # never started
