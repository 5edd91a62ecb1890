"""An OpenAI Agents SDK support desk as a durable sojourn run (docs/openai-agents.md).

A triage agent hands refund questions off to a refunds agent, which looks the order up and
refunds it; the refund needs a human's approval. Every model call and tool call is a
journaled step: a worker killed halfway resumes on another without a second model call or a
second refund. Run it offline (a scripted model answers, the SDK's own ``ScriptedModel``)::

    sojourn dev --app examples.openai_agents
    sojourn start support-desk --run-id d1 --input '"Please refund order A1"'
    sojourn status d1        # waiting on signal:approval.refund
    sojourn signal d1 approval.refund --payload '{"approve": true, "by": "ada"}'
    sojourn result d1
    sojourn history d1       # llm:, tool: steps, the approval

or against a real model: set ``SOJOURN_OPENAI_BASE_URL`` (an OpenAI-compatible server, e.g.
``http://localhost:11434/v1`` for Ollama) and ``SOJOURN_OPENAI_MODEL``; ``OPENAI_API_KEY``
is the key.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.models.interface import Model, ModelProvider
from agents.models.openai_provider import OpenAIProvider
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as call
from agents.usage import Usage

from sojourn.actors import Context, agent, current_step
from sojourn.actors.openai_agents import SojournRunner

MODEL = os.environ.get("SOJOURN_OPENAI_MODEL", "scripted-support")

ORDERS = {"A1": {"item": "kettle", "paid": 20}, "B2": {"item": "lamp", "paid": 35}}


@function_tool
def lookup_order(order: str) -> dict[str, Any]:
    """Look an order up by its id."""
    return {"order": order, **ORDERS.get(order, {"item": "unknown", "paid": 0})}


@function_tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund ``amount`` on an order (a human approves each refund)."""
    # A real refund would pass the step's idempotency key to the payment provider, so that a
    # refund cut off by a crash and run again is made once.
    return f"refunded {amount} on {order} (ref {current_step().idempotency_key})"


refunds = Agent(
    name="refunds",
    instructions="You handle refunds: look the order up, then refund what was paid.",
    model=MODEL,
    tools=[lookup_order, refund],
)
triage = Agent(
    name="triage",
    instructions="You route questions: refunds go to the refunds agent.",
    model=MODEL,
    handoffs=[refunds],
)


def scripted(request: ModelCall) -> Any:
    """The offline model: it reads the conversation so far and answers the same every time."""
    items = request.input if isinstance(request.input, list) else []
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    usage = Usage(requests=1, input_tokens=10 * (len(items) + 1), output_tokens=12)
    if (request.system_instructions or "").startswith("You route"):
        return ModelStep(output=[call("transfer_to_refunds", {}, call_id="h1")], usage=usage)
    done = len(outputs) - 1  # the handoff's output came first
    if done == 0:
        return ModelStep(output=[call("lookup_order", {"order": "A1"}, call_id="c1")], usage=usage)
    if done == 1:
        paid = ast.literal_eval(str(outputs[-1]["output"]))["paid"]  # the SDK sends str(dict)
        args = {"order": "A1", "amount": paid}
        return ModelStep(output=[call("refund", args, call_id="c2")], usage=usage)
    return ModelStep(output=[assistant_message(f"Done: {outputs[-1]['output']}")], usage=usage)


class ScriptedProvider(ModelProvider):
    """A fresh scripted model for each call (each SDK turn asks the provider once)."""

    def get_model(self, model_name: str | None) -> Model:
        return ScriptedModel([ModelStep.respond(scripted)])


def provider() -> ModelProvider:
    base_url = os.environ.get("SOJOURN_OPENAI_BASE_URL")
    if base_url or os.environ.get("OPENAI_API_KEY"):
        return OpenAIProvider(base_url=base_url, use_responses=False)
    return ScriptedProvider()


runner = SojournRunner(
    provider(),
    prices={"scripted-support": (0.15, 0.60), "gpt-4o-mini*": (0.15, 0.60)},
    approvers=("ada",),
    approval_timeout=24 * 3600,
)


@agent("support-desk")
async def support_desk(ctx: Context, question: str) -> str:
    result = await runner.run(ctx, triage, question, run_config=RunConfig(tracing_disabled=True))
    return str(result.final_output)
