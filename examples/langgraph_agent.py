"""A LangGraph travel agent run durably by sojourn: every node is a journaled step, and booking
a flight waits for a human's approval (a LangGraph interrupt), holding no process.

Needs the extra: ``pip install 'sojourn[langgraph]'``. Run it::

    sojourn dev --app examples.langgraph_agent
    sojourn start travel-agent --run-id t1 --input '"a flight to Lisbon on May 4"'
    sojourn status t1          # waiting on signal:approval.book_flight
    sojourn history t1         # node:agent, node:tools... steps, the interrupt recorded
    sojourn signal t1 approval.book_flight --payload '{"approve": true, "by": "ada"}'
    sojourn status t1          # completed: the output is the graph's final state

Deny instead (``"approve": false``) and the tool tells the model, which says so.

The graph is LangGraph's own ReAct shape (``ToolNode``, ``tools_condition``). Its chat model
is a ``SojournChatModel`` over sojourn's ``ScriptedModel``, so the example needs no key and
answers the same every time. Set ``OPENAI_BASE_URL`` (and ``OPENAI_API_KEY``,
``OPENAI_MODEL``) to use any OpenAI-compatible endpoint instead: Ollama, vLLM, OpenAI.
"""

from __future__ import annotations

import json
import os
from typing import Any

from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from sojourn.actors import Context, agent, current_step
from sojourn.actors.langgraph import SojournChatModel, SojournGraph, approval, to_json
from sojourn.actors.llm import Model, ModelRequest, ModelResponse, OpenAIChat, ScriptedModel
from sojourn.actors.llm import ToolCall as Call


@tool
def search_flights(destination: str, date: str) -> list[dict[str, Any]]:
    """Search flights to a destination on a date (a stand-in for a real search API)."""
    return [{"flight": f"SJ{100 + len(destination)}", "to": destination, "date": date}]


@tool
def book_flight(flight: str) -> str:
    """Book a flight: a side effect a human approves first."""
    decision = approval("book_flight", {"flight": flight})
    if not decision.approved:
        return f"not booked: {decision.by} said no {decision.note}".strip()
    # Booked once: the step's idempotency key is the booking reference a provider dedupes by.
    return f"booked {flight} (ref {current_step().idempotency_key}, approved by {decision.by})"


TOOLS = [search_flights, book_flight]


def scripted(request: ModelRequest) -> ModelResponse:
    """A stand-in for an LLM: search, book the first hit, then answer."""
    back = [m for m in request.messages if m.role == "tool"]
    if not back:
        ask = request.messages[-1].content or ""
        args = {"destination": ask.split(" to ")[-1].split(" on ")[0], "date": "May 4"}
        return ModelResponse(tool_calls=(Call("c1", "search_flights", json.dumps(args)),))
    if len(back) == 1:
        hits = json.loads(back[0].content or "[]")
        args = {"flight": hits[0]["flight"] if hits else "none"}
        return ModelResponse(tool_calls=(Call("c2", "book_flight", json.dumps(args)),))
    return ModelResponse(text=f"Done. {back[-1].content}")


def model() -> Model:
    base_url = os.environ.get("OPENAI_BASE_URL")
    if base_url:
        name = os.environ.get("OPENAI_MODEL", "gpt-5-mini")
        return OpenAIChat(name, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY"))
    return ScriptedModel(scripted, name="scripted-travel")


llm = SojournChatModel(model=model()).bind_tools(TOOLS)


async def call_model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await llm.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", call_model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
travel = builder.compile()

durable = SojournGraph(travel, kinds={"agent": "llm", "tools": "tool"}, approvers=("ada",))


@agent("travel-agent", version="2026-12-05")
async def travel_agent(ctx: Context, request: str) -> dict[str, Any]:
    state = await durable.ainvoke(ctx, {"messages": [("user", request)]})
    answer = state["messages"][-1].content
    return {"answer": answer, "state": to_json(state)}
