"""``ctx.step`` and what runs as a step: the attempt, its retries and backoffs, the reconcile
of an attempt in doubt, model requests (``ctx.llm``) and a step's output stream (``ctx.stream``,
``ctx.progress``).

The run machine decides what each turn of a step does (``StepTurn``: return the recorded
result, attempt, back off, suspend, reconcile); this mixin of ``Context`` carries its answers
out: it runs the step function in its own task or thread, under the ``StepInfo`` that
``current_step()`` reads, and meters and counts what the attempt did.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.errors import RateLimited, UnknownLimit
from sojourn.schemas.events import RunSuspended, Usage

from ..client.output import StepOutput
from ..core.actions import (
    Attempt,
    AwaitSlot,
    Backoff,
    InDoubtPolicy,
    Raise,
    Reconcile,
    Reserve,
    Return,
    RunCancelledInterrupt,
    Suspend,
)
from ..core.retry import NOT_DONE, step_options
from ..core.steps import StepTurn
from ..ops import metrics as _metrics
from ..worker.faults import fault
from ..worker.interrupt import StepInterrupted, run_step
from .driver import ContextBase
from .steps import StepInfo, UsageMeter, current_info, is_async, return_type, step_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..core.retry import RetryPolicy
    from ..llm import Message, Model, ModelResponse, PriceTable, Tool

__all__ = ["StepCalls"]

P = ParamSpec("P")
R = TypeVar("R")


def _in_doubt_policy(opt: object) -> InDoubtPolicy:
    if opt == "retry" or opt == "ask":
        return opt
    return "reconcile"


class StepCalls(ContextBase):
    """``Context``'s steps: ``step``, ``llm``, ``stream``, ``progress``."""

    @overload
    async def step(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def step(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def step(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once, durably, and return its result.

        The start is recorded before ``fn`` runs and the result after, so a crash in between
        re-runs ``fn`` with the same ``current_step().idempotency_key``. Sync functions run in
        a thread so they cannot stall heartbeats. The result must be JSON-encodable by msgspec;
        the code receives it decoded to ``fn``'s return annotation, identical on replay.

        Raises:
            StepError: ``fn`` raised (recorded; replay raises the same error).
            NondeterminismError: history recorded a different operation at this position.
        """
        self._driver.check_live()
        name = step_name(fn)
        opts = step_options(fn)
        turn = self._m.step(
            name, _in_doubt_policy(opts.in_doubt), opts.retry, opts.kind, opts.limit
        )
        rtype = return_type(fn)
        if isinstance(turn, Return):
            fault("replay", f"step {name!r}, recorded")
            return from_raw(turn.result, rtype)
        if turn.plan.in_doubt and not self._m.replaying:
            _metrics.step_metrics(self._driver.metric_agent, name).in_doubt.inc()
        while True:
            action = turn.next(self._driver.time())
            if isinstance(action, Return):
                return from_raw(action.result, rtype)
            if isinstance(action, Raise):
                raise action.error
            if isinstance(action, Attempt):
                done = await self._attempt(fn, turn, action, args, kwargs)
                if done is not None:
                    return from_raw(done.result, rtype)
            elif isinstance(action, Backoff):
                await self._driver.backoff(action.position, action.retry_at)
            elif isinstance(action, Reserve):
                await self._reserve(turn, action)
            elif isinstance(action, AwaitSlot):
                await self._driver.await_slot(action.position, action.slot, action.park)
            elif isinstance(action, Suspend):
                if action.unit is not None:
                    agent = self._driver.metric_agent
                    _metrics.BUDGET_BREACHES.labels(agent, action.unit).inc()
                await self._driver.suspend(action.event)
            else:
                await self._reconcile(opts.in_doubt, turn, action)

    async def _attempt(
        self,
        fn: Callable[..., Any],
        turn: StepTurn,
        action: Attempt,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Return | None:
        """One recorded attempt: start, run, record the result or the failure. Returns the
        result when the step succeeded (else the turn knows what comes next)."""
        await self._driver.commit([action.started])
        # Right after the start is stored (no await in between): the driver's last sequence
        # is the decision that holds it, which names this execution.
        opened = self._open_output
        output = None if opened is None else opened(turn.plan.position, action.attempt)
        self._driver.tool_calls.inc()
        series = _metrics.step_metrics(self._driver.metric_agent, turn.name)
        if action.attempt > 1 and not action.in_doubt:
            series.retries.inc()
        self._driver.running(turn.name)
        meter = UsageMeter()
        info = self._info(turn, action.attempt, action.in_doubt, output, meter)
        token = current_info.set(info)
        t0 = time.perf_counter()
        try:
            # Its own task or thread: a cancel interrupts it, its timeout bounds it.
            step = run_step(self._guard, fn, args, kwargs)
            trace = getattr(self._driver, "trace", None)  # the run's spans (telemetry)
            if trace is not None:  # the attempt's span is the step code's current span
                step = trace.within(action.position, action.attempt, step)
            result: Any = await step
            raw = to_raw(result)
            fault("after_step", f"step {turn.name!r} at position {turn.plan.position}")
        except StepInterrupted as e:
            turn.interrupted(e.error, time.perf_counter() - t0, self._driver.time())
            series.failed.inc()
            raise RunCancelledInterrupt() from None
        except Exception as e:
            spent = time.perf_counter() - t0
            usage = self._charged(meter)
            await self._limited(turn, e, usage)
            failed = turn.raised(e, spent, self._driver.time(), usage)
            series.duration.observe(spent)
            (series.retry_scheduled if failed is None else series.failed).inc()
            return None
        finally:
            current_info.reset(token)
            self._driver.running(None)
        spent = time.perf_counter() - t0
        usage = self._charged(meter)
        await self._limited(turn, None, usage)
        done = turn.returned(raw, spent, self._driver.time(), usage)
        series.duration.observe(spent)
        if isinstance(done, Return):
            series.completed.inc()
            return done
        series.failed.inc()
        return None

    async def _reserve(self, turn: StepTurn, action: Reserve) -> None:
        """A slot of the step's shared limit; a limit nobody declared suspends the run (reason
        ``limit``) until an operator sets it and resumes the run."""
        try:
            grant = await self._driver.reserve(action.limit)
        except UnknownLimit as e:
            detail = f"{e.message}; then `sojourn resume {self.run_id}`"
            now = self._driver.time()
            await self._driver.suspend(RunSuspended(reason="limit", detail=detail, at=now))
            return
        turn.granted(grant, self._driver.time())

    async def _limited(self, turn: StepTurn, e: BaseException | None, usage: Usage | None) -> None:
        """After an attempt of a step with a shared limit: charge the tokens it used, and
        block the limit for everyone when the provider answered 429 (``RateLimited``)."""
        limit = turn.limit
        if limit is None:
            return
        if usage is not None and usage.tokens:
            self._driver.charge_limit(limit, usage.tokens)
        if isinstance(e, RateLimited):
            await self._driver.block_limit(limit, e.retry_after)

    async def _reconcile(self, policy: Any, turn: StepTurn, action: Reconcile) -> None:
        """Ask the step's reconcile function, by idempotency key, whether the in-doubt attempt
        did the work; like a sync step, a sync function runs off the event loop."""
        token = current_info.set(self._info(turn, turn.plan.attempt, True))
        try:
            if is_async(policy):
                found = await policy(action.key)
            else:
                found = await asyncio.to_thread(policy, action.key)
                if inspect.isawaitable(found):
                    found = await found
        finally:
            current_info.reset(token)
        turn.reconciled(None if found is NOT_DONE else to_raw(found), self._driver.time())

    def _charged(self, meter: UsageMeter) -> Usage | None:
        """What an attempt charged, counted in ``sojourn_spend_total`` as it is recorded."""
        usage = meter.total
        if usage is not None:
            _metrics.count_usage(self._driver.metric_agent, usage)
        return usage

    def _info(
        self,
        turn: StepTurn,
        attempt: int,
        in_doubt: bool,
        output: StepOutput | None = None,
        meter: UsageMeter | None = None,
    ) -> StepInfo:
        return StepInfo(
            run_id=self.run_id,
            position=turn.plan.position,
            name=turn.name,
            attempt=attempt,
            idempotency_key=turn.key,
            in_doubt=in_doubt,
            report=self.heartbeat,
            output=output,
            meter=meter,
        )

    async def llm(
        self,
        model: Model,
        messages: str | Message | Sequence[Message],
        *,
        tools: Iterable[Tool] | None = None,
        stream: bool = False,
        retry: RetryPolicy | None = None,
        prices: PriceTable | None = None,
        limit: str | None = None,
        **options: Any,
    ) -> ModelResponse:
        """Send one request to ``model`` as a journaled step (``llm:<model.name>``, kind
        ``llm``) and return its ``ModelResponse``; replay returns the recorded one.

        ``messages`` is a prompt (one user message) or the conversation; ``options`` are
        ``ModelRequest`` fields (``max_tokens``, ``temperature``, ``stop``, ``tool_choice``,
        ``extra``...). The step gives the model its idempotency key, streams the text to the
        run's output stream with ``stream=True``, and charges the usage, priced by ``prices``
        (else the model's own table), to the run's budget. ``retry`` defaults to
        ``sojourn.actors.llm.LLM_RETRY`` (a 429's ``Retry-After`` is the delay). ``limit``
        names a shared rate limit: the request waits for a slot of it, its tokens are charged
        to it, and a 429 blocks it for every run. See docs/llm.md.

        Raises:
            StepError: the request failed for good (its ``error_type`` names the model
                error: ``ModelRequestRejected``, ``ModelRateLimited``...).
        """
        from ..llm._call import call_model  # imported on first use: httpx is not needed before

        return await call_model(
            self,
            model,
            messages,
            tools,
            options,
            stream=stream,
            retry=retry,
            prices=prices,
            limit=limit,
        )

    # --- output streams ---------------------------------------------------------------------

    async def stream(self, text: str) -> int:
        """Append ``text`` to the run's output stream (an LLM's tokens, as they come), from
        inside a step function; returns the chunk's offset.

        Readers (``Client.stream``, ``sojourn stream RUN``) get the chunks in order, live, and
        can resume after a disconnect from the last offset they handled. The chunk is stored
        before this returns (a failure raises, failing the attempt like any error of the step).
        Output is not journaled: a step executed again after a crash streams again, under a
        new execution that readers can tell apart (``Chunk.execution``, ``attempt``). Keep the
        final text as the step's result: that is what the run's history records.

        Raises:
            RuntimeError: called outside a step function (agent code between steps, a
                reconcile function). It is a coroutine: await it from an async step.
            PayloadTooLarge: the chunk does not fit one message (stream smaller pieces).
            BrokerUnavailable / JetStreamError: the chunk could not be stored.
        """
        return await self._output("ctx.stream").text(text)

    async def progress(self, value: Any) -> int:
        """Publish a progress value (any JSON: ``{"done": 3, "of": 10}``) on the run's output
        stream, from inside a step function; each supersedes the last. Returns its offset.
        Stored, ordered and resumable like ``stream``'s chunks.

        Raises:
            RuntimeError: called outside a step function.
            TypeError: ``value`` is not JSON-encodable.
            PayloadTooLarge: the chunk does not fit one message.
            BrokerUnavailable / JetStreamError: the chunk could not be stored.
        """
        return await self._output("ctx.progress").progress(value)

    def _output(self, what: str) -> StepOutput:
        info = current_info.get()
        if info is None or info.output is None or info.run_id != self.run_id:
            where = "" if info is None else f" (not in {info.name!r}: it cannot stream here)"
            raise RuntimeError(
                f"{what} is only available inside a step function run by ctx.step{where}"
            )
        self._driver.check_live()
        return info.output
