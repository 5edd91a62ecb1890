"""Run a LangGraph graph inside a sojourn run, each node a journaled step, each interrupt a
durable wait (``pip install 'sojourn[langgraph]'``).

The design follows the Pydantic AI integration (``pydantic_ai.py``): the graph is wrapped,
never changed, and replayed from the start on every activation:

- for each ``ainvoke`` the compiled graph is copied with every node's runnable replaced by
  one that runs the node in a step (named ``node:<name>``, of the kind ``kinds`` gives it,
  ``step`` by default) and records what it returned (a state update, a ``Command``) as JSON
  (``_langgraph_values``); on replay the recorded update is returned and the node does not
  run. LangGraph applies the update with the graph's reducers as always, so the state is
  rebuilt from the run's history;
- the copy gets a fresh in-memory checkpointer: LangGraph needs one to stop at an interrupt
  and to resume. It lives for one activation; the run's history is the durable record (a
  checkpointer backed by the history would restore the graph half-way, and sojourn's
  journal replays code from the start: decision 0044);
- an ``interrupt(value)`` inside a node is recorded as the node step's result and raised
  again outside it. The graph stops; the run then waits, durably, holding no process, for the
  signal ``resume`` (its payload is the resume value) or, for an interrupt made by
  ``approval(name)``, for ``ctx.approval(name)`` (signal ``approval.<name>``, decided by the
  sender the broker authenticated), then goes on with ``Command(resume=...)``. The
  interrupted node runs again from its start, as in LangGraph, as a new step;
- nodes of one superstep run one at a time, in the order LangGraph schedules them
  (``max_concurrency=1``), so step positions never depend on timing.

Everything outside nodes (edges, routers, reducers) is agent code: it runs again on every
activation and must be deterministic. This module imports LangGraph; ``import sojourn.actors``
does not import this module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeVar, cast

import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONFIG_KEY_SCRATCHPAD
from langgraph._internal._runnable import RunnableCallable
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt
from langgraph.pregel import Pregel
from langgraph.pregel._read import PregelNode
from langgraph.types import Command, Interrupt, interrupt

from sojourn.schemas.codec import from_raw
from sojourn.schemas.vocabulary import STEP_KINDS, StepKind

from ..agents.context import Context
from ..agents.driver import Duration
from ..agents.patterns import ApprovalDecision
from ..core.retry import RetryPolicy, step
from ._langgraph_chat import SojournChatModel
from ._langgraph_values import from_json, to_json
from ._off_loop import off_loop as _off_loop

__all__ = [
    "Answer",
    "SojournChatModel",
    "SojournGraph",
    "approval",
    "ask",
    "from_json",
    "to_json",
]

R = TypeVar("R")


MARK = "sojourn"
"""The key of an interrupt value made by ``approval`` or ``ask``."""


# --- inside a node ---------------------------------------------------------------------------


def approval(name: str, request: Any = None) -> ApprovalDecision:
    """Ask a human to approve, from inside a node: the graph stops here (a LangGraph
    ``interrupt``) and the run waits on ``ctx.approval(name)`` with the ``SojournGraph``'s
    approvers; the node runs again from its start once someone decided, and this returns the
    decision (who decided, authenticated where the broker does: ``verified``).

    ``request`` (JSON) is shown with the interrupt (``sojourn history``)."""
    got = interrupt({MARK: "approval", "name": name, "request": request})
    return msgspec.convert(got, ApprovalDecision, strict=False)


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """What ``ask`` returns: the signal's payload and who sent it (``verified``: the broker
    authenticated the sender; otherwise ``by`` is the signal's claim, or ``None``)."""

    value: Any
    by: str | None = None
    verified: bool = False


def ask(question: Any) -> Answer:
    """Like ``interrupt(question)``, from inside a node, but the answer says who resumed the
    graph: the run waits for the ``resume`` signal, whose payload is ``Answer.value``."""
    got = interrupt({MARK: "ask", "value": question})
    return msgspec.convert(got, Answer)


# --- the durable graph --------------------------------------------------------------------------


class SojournGraph:
    """A compiled LangGraph graph made durable inside a sojourn run.

    Example::

        graph = builder.compile()
        durable = SojournGraph(graph, kinds={"agent": "llm", "tools": "tool"})

        @agent("assistant")
        async def assistant(ctx: Context, question: str) -> dict:
            state = await durable.ainvoke(ctx, {"messages": [("user", question)]})
            return to_json(state)

    Args:
        graph: the compiled graph (not changed: a copy runs, and its own checkpointer, if
            any, is not used).
        kinds: the step kind of each node by name (``llm`` for a node that calls a model,
            ``tool`` for one that runs tools: budgets count them apart); ``step`` otherwise.
        retry: the retry policy of node steps (``retries`` by node name overrides it).
        retries: retry policies by node name.
        resume_signal: the signal whose payload resumes a plain ``interrupt`` (and ``ask``).
        approvers, approval_timeout, on_approval_timeout, approval_allowed, remind: the
            ``ctx.approval`` of an ``approval(name)`` interrupt.
    """

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        kinds: Mapping[str, StepKind] | None = None,
        retry: RetryPolicy | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        resume_signal: str = "resume",
        approvers: Sequence[str] = ("operator",),
        approval_timeout: Duration = timedelta(days=7),
        on_approval_timeout: Literal["deny", "approve", "fail"] = "deny",
        approval_allowed: Sequence[str] = (),
        remind: Callable[[str, str], Any] | None = None,
    ) -> None:
        if not approvers:
            raise ValueError("SojournGraph needs at least one approver")
        if isinstance(approval_allowed, str):
            raise TypeError("approval_allowed is a sequence of names, not one string")
        self.kinds = dict(kinds or {})
        for node, kind in self.kinds.items():
            if node not in graph.nodes:
                raise ValueError(f"the graph has no node {node!r}")
            if kind not in STEP_KINDS:
                raise ValueError(f"a step's kind is one of {', '.join(STEP_KINDS)}")
        self.graph = graph
        self.retry = retry
        self.retries = dict(retries or {})
        self.resume_signal = resume_signal
        self.approvers = tuple(approvers)
        self.approval_timeout = approval_timeout
        self.on_approval_timeout = on_approval_timeout
        self.approval_allowed = tuple(approval_allowed)
        self.remind = remind
        self._steps: dict[str, Callable[..., Any]] = {}
        self._runs: weakref.WeakKeyDictionary[Context, int] = weakref.WeakKeyDictionary()

    async def ainvoke(
        self, ctx: Context, input: Any, config: RunnableConfig | None = None
    ) -> dict[str, Any]:
        """Run the graph to its end in the sojourn run of ``ctx`` and return its final state
        (the values of its channels, as ``graph.ainvoke`` returns them).

        Each interrupt on the way waits for its resume (see the class). Call it from agent
        code, not from a step; a run may call it more than once (each call is its own thread,
        ``<run id>/lg-<n>``, the same on every replay).

        Raises:
            StepError: a node failed (after its step's retries).
            ApprovalTimeout: nobody approved in time and ``on_approval_timeout="fail"``.
        """
        n = self._runs.get(ctx, 0)
        self._runs[ctx] = n + 1
        if ctx.offline:  # ``sojourn replay``: no event loop here, and LangGraph needs one
            return _off_loop(lambda: self._ainvoke(ctx, input, config, n))
        return await self._ainvoke(ctx, input, config, n)

    async def _ainvoke(
        self, ctx: Context, input: Any, config: RunnableConfig | None, n: int
    ) -> dict[str, Any]:
        graph = self._durable_copy(ctx)
        configurable: dict[str, Any] = dict((config or {}).get("configurable") or {})
        configurable["thread_id"] = f"{ctx.run_id}/lg-{n}"
        run_config = cast(
            RunnableConfig,
            {**(config or {}), "configurable": configurable, "max_concurrency": 1},
        )
        payload: Any = input
        while True:
            await graph.ainvoke(payload, run_config)
            snapshot = await graph.aget_state(run_config)
            if not snapshot.next and not snapshot.interrupts:
                return dict(snapshot.values)
            if not snapshot.interrupts:  # a static breakpoint (interrupt_before/after)
                await self._resume_value(ctx, None, snapshot.next)
                payload = None
                continue
            values = []
            for intr in snapshot.interrupts:
                nodes = tuple(t.name for t in snapshot.tasks if intr in t.interrupts)
                values.append((intr, await self._resume_value(ctx, intr, nodes)))
            if len(values) == 1:
                payload = Command(resume=values[0][1])
            else:
                payload = Command(resume={intr.id: value for intr, value in values})

    async def _resume_value(
        self, ctx: Context, intr: Interrupt | None, nodes: tuple[str, ...]
    ) -> Any:
        """Wait, durably, for what resumes ``intr``; the graph's stopped nodes are shown in
        the run's ``graph_interrupt`` attribute meanwhile."""
        ctx.set_attributes({"graph_interrupt": ",".join(nodes)[:256] or "?"})
        value = None if intr is None else intr.value
        kind = value.get(MARK) if isinstance(value, dict) else None
        if kind == "approval":
            assert isinstance(value, dict)
            decision = await ctx.approval(
                str(value["name"]),
                approvers=self.approvers,
                timeout=self.approval_timeout,
                remind=self.remind,
                on_timeout=self.on_approval_timeout,
                allowed=self.approval_allowed,
            )
            resume: Any = msgspec.to_builtins(decision)
        else:
            got = await ctx._receive(self.resume_signal)
            assert got is not None  # no timeout: a signal ended the wait
            sent: Any = from_raw(got.payload, Any)
            if kind == "ask":
                by, verified = got.sent_by, bool(got.sender_verified and got.sent_by)
                resume = {"value": sent, "by": by, "verified": verified}
            else:
                resume = sent
        ctx.set_attributes({"graph_interrupt": None})
        return resume

    # --- nodes as steps ---------------------------------------------------------------------

    def _durable_copy(self, ctx: Context) -> Pregel[Any, Any, Any, Any]:
        nodes = {
            name: node if name.startswith("__") else self._journaled(ctx, name, node)
            for name, node in self.graph.nodes.items()
        }
        return self.graph.copy({"nodes": nodes, "checkpointer": InMemorySaver()})

    def _journaled(self, ctx: Context, name: str, node: PregelNode) -> PregelNode:
        bound = node.bound
        fn = self._step_fn(name)

        async def run_node(input: Any, config: RunnableConfig) -> Any:
            ran: list[BaseException] = []

            async def body() -> Any:
                try:
                    out = await bound.ainvoke(input, config)
                except GraphInterrupt as e:
                    ran.append(e)
                    scratchpad = config["configurable"][CONFIG_KEY_SCRATCHPAD]
                    (first, *_) = e.args[0]
                    return {
                        "kind": "interrupt",
                        "value": to_json(first.value),
                        "answered": len(scratchpad.resume),
                    }
                return {"kind": "return", "value": to_json(out)}

            recorded = await ctx.step(fn, body)
            if recorded["kind"] == "return":
                return from_json(recorded["value"])
            if ran:
                raise ran[0]
            # Replayed: answer the interrupts the node had answered, as its first execution
            # did (LangGraph keeps the answers per task), then stop at the recorded one.
            for _ in range(int(recorded["answered"])):
                interrupt(None)
            interrupt(from_json(recorded["value"]))
            raise AssertionError("a recorded interrupt was answered on replay")  # pragma: no cover

        wrapped = RunnableCallable(None, run_node, name=name, trace=False, recurse=False)
        return node.copy({"bound": wrapped})

    def _step_fn(self, name: str) -> Callable[..., Any]:
        """The step function journaled as ``node:<name>``: one per node, kept."""
        fn = self._steps.get(name)
        if fn is None:

            async def run_body(body: Callable[[], Any]) -> Any:
                return await body()

            fn = step(
                name=f"node:{name}",
                kind=self.kinds.get(name, "step"),
                retry=self.retries.get(name, self.retry),
            )(run_body)
            self._steps[name] = fn
        return fn
