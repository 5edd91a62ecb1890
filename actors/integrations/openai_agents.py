"""Run an OpenAI Agents SDK agent inside a sojourn run, every model call and tool call a
journaled step (``pip install 'sojourn[openai-agents]'``).

The design follows the SDK's own durable integration (Temporal's) and sojourn's Pydantic AI
integration: the agent is run by the SDK's ``Runner`` with a ``RunConfig`` whose model
provider is sojourn's, so that

- each model call runs the provider's model in a step (kind ``llm``, named
  ``llm:<model name>``) that records the SDK's ``ModelResponse`` as JSON and charges its
  tokens (and cost, from ``prices``) to the run's budget; on replay the recorded response is
  rebuilt and nothing is sent;
- each function-tool call runs in a step (kind ``tool``, named ``tool:<tool name>``) with
  the step's idempotency key (``current_step().idempotency_key``); on replay the recorded
  result is returned and the tool does not run;
- a tool that needs approval (``needs_approval``) interrupts the SDK run, and sojourn turns
  the interruption into a ``ctx.approval`` wait: the run parks, holding no process, until
  someone sends ``approval.<tool name>``; then the SDK run resumes with the call approved or
  rejected;
- function tools run one at a time (``max_function_tool_concurrency=1``), so step positions
  never depend on timing.

Handoffs, guardrails, hooks and output types are the SDK's own and run unchanged: they are
agent code, run again on every activation, so they must be deterministic (a guardrail that
asks a model should run its agent through ``SojournRunner.run`` too).

This module imports the SDK; ``import sojourn.actors`` does not import this module.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from datetime import timedelta
from typing import Any, Literal, cast

from agents import Agent, RunConfig, Runner, RunResult
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.models.multi_provider import MultiProvider
from agents.run_config import ToolExecutionConfig
from agents.tool import (
    FunctionTool,
    Tool,
    ToolOutputFileContent,
    ToolOutputImage,
    ToolOutputText,
)
from agents.tool_context import ToolContext
from openai.types.responses import ResponseCompletedEvent
from pydantic import TypeAdapter

from sojourn.schemas.events import Usage

from ..agents.context import Context
from ..agents.driver import Duration
from ..agents.steps import current_step
from ..core.retry import RetryPolicy, step
from ..llm._call import priced
from ..llm._prices import PriceSpec, PriceTable
from ._off_loop import off_loop

__all__ = [
    "SojournRunner",
    "approval_name",
    "capture_tool_output",
    "dump_response",
    "durable_tool",
    "load_response",
    "replay_tool_output",
    "run_context",
]

MODEL_NAME_MAX = 200
"""Characters of a model name kept in a step's name and its ``Usage.model``."""

_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_OUTPUTS: TypeAdapter[ToolOutputText | ToolOutputImage | ToolOutputFileContent] = TypeAdapter(
    ToolOutputText | ToolOutputImage | ToolOutputFileContent
)

_RUN: ContextVar[_Durable | None] = ContextVar("sojourn_openai_agents_run", default=None)
"""The durable SDK run the current task belongs to: a journaled tool outside one runs as
plain SDK code."""


class SojournRunner:
    """Runs OpenAI Agents SDK agents durably inside sojourn runs.

    Example::

        provider = OpenAIProvider(base_url="https://api.openai.com/v1", use_responses=False)
        runner = SojournRunner(provider, prices={"gpt-5*": (1.25, 10.0)})
        support = Agent(name="support", model="gpt-5", tools=[lookup_order, refund])

        @agent("support")
        async def support_run(ctx: Context, question: str) -> str:
            result = await runner.run(ctx, support, question)
            return str(result.final_output)

    Args:
        model_provider: the SDK provider that resolves the agents' model names (the SDK's
            default, ``MultiProvider()``, when not given). Agents name their model (a ``str``
            or ``None`` for the default): an agent holding a ``Model`` object would bypass
            the journal, and ``run`` refuses it.
        prices: what model calls cost: a sojourn ``PriceTable`` or a mapping from model name
            (or glob) to ``(input, output)`` USD per million tokens. Tokens are charged
            without it.
        approvers, approval_timeout, on_approval_timeout, approval_allowed, remind: the
            ``ctx.approval`` asked for each tool call that needs approval (see
            ``Context.approval``). Under authentication approvers are NATS user names.
        model_retry: the retry policy of model-call steps (none by default: the SDK's own
            ``ModelSettings.retry`` runs inside the step).
        tool_retry: the retry policy of tool-call steps (a tool's exception reaches the step
            only when its ``failure_error_function`` is ``None``; by default the SDK sends
            the error to the model).
        stream_text: under ``run(..., stream=True)``, send the model's text to the run's
            output stream (``ctx.stream``) as it arrives.
    """

    def __init__(
        self,
        model_provider: ModelProvider | None = None,
        *,
        prices: PriceTable | Mapping[str, PriceSpec] | None = None,
        approvers: Sequence[str] = ("operator",),
        approval_timeout: Duration = timedelta(days=7),
        on_approval_timeout: Literal["deny", "approve", "fail"] = "deny",
        approval_allowed: Sequence[str] = (),
        remind: Callable[[str, str], Any] | None = None,
        model_retry: RetryPolicy | None = None,
        tool_retry: RetryPolicy | None = None,
        stream_text: bool = True,
    ) -> None:
        if not approvers or isinstance(approvers, str):
            raise ValueError("SojournRunner needs a sequence of at least one approver")
        if isinstance(approval_allowed, str):
            raise TypeError("approval_allowed is a sequence of names, not one string")
        self.model_provider = model_provider if model_provider is not None else MultiProvider()
        self.prices = prices if isinstance(prices, PriceTable) else PriceTable(prices)
        self.approvers = tuple(approvers)
        self.approval_timeout = approval_timeout
        self.on_approval_timeout = on_approval_timeout
        self.approval_allowed = tuple(approval_allowed)
        self.remind = remind
        self.model_retry = model_retry
        self.tool_retry = tool_retry
        self.stream_text = stream_text
        self._steps: dict[str, Callable[..., Any]] = {}

    async def run(
        self,
        ctx: Context,
        agent: Agent[Any],
        input: str | list[TResponseInputItem],
        *,
        run_config: RunConfig | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> RunResult:
        """Run ``agent`` on ``input`` durably in the sojourn run of ``ctx``; returns the SDK's
        ``RunResult`` (of the last SDK run, after every approval).

        Takes ``Runner.run``'s arguments (``context``, ``max_turns``, ``hooks``...). A given
        ``run_config`` is kept, with sojourn's model provider and one tool at a time put in
        (its ``model_provider`` is not used: the runner's is).
        ``stream=True`` runs ``Runner.run_streamed`` and drains its events (the text goes to
        the run's output stream). Call it from agent code, not from a step.

        Raises:
            StepError: a model call failed (after its step's retries).
            agents.exceptions.UserError: a tool whose ``failure_error_function`` is ``None``
                failed (after its step's retries); its cause is the step's ``StepError``.
            ApprovalTimeout: nobody approved in time and ``on_approval_timeout="fail"``.
        """
        _refuse_model_objects(agent, run_config)
        if ctx.offline:
            return off_loop(lambda: self._run(ctx, agent, input, run_config, stream, kwargs))
        return await self._run(ctx, agent, input, run_config, stream, kwargs)

    async def _run(
        self,
        ctx: Context,
        agent: Agent[Any],
        input: str | list[TResponseInputItem],
        run_config: RunConfig | None,
        stream: bool,
        kwargs: dict[str, Any],
    ) -> RunResult:
        config = replace(
            run_config or RunConfig(),
            model_provider=_JournaledProvider(self, ctx),
            tool_execution=replace(
                (run_config.tool_execution if run_config else None) or ToolExecutionConfig(),
                max_function_tool_concurrency=1,
            ),
        )
        token = _RUN.set(_Durable(self, ctx))
        try:
            result = await self._once(agent, input, config, stream, kwargs)
            while result.interruptions:
                state = result.to_state()
                for item in result.interruptions:
                    name = item.tool_name or "tool"
                    decision = await ctx.approval(
                        approval_name(name),
                        approvers=self.approvers,
                        timeout=self.approval_timeout,
                        remind=self.remind,
                        on_timeout=self.on_approval_timeout,
                        allowed=self.approval_allowed,
                    )
                    if decision.approved:
                        state.approve(item)
                    else:
                        why = f": {decision.note}" if decision.note else ""
                        state.reject(
                            item,
                            rejection_message=f"The call to {name} was denied by "
                            f"{decision.by}{why}",
                        )
                result = await self._once(agent, state, config, stream, kwargs)
            return result
        finally:
            _RUN.reset(token)

    async def _once(
        self, agent: Agent[Any], input: Any, config: RunConfig, stream: bool, kwargs: Any
    ) -> RunResult:
        if not stream:
            return await Runner.run(agent, input, run_config=config, **kwargs)
        streamed = Runner.run_streamed(agent, input, run_config=config, **kwargs)
        async for _ in streamed.stream_events():
            pass
        return cast(RunResult, streamed)

    # --- steps --------------------------------------------------------------------------

    def step_fn(self, name: str, kind: Literal["llm", "tool"]) -> Callable[..., Any]:
        """The step function journaled as ``name``: one per name, kept, so that sojourn's
        per-function caches stay small."""
        fn = self._steps.get(name)
        if fn is None:

            async def run_body(body: Callable[[], Any]) -> Any:
                return await body()

            retry = self.model_retry if kind == "llm" else self.tool_retry
            fn = step(name=name, kind=kind, retry=retry)(run_body)
            self._steps[name] = fn
        return fn

    def charge(self, usage: Any, model: str) -> None:
        """Charge an SDK ``Usage`` of one model call to the step being run."""
        tokens = Usage(
            input_tokens=int(usage.input_tokens),
            output_tokens=int(usage.output_tokens),
            requests=1,
            model=model[:MODEL_NAME_MAX],
        )
        current_step().charge(priced(tokens, self.prices, None, model))


class _Durable:
    """What the tools of one durable SDK run need: its runner and the run's context."""

    def __init__(self, owner: SojournRunner, ctx: Context) -> None:
        self.owner = owner
        self.ctx = ctx


def _refuse_model_objects(agent: Agent[Any], run_config: RunConfig | None) -> None:
    """A ``Model`` object on the run config or on an agent reachable by handoff would be
    called by the SDK directly, outside the journal: refuse it rather than lose durability."""
    if run_config is not None and isinstance(run_config.model, Model):
        raise TypeError("SojournRunner: give run_config.model as a name, not a Model object")
    seen: set[int] = set()
    todo: list[Any] = [agent]
    while todo:
        a = todo.pop()
        if not isinstance(a, Agent) or id(a) in seen:
            continue
        seen.add(id(a))
        if isinstance(a.model, Model):
            raise TypeError(
                f"SojournRunner: agent {a.name!r} holds a Model object; name its model (a str) "
                f"and give the provider to SojournRunner, so that its calls are journaled"
            )
        todo.extend(a.handoffs)


# --- what a step records ----------------------------------------------------------------


def dump_response(response: ModelResponse) -> Any:
    """An SDK model response as JSON (its output items in the Responses API's own form)."""
    return _RESPONSE.dump_python(response, mode="json")


def load_response(recorded: Any) -> ModelResponse:
    """Rebuild a response recorded by ``dump_response``."""
    return _RESPONSE.validate_python(recorded)


def capture_tool_output(value: Any) -> dict[str, Any]:
    """A tool's return value as JSON, such that ``replay_tool_output`` gives back what the SDK
    makes of it: JSON values as they are, the SDK's structured outputs (text, image, file,
    or a list of them) as themselves, anything else as its ``str``, which is all the SDK
    sends the model of it."""
    if isinstance(value, ToolOutputText | ToolOutputImage | ToolOutputFileContent):
        return {"kind": "output", "value": value.model_dump(mode="json")}
    if (
        isinstance(value, list | tuple)
        and value
        and all(
            isinstance(v, ToolOutputText | ToolOutputImage | ToolOutputFileContent) for v in value
        )
    ):
        return {"kind": "outputs", "value": [v.model_dump(mode="json") for v in value]}
    if _plain(value):
        return {"kind": "json", "value": value}
    return {"kind": "text", "value": str(value)}


def _plain(value: Any) -> bool:
    """JSON's own types all the way down (a tuple or a subclass would come back changed)."""
    if value is None or type(value) in (bool, int, str):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def replay_tool_output(recorded: Any) -> Any:
    """The tool's return value from what ``capture_tool_output`` recorded."""
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind in ("json", "text"):
        return recorded["value"]
    if kind == "output":
        return _OUTPUTS.validate_python(recorded["value"])
    if kind == "outputs":
        return [_OUTPUTS.validate_python(v) for v in recorded["value"]]
    raise TypeError(f"a tool-call step recorded {recorded!r}")


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def approval_name(tool_name: str) -> str:
    """The ``ctx.approval`` name of a tool (its signal is ``approval.<name>``)."""
    return _UNSAFE.sub("_", tool_name)[:128] or "tool"


# --- the durable provider, model and tools ----------------------------------------------


class _JournaledProvider(ModelProvider):
    """The runner's provider, each model it gives journaled."""

    def __init__(self, owner: SojournRunner, ctx: Context) -> None:
        self._owner = owner
        self._ctx = ctx

    def get_model(self, model_name: str | None) -> Model:
        inner = self._owner.model_provider.get_model(model_name)
        name = model_name or getattr(inner, "model", None) or type(inner).__name__
        return _JournaledModel(inner, str(name), owner=self._owner, ctx=self._ctx)


class _JournaledModel(Model):
    """A model whose every call is a journaled step; the function tools it is offered are
    journaled too (before the SDK can call any of them)."""

    def __init__(self, inner: Model, name: str, *, owner: SojournRunner, ctx: Context) -> None:
        self.inner = inner
        self.name = name[:MODEL_NAME_MAX]
        self._owner = owner
        self._ctx = ctx

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: list[Tool],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        journal_tools(tools)
        owner, inner, name = self._owner, self.inner, self.name

        async def body() -> Any:
            response = await inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            owner.charge(response.usage, name)
            return dump_response(response)

        fn = owner.step_fn(f"llm:{name}", "llm")
        return load_response(await self._ctx.step(fn, body))

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: list[Tool],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """The stream is read inside the step (its text goes to the run's output stream);
        the SDK gets the recorded completion event, on the first execution as on replay."""
        journal_tools(tools)
        owner, inner, name, ctx = self._owner, self.inner, self.name, self._ctx

        async def body() -> Any:
            completed: ResponseCompletedEvent | None = None
            async for event in inner.stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            ):
                if event.type == "response.output_text.delta" and owner.stream_text:
                    if event.delta:
                        await ctx.stream(event.delta)
                elif isinstance(event, ResponseCompletedEvent):
                    completed = event
            if completed is None:
                raise RuntimeError(f"{name}: the model's stream ended without completing")
            usage = completed.response.usage
            owner.charge(
                _StreamUsage(
                    usage.input_tokens if usage else 0, usage.output_tokens if usage else 0
                ),
                name,
            )
            return completed.model_dump(mode="json")

        fn = owner.step_fn(f"llm:{name}", "llm")
        recorded = await ctx.step(fn, body)
        yield ResponseCompletedEvent.model_validate(recorded)


class _StreamUsage:
    def __init__(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens


def durable_tool(tool: FunctionTool) -> FunctionTool:
    """Run ``tool``'s body as agent code, not in a step, so that it can wait durably.

    Inside it, ``run_context()`` is the sojourn run's ``Context``: the tool may wait for a
    signal (``ctx.wait_for``), a timer (``ctx.sleep``) or a human (``ctx.approval``), parking
    the run with no process held, and must make its effects steps (``ctx.step``). Like all
    agent code it runs again on every activation, so it must be deterministic. Returns the
    tool, changed in place::

        @durable_tool
        @function_tool
        async def wait_for_payment(order: str) -> str:
            ctx = run_context()
            paid = await ctx.wait_for(f"paid-{order}", timeout=3600)
            return "paid" if paid else "not paid within the hour"
    """
    if not isinstance(tool, FunctionTool):
        raise TypeError(f"durable_tool takes a FunctionTool (@function_tool), not {tool!r}")
    if isinstance(tool.on_invoke_tool, _Journaled):
        tool.on_invoke_tool = tool.on_invoke_tool.inner
    if not isinstance(tool.on_invoke_tool, _AgentCode):
        tool.on_invoke_tool = _AgentCode(tool.on_invoke_tool)
    return tool


def run_context() -> Context:
    """The sojourn ``Context`` of the durable SDK run this code is part of (a ``durable_tool``,
    a guardrail, a hook).

    Raises:
        RuntimeError: not inside ``SojournRunner.run``.
    """
    run = _RUN.get()
    if run is None:
        raise RuntimeError("run_context() is only known inside SojournRunner.run")
    return run.ctx


def journal_tools(tools: Sequence[Tool]) -> None:
    """Make each function tool's calls journaled steps when made inside a durable run (and
    plain calls outside one). Changes the tool in place, once: the SDK calls the very tool
    objects it offered the model, and a resumed SDK run (after an approval) calls the tools
    of the agent itself, with no model call before."""
    for tool in tools:
        if isinstance(tool, FunctionTool) and not isinstance(
            tool.on_invoke_tool, _Journaled | _AgentCode
        ):
            tool.on_invoke_tool = _Journaled(tool.on_invoke_tool, tool.name)


class _Journaled:
    """A function tool's invoker whose calls are steps named ``tool:<name>``."""

    def __init__(self, inner: Callable[[ToolContext[Any], str], Any], name: str) -> None:
        self.inner = inner
        self.name = name

    def __agents_bind_function_tool__(self, tool: FunctionTool) -> _Journaled:
        """A copy of the tool (``copy.copy``, ``Agent.clone``) binds the SDK's invoker to the
        copy, and stays journaled."""
        bind = getattr(self.inner, "__agents_bind_function_tool__", None)
        return _Journaled(bind(tool) if callable(bind) else self.inner, self.name)

    async def __call__(self, context: ToolContext[Any], input: str) -> Any:
        run = _RUN.get()
        if run is None:
            return await self.inner(context, input)
        inner = self.inner

        async def body() -> Any:
            # Inside the step nothing is journaled again: an agent used as a tool runs its
            # own SDK run here, whose tools may be journaled ones.
            token = _RUN.set(None)
            try:
                return capture_tool_output(await inner(context, input))
            finally:
                _RUN.reset(token)

        fn = run.owner.step_fn(f"tool:{self.name}", "tool")
        return replay_tool_output(await run.ctx.step(fn, body))


class _AgentCode:
    """The invoker of a ``durable_tool``: the SDK's own, marked so that it is not journaled."""

    def __init__(self, inner: Callable[[ToolContext[Any], str], Any]) -> None:
        self.inner = inner

    def __agents_bind_function_tool__(self, tool: FunctionTool) -> _AgentCode:
        bind = getattr(self.inner, "__agents_bind_function_tool__", None)
        return _AgentCode(bind(tool) if callable(bind) else self.inner)

    async def __call__(self, context: ToolContext[Any], input: str) -> Any:
        return await self.inner(context, input)
