"""Pydantic AI agents run by sojourn, for
tests/actors/integrations/test_pydantic_ai.py (also in worker
processes, killed for real).

The models are pydantic-ai ``FunctionModel``s scripted from the conversation so far, so they
need no network and answer the same on every execution. Every real model request and tool
execution appends ``<event> <step name> <idempotency key> <attempt>`` to $SOJOURN_TEST_LOG, so
a test can count what really ran, across processes. The ``fetch`` tool blocks until the file
$SOJOURN_PAI_GATE exists (when that variable is set): the window in which a test kills the
worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sojourn.actors import Context, agent, current_step
from sojourn.actors.integrations.pydantic_ai import Price, SojournAgent


def log(event: str) -> None:
    path = os.environ.get("SOJOURN_TEST_LOG")
    if not path:
        return
    info = current_step()
    with open(path, "a") as f:
        f.write(f"{event} {info.name} {info.idempotency_key} {info.attempt}\n")
        f.flush()
        os.fsync(f.fileno())


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """Every tool return the model has been sent, in order."""
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def usage_of(result: Any) -> dict[str, int]:
    u = result.usage
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "requests": u.requests,
        "tool_calls": u.tool_calls,
    }


# --- three tools, one of which blocks: the crash test ----------------------------------


async def research_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    done = [p.tool_name for p in returns(messages)]
    if not done:
        return ModelResponse(parts=[ToolCallPart("search", {"query": "durable execution"})])
    if done == ["search"]:
        return ModelResponse(parts=[ToolCallPart("fetch", {"url": "https://example.com/a"})])
    if done == ["search", "fetch"]:
        return ModelResponse(parts=[ToolCallPart("summarize", {"text": "a long page"})])
    summary = returns(messages)[-1].content
    return ModelResponse(parts=[TextPart(f"report: {summary}")])


research = Agent(FunctionModel(research_model), deps_type=str, name="research")


@research.tool
async def search(ctx: RunContext[str], query: str) -> list[str]:
    log("exec")
    return [f"{ctx.deps}/{query}/1", f"{ctx.deps}/{query}/2"]


@research.tool_plain
def fetch(url: str) -> dict[str, str]:
    """A sync tool (pydantic-ai runs it in a thread), blocking while the test holds the gate."""
    log("exec")
    gate = os.environ.get("SOJOURN_PAI_GATE")
    while gate and not os.path.exists(gate):
        time.sleep(0.02)
    log("done")
    return {"url": url, "body": "a long page"}


@research.tool_plain
def summarize(text: str) -> str:
    log("exec")
    return f"summary of {text}"


durable_research = SojournAgent(research, prices={"function:research_model:": Price(2.0, 8.0)})


@agent("pai-research")
async def pai_research(ctx: Context, topic: str) -> dict[str, Any]:
    result = await durable_research.run(ctx, f"Research {topic}", deps="kb")
    return {"output": result.output, "usage": usage_of(result)}


# --- a tool that needs approval, and one that asks the model to retry -------------------


async def approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    back = returns(messages)
    if not back:
        return ModelResponse(parts=[ToolCallPart("draft", {"topic": "sojourn"})])
    last = back[-1]
    if last.tool_name == "draft" and last.outcome == "retried":
        return ModelResponse(parts=[ToolCallPart("draft", {"topic": "sojourn", "words": 50})])
    if last.tool_name == "draft":
        return ModelResponse(parts=[ToolCallPart("publish", {"text": str(last.content)})])
    return ModelResponse(parts=[TextPart(f"publish said: {last.content}")])


editor = Agent(FunctionModel(approval_model), name="editor")


@editor.tool_plain
def draft(topic: str, words: int = 0) -> str:
    log("exec")
    if words == 0:
        raise ModelRetry("say how many words")
    return f"{words} words on {topic}"


@editor.tool_plain(requires_approval=True)
def publish(text: str) -> str:
    log("exec")
    return f"published {text!r}"


durable_editor = SojournAgent(editor, approvers=("editor-in-chief",), approval_timeout=3600)


@agent("pai-approve")
async def pai_approve(ctx: Context, _: None) -> dict[str, Any]:
    result = await durable_editor.run(ctx, "Write and publish a post")
    return {"output": result.output, "usage": usage_of(result)}


# --- a loop that only a budget stops ---------------------------------------------------


async def loop_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    n = len(returns(messages))
    if n >= 6:
        return ModelResponse(parts=[TextPart(f"poked {n} times")])
    return ModelResponse(parts=[ToolCallPart("poke", {"i": n})])


looper = Agent(FunctionModel(loop_model), name="looper")


@looper.tool_plain
def poke(i: int) -> int:
    log("exec")
    return i


durable_looper = SojournAgent(looper)


@agent("pai-loop")
async def pai_loop(ctx: Context, _: None) -> dict[str, Any]:
    result = await durable_looper.run(ctx, "Poke until done")
    return {"output": result.output, "usage": usage_of(result)}


# --- a streamed response ---------------------------------------------------------------

WORDS = ("Durable ", "execution ", "survives ", "crashes.")


async def stream_model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    log("model")
    for word in WORDS:
        yield word


teller = Agent(FunctionModel(stream_function=stream_model), name="teller")
durable_teller = SojournAgent(teller)


async def drain(ctx: RunContext[None], events: AsyncIterable[Any]) -> None:
    """An event stream handler: with one, ``Agent.run`` streams its model requests."""
    async for _ in events:
        pass


@agent("pai-stream")
async def pai_stream(ctx: Context, _: None) -> dict[str, Any]:
    result = await durable_teller.run(ctx, "Tell me", event_stream_handler=drain)
    return {"output": result.output, "usage": usage_of(result)}
