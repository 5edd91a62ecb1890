"""Run a Pydantic AI agent inside a sojourn run, every model request and tool call a journaled
step (``pip install 'sojourn[pydantic-ai]'``).

The design follows pydantic-ai's own durable integrations (Temporal, DBOS, Prefect): the agent
is wrapped, and for the run its model and its toolset are replaced by durable ones. The
replacements are installed through one per-run capability (``get_wrapper_model``,
``get_wrapper_toolset``), the extension point pydantic-ai offers for exactly this, so the
agent itself is never copied or changed:

- each model request runs the wrapped model in a step (kind ``llm``, named
  ``llm:<model name>``) that records the ``ModelResponse`` in pydantic-ai's own JSON form and
  charges its tokens (and cost, from ``prices``) to the run's budget; on replay the recorded
  response is rebuilt and no request is sent;
- each tool call runs in a step (kind ``tool``, named ``tool:<tool name>``); the tool's
  control-flow signals (``ModelRetry``, ``ApprovalRequired``, ``CallDeferred``,
  ``ToolFailed``) are recorded as values and raised again outside the step, so pydantic-ai's
  retry and deferral logic behaves as without sojourn, on replay too;
- a tool that needs approval (``requires_approval=True``, or one that raises
  ``ApprovalRequired``) becomes a ``ctx.approval`` wait: the run parks, holding no process,
  until someone sends ``approval.<tool name>``, then the tool runs or the model is told it was
  denied;
- tool calls of one model response run one after another (pydantic-ai's ``sequential`` mode),
  so step positions never depend on timing.

Everything between these steps (instructions, output validators, history processors) is
agent code: it runs again on every activation and must be deterministic, as in any agent.

This module imports pydantic-ai; ``import sojourn.actors`` does not import this module.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import pydantic_core
from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import conversation_id_from_run_id
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolReturn,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from sojourn.schemas.events import Usage

from ..agents.context import Context
from ..agents.driver import Duration
from ..agents.steps import current_step
from ..core.retry import RetryPolicy, step
from ._off_loop import off_loop as _off_loop

__all__ = ["MODEL_STAND_INS", "TOOLSET_STAND_INS", "Price", "Prices", "SojournAgent"]

DepsT = TypeVar("DepsT")
OutputT = TypeVar("OutputT")
R = TypeVar("R")

MODEL_NAME_MAX = 200
"""Characters of a model name kept in a step's name and its ``Usage.model``."""


@dataclass(frozen=True, slots=True)
class Price:
    """What a model costs, in USD per million tokens."""

    input: float
    output: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.input) and math.isfinite(self.output)):
            raise ValueError("a price is a finite number of USD per million tokens")
        if self.input < 0 or self.output < 0:
            raise ValueError("a price is not negative")

    def usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


Prices = Mapping[str, Price | tuple[float, float]] | Callable[[ModelResponse], float | None]
"""The cost of a model response: a table from model name (``ModelResponse.model_name``, else
the wrapped model's name) to ``Price`` (or ``(input, output)`` USD per million tokens), or a
function of the response returning USD (``None``: unknown). A model not in the table costs 0:
its tokens are still charged."""


class SojournAgent(Generic[DepsT, OutputT]):
    """A Pydantic AI agent made durable inside a sojourn run.

    Example::

        research = Agent("openai:gpt-5", tools=[search, fetch])
        durable = SojournAgent(research, prices={"gpt-5": Price(1.25, 10.0)})

        @agent("researcher")
        async def researcher(ctx: Context, topic: str) -> str:
            result = await durable.run(ctx, f"Research {topic}")
            return result.output

    Args:
        agent: the Pydantic AI agent (not changed: the durable model and toolset apply to the
            runs made through this wrapper only).
        prices: what model responses cost (see ``Prices``); tokens are charged without it.
        approvers: who is asked, in turn, to approve a tool that needs approval
            (``ctx.approval``); each gets ``approval_timeout``. Under authentication these are
            NATS user names: a decision sent by anyone else is refused (and recorded).
        approval_allowed: names that may decide at any stage as well (``ctx.approval``'s
            ``allowed``).
        approval_timeout: how long each approver has to answer.
        on_approval_timeout: what happens when nobody answered: ``deny`` (the model is told),
            ``approve``, or ``fail`` (``ApprovalTimeout`` ends the run).
        remind: ``remind(approver, tool_name)``, run as a step when an approver is asked (to
            send the request by mail or chat).
        model_retry: the retry policy of model-request steps (say ``retry_on`` for your
            provider's transient errors); none by default, as for any step.
        tool_retry: the retry policy of tool-call steps (a tool's ``ModelRetry`` is not a
            step failure: it goes back to the model, as in pydantic-ai).
        stream_text: send a streamed response's text to the run's output stream
            (``ctx.stream``) as it arrives.
    """

    def __init__(
        self,
        agent: Agent[DepsT, OutputT],
        *,
        prices: Prices | None = None,
        approvers: Sequence[str] = ("operator",),
        approval_timeout: Duration = timedelta(days=7),
        on_approval_timeout: Literal["deny", "approve", "fail"] = "deny",
        approval_allowed: Sequence[str] = (),
        remind: Callable[[str, str], Any] | None = None,
        model_retry: RetryPolicy | None = None,
        tool_retry: RetryPolicy | None = None,
        stream_text: bool = True,
    ) -> None:
        if not approvers:
            raise ValueError("SojournAgent needs at least one approver")
        self.agent = agent
        self.prices = prices
        self.approvers = tuple(approvers)
        self.approval_timeout = approval_timeout
        self.on_approval_timeout = on_approval_timeout
        if isinstance(approval_allowed, str):
            raise TypeError("approval_allowed is a sequence of names, not one string")
        self.approval_allowed = tuple(approval_allowed)
        self.remind = remind
        self.model_retry = model_retry
        self.tool_retry = tool_retry
        self.stream_text = stream_text
        self._steps: dict[str, Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]] = {}
        self._runs: weakref.WeakKeyDictionary[Context, int] = weakref.WeakKeyDictionary()

    async def run(
        self,
        ctx: Context,
        user_prompt: str | Sequence[Any] | None = None,
        *,
        deps: DepsT = None,  # type: ignore[assignment]
        message_history: Sequence[ModelMessage] | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[OutputT]:
        """Run the agent durably in the sojourn run of ``ctx``; returns pydantic-ai's result.

        Takes ``Agent.run``'s arguments (``deps``, ``message_history``, ``output_type``,
        ``model_settings``, ``usage_limits``...). ``result.usage`` equals the sum of the
        usage recorded by the run's model-request steps. Call it from agent code, not from a
        step. Several calls in one run are fine (each is its own pydantic-ai run, with an id
        derived from the sojourn run's, the same on every replay).

        Raises:
            StepError: a model request or a tool failed (after its step's retries).
            ApprovalTimeout: nobody approved in time and ``on_approval_timeout="fail"``.
        """
        n = self._runs.get(ctx, 0)
        self._runs[ctx] = n + 1
        durability = _Durability(owner=self, ctx=ctx, pai_run_id=f"{ctx.run_id}/pai-{n}")
        capabilities = [*(kwargs.pop("capabilities", None) or ()), durability]

        async def run() -> AgentRunResult[OutputT]:
            try:
                with (
                    Agent.parallel_tool_call_execution_mode("sequential"),
                    _model_override(self),
                ):
                    return await self.agent.run(
                        user_prompt,
                        deps=deps,
                        message_history=message_history,
                        capabilities=capabilities,
                        **kwargs,
                    )
            except BaseExceptionGroup as group:
                raise _control(group) from None

        if ctx.offline:
            return _off_loop(run)
        return await run()

    # --- steps --------------------------------------------------------------------------

    def step_fn(
        self, name: str, kind: Literal["llm", "tool"]
    ) -> Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]:
        """The step function journaled as ``name``: one per name, kept, so that sojourn's
        per-function caches stay small."""
        fn = self._steps.get(name)
        if fn is None:

            async def run_body(body: Callable[[], Awaitable[Any]]) -> Any:
                return await body()

            retry = self.model_retry if kind == "llm" else self.tool_retry
            fn = step(name=name, kind=kind, retry=retry)(run_body)
            self._steps[name] = fn
        return fn

    def charge(self, response: ModelResponse, fallback_model: str) -> None:
        """Charge a response's usage to the step being run."""
        usage = response.usage
        model = (response.model_name or fallback_model)[:MODEL_NAME_MAX]
        current_step().charge(
            Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                usd=self._usd(response, model),
                requests=1,
                model=model,
            )
        )

    def _usd(self, response: ModelResponse, model: str) -> float:
        prices = self.prices
        if prices is None:
            return 0.0
        if callable(prices):
            usd = prices(response)
            if usd is None:
                return 0.0
            if not (math.isfinite(usd) and usd >= 0):
                raise ValueError(f"a price function returned {usd!r} USD for {model!r}")
            return float(usd)
        price = prices.get(model)
        if price is None:
            return 0.0
        if not isinstance(price, Price):
            price = Price(*price)
        return price.usd(response.usage.input_tokens, response.usage.output_tokens)


MODEL_STAND_INS: list[Callable[[SojournAgent[Any, Any]], Model | None]] = []
"""The test seam of ``sojourn.actors.testing.mock_model``: each function, newest first, is
asked for a model to run a ``SojournAgent``'s agent on instead of its own (``None``: not
mine); the first answer is put in place with pydantic-ai's ``Agent.override(model=...)`` for
that run, so the agent's own model is never asked. Empty in production."""

TOOLSET_STAND_INS: list[
    Callable[[SojournAgent[Any, Any], AbstractToolset[Any]], AbstractToolset[Any] | None]
] = []
"""The test seam of ``sojourn.actors.testing.mock_mcp``: each function, newest first, is
asked for a stand-in for each leaf toolset of a run (an MCP server's, say; ``None``: not
mine), before the run enters any of them. Empty in production."""


def _model_override(owner: SojournAgent[Any, Any]) -> AbstractContextManager[None]:
    for stand_in in reversed(MODEL_STAND_INS):
        model = stand_in(owner)
        if model is not None:
            return owner.agent.override(model=model)
    return nullcontext()


def _with_stand_ins(
    owner: SojournAgent[Any, Any], toolset: AbstractToolset[Any]
) -> AbstractToolset[Any]:
    if not TOOLSET_STAND_INS:
        return toolset

    def swap(leaf: AbstractToolset[Any]) -> AbstractToolset[Any]:
        for stand_in in reversed(TOOLSET_STAND_INS):
            other: AbstractToolset[Any] | None = stand_in(owner, leaf)
            if other is not None:
                return other
        return leaf

    replaced: AbstractToolset[Any] = toolset.visit_and_replace(swap)
    return replaced


def _control(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception to raise for a group pydantic-ai's task groups made of what we raised:
    sojourn's control flow (a run that parks or is cancelled unwinds by a ``BaseException``)
    must reach the worker as itself, not wrapped."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _control(exc)
        if not isinstance(exc, Exception):
            return exc
    return group


# --- what a step records ----------------------------------------------------------------

_RESPONSES: TypeAdapter[list[ModelMessage]] = ModelMessagesTypeAdapter
_TOOL_RETURN: TypeAdapter[ToolReturn] = TypeAdapter(ToolReturn)


def dump_response(response: ModelResponse) -> Any:
    """A model response as JSON, in pydantic-ai's own message serialization."""
    return _RESPONSES.dump_python([response], mode="json")


def load_response(recorded: Any) -> ModelResponse:
    """Rebuild a response recorded by ``dump_response``."""
    (message,) = _RESPONSES.validate_python(recorded)
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a model-request step recorded a {type(message).__name__}")
    return message


async def capture_tool_call(call: Awaitable[Any]) -> dict[str, Any]:
    """Run a tool call and turn its outcome into JSON, control-flow signals included."""
    try:
        value = await call
    except ModelRetry as e:
        return {"kind": "model_retry", "message": e.message}
    except ApprovalRequired as e:
        return {"kind": "approval_required", "metadata": _json(e.metadata)}
    except CallDeferred as e:
        return {"kind": "call_deferred", "metadata": _json(e.metadata), "call_kind": e.kind}
    except ToolFailed as e:
        return {"kind": "tool_failed", "message": e.message}
    if isinstance(value, ToolReturn):
        return {"kind": "tool_return", "value": _TOOL_RETURN.dump_python(value, mode="json")}
    return {"kind": "return", "value": _json(value)}


def replay_tool_call(recorded: Any) -> Any:
    """The tool call's result, or its signal raised again, from what ``capture_tool_call``
    recorded."""
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind == "return":
        return recorded["value"]
    if kind == "tool_return":
        return _TOOL_RETURN.validate_python(recorded["value"])
    if kind == "model_retry":
        raise ModelRetry(recorded["message"])
    if kind == "approval_required":
        raise ApprovalRequired(metadata=recorded["metadata"])
    if kind == "call_deferred":
        raise CallDeferred(metadata=recorded["metadata"], kind=recorded["call_kind"])
    if kind == "tool_failed":
        raise ToolFailed(recorded["message"])
    raise TypeError(f"a tool-call step recorded {recorded!r}")


def _json(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(value)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def approval_name(tool_name: str) -> str:
    """The ``ctx.approval`` name of a tool (its signal is ``approval.<name>``)."""
    return _UNSAFE.sub("_", tool_name)[:128] or "tool"


# --- the durable model, toolset and approvals -------------------------------------------


@dataclass(kw_only=True)
class _Durability(AbstractCapability[Any]):
    """What one ``SojournAgent.run`` adds to the pydantic-ai run."""

    owner: SojournAgent[Any, Any]
    ctx: Context
    pai_run_id: str

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    def get_default_run_id(self) -> str | None:
        return self.pai_run_id

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id)

    def get_wrapper_model(self, model: Model) -> Model | None:
        return _JournaledModel(model, owner=self.owner, ctx=self.ctx)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        wrapped = _with_stand_ins(self.owner, toolset)
        return _JournaledToolset(wrapped=wrapped, owner=self.owner, ctx=self.ctx)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Tools that need approval wait for a human, durably (``ctx.approval``), one after
        another in the order the model called them. Externally executed calls are left to
        pydantic-ai (they end the run with ``DeferredToolRequests``)."""
        if not requests.approvals:
            return None
        owner = self.owner
        approvals: dict[str, bool | ToolApproved | ToolDenied] = {}
        for call in requests.approvals:
            decision = await self.ctx.approval(
                approval_name(call.tool_name),
                approvers=owner.approvers,
                timeout=owner.approval_timeout,
                remind=owner.remind,
                on_timeout=owner.on_approval_timeout,
                allowed=owner.approval_allowed,
            )
            if decision.approved:
                approvals[call.tool_call_id] = ToolApproved()
            else:
                why = f": {decision.note}" if decision.note else ""
                approvals[call.tool_call_id] = ToolDenied(
                    f"The call to {call.tool_name} was denied by {decision.by}{why}"
                )
        return DeferredToolResults(approvals=approvals)


class _JournaledModel(WrapperModel):
    """A model whose every request is a journaled step."""

    def __init__(self, wrapped: Model, *, owner: SojournAgent[Any, Any], ctx: Context) -> None:
        super().__init__(wrapped)
        self._owner = owner
        self._ctx = ctx

    def _step_name(self) -> str:
        return f"llm:{self.wrapped.model_name[:MODEL_NAME_MAX]}"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        owner, wrapped = self._owner, self.wrapped

        async def body() -> Any:
            response = await wrapped.request(messages, model_settings, model_request_parameters)
            owner.charge(response, wrapped.model_name)
            return dump_response(response)

        fn = owner.step_fn(self._step_name(), "llm")
        return load_response(await self._ctx.step(fn, body))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """The stream is consumed inside the step (its text goes to the run's output stream);
        the agent gets the recorded response, replayed as events."""
        owner, wrapped, ctx = self._owner, self.wrapped, self._ctx

        async def body() -> Any:
            async with wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as streamed:
                async for event in streamed:
                    if owner.stream_text:
                        text = _text_of(event)
                        if text:
                            await ctx.stream(text)
            response = streamed.get()
            owner.charge(response, wrapped.model_name)
            return dump_response(response)

        fn = owner.step_fn(self._step_name(), "llm")
        response = load_response(await ctx.step(fn, body))
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


def _text_of(event: Any) -> str:
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


@dataclass(kw_only=True)
class _JournaledToolset(WrapperToolset[Any]):
    """The agent's toolset, each call a journaled step. Listing tools is not journaled: it
    must give the same tools on replay (function tools do)."""

    owner: SojournAgent[Any, Any]
    ctx: Context

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        wrapped = self.wrapped
        if (tool.tool_def.metadata or {}).get("sojourn_mcp_server"):  # an McpToolset's tool:
            return await _mcp_call(self.ctx, wrapped.call_tool(name, tool_args, ctx, tool))

        async def body() -> Any:
            return await capture_tool_call(wrapped.call_tool(name, tool_args, ctx, tool))

        fn = self.owner.step_fn(f"tool:{name}", "tool")
        return replay_tool_call(await self.ctx.step(fn, body))


async def _mcp_call(ctx: Context, call: Awaitable[Any]) -> Any:
    """A call ``ctx.mcp`` journals itself (``integrations/mcp_toolset.py``), with the run's
    context where the toolset finds it."""
    from .mcp_toolset import RUN_CONTEXT  # the mcp extra: only an McpToolset's tools get here

    token = RUN_CONTEXT.set(ctx)
    try:
        return await call
    finally:
        RUN_CONTEXT.reset(token)
