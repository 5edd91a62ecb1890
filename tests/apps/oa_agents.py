"""OpenAI Agents SDK agents run by sojourn, for tests/actors/integrations/test_openai_agents.py
(also in worker processes, killed for real).

The model is the SDK's chat-completions model against the test's scripted server
(tests/llm_server.py, at $SOJOURN_OA_LLM_URL), which answers from the conversation so far.
Every tool execution is counted in the SQLite database at $SOJOURN_OA_DB, and each tool's
effect is written there once per idempotency key: ``executions`` counts what really ran,
``effects`` what happened to the world.

$SOJOURN_OA_CRASH_AFTER names a step (``tool:lookup_order``): the worker SIGKILLs itself right
after that step's function returned, before its completion is recorded (the ``after_step``
fault seam): the tool's effect happened, the next model call has not been made.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.models.openai_provider import OpenAIProvider

from sojourn.actors import Context, agent, current_step
from sojourn.actors.integrations.openai_agents import SojournRunner
from sojourn.actors.worker import faults

CRASH_AFTER = os.environ.get("SOJOURN_OA_CRASH_AFTER", "")


def _crash(seam: str, where: str) -> None:
    if seam == "after_step" and CRASH_AFTER and f"{CRASH_AFTER!r}" in where:
        os.kill(os.getpid(), signal.SIGKILL)


if CRASH_AFTER:
    faults.observe(_crash)


def connect() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["SOJOURN_OA_DB"], timeout=30)
    db.execute("CREATE TABLE IF NOT EXISTS executions (tool TEXT, key TEXT, attempt INTEGER)")
    db.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, tool TEXT, what TEXT)")
    return db


def apply(tool: str, what: str) -> None:
    """Count the execution; apply the effect once per idempotency key."""
    info = current_step()
    with connect() as db:
        db.execute(
            "INSERT INTO executions VALUES (?, ?, ?)", (tool, info.idempotency_key, info.attempt)
        )
        db.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?)", (info.idempotency_key, tool, what)
        )


@function_tool
def lookup_order(order: str) -> dict[str, Any]:
    """Look an order up (and note that it was looked up)."""
    apply("lookup_order", order)
    return {"order": order, "status": "delivered", "paid": 20}


@function_tool(needs_approval=True)
async def refund(order: str, amount: int) -> str:
    """Refund an order: needs a human's approval."""
    apply("refund", f"{order}:{amount}")
    return f"refunded {amount} on {order}"


support = Agent(
    name="support",
    instructions="Help with orders.",
    model="scripted-model",
    tools=[lookup_order, refund],
)


def runner() -> SojournRunner:
    provider = OpenAIProvider(
        api_key="test", base_url=os.environ["SOJOURN_OA_LLM_URL"], use_responses=False
    )
    return SojournRunner(provider, prices={"scripted-model": (2.0, 8.0)}, approvers=("alice",))


@agent("oa-support")
async def oa_support(ctx: Context, question: str) -> dict[str, Any]:
    result = await runner().run(ctx, support, question, run_config=RunConfig(tracing_disabled=True))
    usage = result.context_wrapper.usage
    return {
        "output": result.final_output,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "requests": usage.requests,
        },
    }
