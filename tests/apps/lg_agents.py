"""LangGraph graphs run by sojourn, for tests/actors/integrations/test_langgraph.py (also in
worker processes, killed for real).

``lg-invoice``: a ReAct-style graph: the ``agent`` node asks the model (a ``SojournChatModel``
over ``OpenAIChat``, pointed at the test's scripted OpenAI-compatible server,
$SOJOURN_LG_MODEL_URL), the ``tools`` node runs the two tools it asked for, and ``review``
asks a human (``approval``) before ``send_invoice`` runs. Each tool applies its effect to the
SQLite database $SOJOURN_LG_DB once per idempotency key, and logs every execution there, so a
test can count both across processes. When $SOJOURN_LG_GATE is set, the model's second turn
waits until that file exists: the window in which a test kills the worker, after a tool's
effect and before the next model call.

``lg-ask``: one node that asks a question (``ask``) and one that uses a plain ``interrupt``.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sqlite3
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from sojourn.actors import Context, agent, current_step
from sojourn.actors.integrations.langgraph import (
    SojournChatModel,
    SojournGraph,
    approval,
    ask,
    to_json,
)
from sojourn.actors.llm import OpenAIChat


def db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["SOJOURN_LG_DB"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, tool TEXT, args TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS executions (what TEXT, key TEXT, attempt INT)")
    return conn


def executed(what: str) -> None:
    info = current_step()
    with db() as conn:
        conn.execute(
            "INSERT INTO executions VALUES (?, ?, ?)", (what, info.idempotency_key, info.attempt)
        )


def apply_once(tool_name: str, call_id: str, args: dict[str, Any]) -> bool:
    """The tool's effect, keyed by the step's idempotency key and the call: applied once."""
    key = f"{current_step().idempotency_key}/{call_id}"
    executed(f"tool:{tool_name}")
    with db() as conn:
        cur = conn.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?)",
            (key, tool_name, json.dumps(args, sort_keys=True)),
        )
        return cur.rowcount == 1


@tool
def reserve_stock(item: str, quantity: int) -> str:
    """Reserve stock of an item."""
    return f"reserved {quantity} x {item}"


@tool
def send_invoice(customer: str, amount: int) -> str:
    """Send an invoice to a customer."""
    return f"invoiced {customer} {amount} EUR"


TOOLS = {t.name: t for t in (reserve_stock, send_invoice)}

MODEL = OpenAIChat(
    "test-model",
    base_url=os.environ.get("SOJOURN_LG_MODEL_URL", "http://127.0.0.1:9/v1"),
    api_key="test",
    timeout=30.0,
)


class InvoiceState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    approvals: Annotated[list[dict[str, Any]], operator.add]


def gate(state: InvoiceState) -> None:
    """On the model's second turn, wait for $SOJOURN_LG_GATE (when set) to exist."""
    path = os.environ.get("SOJOURN_LG_GATE")
    turns_done = sum(isinstance(m, ToolMessage) for m in state["messages"])
    if not path or turns_done != 1 or os.path.exists(path):
        return
    executed("gate")
    while not os.path.exists(path):
        time.sleep(0.05)


async def call_model(state: InvoiceState) -> dict[str, Any]:
    await asyncio.to_thread(gate, state)  # in a thread, with the step's context
    executed("model")
    llm = SojournChatModel(model=MODEL).bind_tools(list(TOOLS.values()))
    return {"messages": [await llm.ainvoke(state["messages"])]}


def last_calls(state: InvoiceState) -> list[dict[str, Any]]:
    last = state["messages"][-1]
    return [dict(c) for c in last.tool_calls] if isinstance(last, AIMessage) else []


def review(state: InvoiceState) -> dict[str, Any]:
    (call,) = [c for c in last_calls(state) if c["name"] == "send_invoice"]
    decision = approval("send_invoice", call["args"])
    return {
        "approvals": [
            {"approved": decision.approved, "by": decision.by, "verified": decision.verified}
        ]
    }


def run_tools(state: InvoiceState) -> dict[str, Any]:
    out = []
    for call in last_calls(state):
        name = call["name"]
        if name == "send_invoice" and not (
            state["approvals"] and state["approvals"][-1]["approved"]
        ):
            content = "denied by a human"
        else:
            apply_once(name, call["id"], call["args"])
            content = TOOLS[name].invoke(call["args"])
        out.append(ToolMessage(content=content, tool_call_id=call["id"], name=name))
    return {"messages": out}


def route(state: InvoiceState) -> str:
    calls = last_calls(state)
    if not calls:
        return END
    return "review" if any(c["name"] == "send_invoice" for c in calls) else "tools"


builder = StateGraph(InvoiceState)
builder.add_node("agent", call_model)
builder.add_node("review", review)
builder.add_node("tools", run_tools)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["review", "tools", END])
builder.add_edge("review", "tools")
builder.add_edge("tools", "agent")
invoice_graph = builder.compile()

durable_invoice = SojournGraph(
    invoice_graph, kinds={"agent": "llm", "tools": "tool"}, approvers=("alice",)
)


@agent("lg-invoice")
async def lg_invoice(ctx: Context, order: str) -> dict[str, Any]:
    state = await durable_invoice.ainvoke(ctx, {"messages": [("user", order)], "approvals": []})
    return {
        "answer": state["messages"][-1].content,
        "approvals": state["approvals"],
        "state": to_json(state),
    }


# --- questions: ask and a plain interrupt ------------------------------------------------------


class AskState(TypedDict):
    name: str
    asked_by: str | None
    colour: str


def who(state: AskState) -> dict[str, Any]:
    answer = ask("what is your name?")
    return {"name": str(answer.value), "asked_by": answer.by}


def colour(state: AskState) -> dict[str, Any]:
    return {"colour": interrupt(f"{state['name']}, your favourite colour?")}


asking = StateGraph(AskState)
asking.add_node("who", who)
asking.add_node("colour", colour)
asking.add_edge(START, "who")
asking.add_edge("who", "colour")
asking.add_edge("colour", END)
durable_ask = SojournGraph(asking.compile())


@agent("lg-ask")
async def lg_ask(ctx: Context, _: None) -> dict[str, Any]:
    state = await durable_ask.ainvoke(ctx, {"name": "", "asked_by": None, "colour": ""})
    return dict(state)


# --- parallel nodes that both interrupt ------------------------------------------------------


class FanState(TypedDict):
    answers: Annotated[list[str], operator.add]


def left(state: FanState) -> dict[str, Any]:
    return {"answers": [f"left={interrupt('left?')}"]}


def right(state: FanState) -> dict[str, Any]:
    return {"answers": [f"right={interrupt('right?')}"]}


def join(state: FanState) -> dict[str, Any]:
    return {"answers": ["joined"]}


fanning = StateGraph(FanState)
fanning.add_node("left", left)
fanning.add_node("right", right)
fanning.add_node("join", join)
fanning.add_edge(START, "left")
fanning.add_edge(START, "right")
fanning.add_edge(["left", "right"], "join")
fanning.add_edge("join", END)
durable_fan = SojournGraph(fanning.compile())


@agent("lg-fan")
async def lg_fan(ctx: Context, _: None) -> list[str]:
    state = await durable_fan.ainvoke(ctx, {"answers": []})
    return list(state["answers"])


# --- one node, two interrupts ------------------------------------------------------------------


class FormState(TypedDict):
    form: dict[str, Any]


def fill(state: FormState) -> dict[str, Any]:
    name = interrupt("name?")
    city = interrupt(f"{name}, which city?")
    return {"form": {"name": name, "city": city}}


forms = StateGraph(FormState)
forms.add_node("fill", fill)
forms.add_edge(START, "fill")
forms.add_edge("fill", END)
durable_form = SojournGraph(forms.compile())


@agent("lg-form")
async def lg_form(ctx: Context, _: None) -> dict[str, Any]:
    state = await durable_form.ainvoke(ctx, {"form": {}})
    return dict(state["form"])
