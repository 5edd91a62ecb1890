"""A Pydantic AI research agent run durably by sojourn: every model request and tool call is
a journaled step, and sending the report waits for a human's approval, holding no process.

Needs the extra: ``pip install 'sojourn[pydantic-ai]'``. Run it::

    sojourn dev --app examples.research_agent
    sojourn start researcher --run-id r1 \
        --input '{"topic": "durable execution", "to": "ada@example.com"}'
    sojourn status r1          # waiting on signal:approval.send_report (the draft is in history)
    sojourn history r1         # llm:..., tool:search_web, tool:read_page, llm:... steps
    sojourn signal r1 approval.send_report --payload '{"approve": true, "by": "ada"}'
    sojourn status r1          # completed: the report was sent; spend shows tokens and USD

Deny instead (``"approve": false, "note": "..."``) and the model is told, and says so.

The model is a pydantic-ai ``FunctionModel`` scripted from the conversation, so the example
needs no API key and answers the same every time. To use a real model, pass one to the
``Agent`` (``Agent("openai:gpt-5", ...)``) and give ``SojournAgent`` its ``prices`` and a
``model_retry`` policy for its transient errors; nothing else changes.
"""

from __future__ import annotations

import msgspec
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sojourn.actors import Context, agent
from sojourn.actors.pydantic_ai import Price, SojournAgent


class Request(msgspec.Struct, frozen=True):
    topic: str
    to: str


class Report(msgspec.Struct, frozen=True):
    answer: str
    input_tokens: int
    output_tokens: int
    requests: int


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A stand-in for an LLM: search, read the first hit, send a report, then answer."""
    back = [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    if not back:
        prompt = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
        return ModelResponse(parts=[ToolCallPart("search_web", {"query": prompt})])
    last = back[-1]
    if last.tool_name == "search_web":
        hits = last.content if isinstance(last.content, list) else [""]
        return ModelResponse(parts=[ToolCallPart("read_page", {"url": str(hits[0])})])
    if last.tool_name == "read_page":
        text = f"Summary: {str(last.content)[:120]}"
        return ModelResponse(parts=[ToolCallPart("send_report", {"text": text})])
    return ModelResponse(parts=[TextPart(f"Done. The report tool said: {last.content}")])


research = Agent(
    FunctionModel(scripted_model),
    deps_type=str,  # whom the report goes to
    instructions="Research the topic, then send a short report.",
    name="research",
)


@research.tool_plain
def search_web(query: str) -> list[str]:
    """Search the web (a stand-in: a real tool calls a search API here)."""
    slug = "-".join(query.lower().split())[:40]
    return [f"https://example.com/{slug}", f"https://example.org/{slug}"]


@research.tool_plain
async def read_page(url: str) -> str:
    """Fetch a page's text (a stand-in)."""
    return f"{url} explains that a durable run records each step and resumes after a crash."


@research.tool(requires_approval=True)
def send_report(ctx: RunContext[str], text: str) -> str:
    """Mail the report: a side effect a human approves first."""
    return f"sent to {ctx.deps} ({len(text)} characters)"


durable = SojournAgent(
    research,
    prices={"function:scripted_model:": Price(input=1.25, output=10.0)},
    approvers=("editor",),
    approval_timeout=24 * 3600,
)


@agent("researcher", version="2026-12-01")
async def researcher(ctx: Context, req: Request) -> Report:
    result = await durable.run(ctx, f"Research {req.topic}", deps=req.to)
    usage = result.usage
    return Report(
        answer=result.output,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        requests=usage.requests,
    )
