"""``Context``: what agent code uses to do anything that must survive a crash.

Every method here is journaled. On replay a recorded step returns its recorded result without
running; a recorded ``now()``/``uuid()``/``random()`` returns the recorded value. Code *between*
these calls must be deterministic and side-effect free: it runs again on every replay.

Replay hazards (they raise ``NondeterminismError`` at the next journaled call, or corrupt
nothing but behave differently): reading the wall clock or ``random`` directly, iterating a
``set`` whose order depends on hashing of str, branching on environment variables or on the
current time, or calling steps in a different order after a deploy (guard such a change with
``ctx.patched``; ``sojourn replay`` finds the ones that were not guarded).

``Context`` is a façade. What to record and what to do next is decided by the run machine
(``machine.py``, no I/O); the ``Driver`` (an ``Activation`` when live) stores events, sets
timers and publishes; this module runs the agent's step functions and turns the machine's
answers into return values and exceptions.
"""

from __future__ import annotations

import asyncio
import inspect
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    NoReturn,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
)

import msgspec

from sojourn.schemas import wire as _wire
from sojourn.schemas.codec import encode, from_raw, to_raw
from sojourn.schemas.errors import CallbackKeysMissing, ChildRunError, PayloadTooLarge
from sojourn.schemas.events import RunEvent, RunSuspended, Usage
from sojourn.schemas.names import validate_signal_name
from sojourn.schemas.vocabulary import WaitKey
from sojourn.schemas.wire import ChildOutcome, child_signal

from ..client.output import StepOutput
from ..core.journal import RecordedWait
from ..core.machine import (
    Attempt,
    Backoff,
    InDoubtPolicy,
    LookupChildren,
    Machine,
    Park,
    Parked,
    Raise,
    Reconcile,
    Return,
    RunCancelledInterrupt,
    StepTurn,
    Suspend,
    WaitTurn,
)
from ..core.retry import NOT_DONE, step_options
from ..history.chain import ContinueAsNew
from ..ops import metrics as _metrics
from ..worker.faults import fault
from ..worker.interrupt import StepGuard, StepInterrupted, run_step
from . import gather as _gather
from .callbacks import CALLBACK_KEYS_ENV, CallbackKeys, check_callback_signal, check_ttl
from .gather import ChildCall, ChildResult, GatherError
from .patterns import (
    ApprovalDecision,
    ApprovalRefused,
    ApprovalTimeout,
    PollTimeout,
    judge,
)
from .steps import (
    StepInfo,
    UsageMeter,
    current_info,
    current_step,
    heartbeat,
    idempotency_headers,
    is_async,
    return_type,
    step_name,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..core.retry import RetryPolicy
    from ..llm import Message, Model, ModelResponse, PriceTable, Tool

__all__ = [
    "ChildCall",
    "ChildHandle",
    "ChildResult",
    "Context",
    "Driver",
    "Duration",
    "GatherError",
    "OpenOutput",
    "Parked",
    "Selected",
    "StepInfo",
    "current_step",
    "heartbeat",
    "idempotency_headers",
]

HEARTBEAT_DETAILS_MAX = 8 * 1024
"""Largest ``ctx.heartbeat(details)`` in bytes of JSON: it rides on every lease renewal."""

PATCH_ID_MAX = 200
"""Characters of a ``ctx.patched`` change id (it is stored in every run that passes it)."""

Duration = float | int | timedelta
"""Seconds as a number, or a ``timedelta``."""

OpenOutput = Callable[[int, int], StepOutput]
"""Makes the output writer of the step execution whose ``StepStarted`` was just stored, from
its position and attempt (an ``Activation`` knows the rest: the broker, the run, and the
events-stream sequence of that start, which names the execution)."""

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Selected:
    """Which of several awaited signals arrived first, and its payload."""

    name: str
    payload: Any


def _seconds(d: Duration) -> float:
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


class Driver(Protocol):
    """The I/O a ``Context`` needs, done by an ``Activation`` (or refused by ``sojourn
    replay``, whose journal stops before any of it is needed)."""

    @property
    def agent_name(self) -> str: ...

    @property
    def metric_agent(self) -> str: ...

    @property
    def tool_calls(self) -> _metrics.Incrementable:
        """This agent's ``sojourn_tool_calls`` series."""

    def check_live(self) -> None:
        """Raise if the activation cannot write any more (fenced, an append refused)."""

    def report(self, details: msgspec.Raw) -> None:
        """A step's progress details (thread-safe)."""

    def running(self, step: str | None) -> None:
        """The step now running (shown by liveness and ``sojourn status``), or none."""

    async def commit(self, events: list[RunEvent]) -> None:
        """Store what the machine has pending plus ``events``, as one decision."""

    async def backoff(self, position: int, retry_at: float) -> None:
        """Set the retry's timer, store the failure, then sleep briefly or park."""

    async def park(self, action: Park) -> None:
        """Set the wait's timer, then store the wait (and what is pending)."""

    async def rest(self) -> None:
        """The code parked on a wait (recorded): raise ``Parked``, or suspend the code
        until the run is resumed in this process (then return: the wait looks again). Only
        called when all of the code is parked (nothing else of it is running)."""

    async def suspend(self, event: RunSuspended) -> None:
        """Store ``event`` and park (raises ``Parked``)."""

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        """Publish a child's start (idempotent by its run id)."""

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        """The outcome of a child if its history says it ended."""

    def cancel_timer(self, position: int) -> None:
        """Drop the timer of the wait at ``position`` (in the background)."""


def _in_doubt_policy(opt: object) -> InDoubtPolicy:
    if opt == "retry" or opt == "ask":
        return opt
    return "reconcile"


class Context:
    """The handle an agent run gets as its first argument."""

    def __init__(
        self,
        machine: Machine,
        driver: Driver,
        max_payload: int = 1024 * 1024,
        *,
        output: OpenOutput | None = None,
        guard: StepGuard | None = None,
        callback_keys: CallbackKeys | None = None,
    ) -> None:
        self._m = machine
        self._driver = driver
        self._max_payload = max_payload
        self._open_output = output
        self._guard = guard
        """Interrupts the activation's running steps for a cancel (``worker/interrupt.py``)."""
        self._callback_keys = callback_keys
        """The worker's keyring, which signs ``ctx.callback`` tokens (none: it refuses)."""

    @property
    def run_id(self) -> str:
        return self._m.run_id

    @property
    def agent(self) -> str:
        return self._driver.agent_name

    @property
    def replaying(self) -> bool:
        """True while the code re-executes recorded history (e.g. to skip logging)."""
        return self._m.replaying

    @property
    def schedule(self) -> str | None:
        """The name of the schedule that started this run, or ``None``."""
        return self._m.state.schedule

    @property
    def scheduled_at(self) -> datetime | None:
        """For a run a schedule started: the fire time that started it (UTC; nominal, so
        the same however late the fire was handled, and without its jitter). ``None``
        otherwise. Recorded in the run's history: replays see the same value."""
        at = self._m.state.scheduled_at
        return None if at is None else datetime.fromtimestamp(at, UTC)

    @property
    def offline(self) -> bool:
        """True under ``sojourn replay`` (and the golden-history tests): the code is checked
        against a stored history with no broker, and stops at the first operation the history
        lacks. Integrations that need a live event loop of their own look at this."""
        return self._m.stop_at_frontier

    def heartbeat(self, details: Any = None) -> None:
        """Report progress (``details``: JSON, at most 8 KiB): shown by ``sojourn status`` and
        sent with the run's next heartbeat, within a second. Safe to call from any thread and
        as often as you like (heartbeats are coalesced); it is not journaled.

        Raises:
            PayloadTooLarge: ``details`` encodes to more than 8 KiB.
            TypeError: ``details`` is not JSON-encodable.
        """
        try:
            raw = to_raw(details)
        except msgspec.EncodeError as e:
            raise TypeError(f"ctx.heartbeat details must be JSON-encodable: {e}") from e
        if len(raw) > HEARTBEAT_DETAILS_MAX:
            raise PayloadTooLarge(
                f"heartbeat details are {len(raw)} bytes; the limit is {HEARTBEAT_DETAILS_MAX}",
                run_id=self.run_id,
            )
        self._driver.report(raw)

    # --- steps ------------------------------------------------------------------------------

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
        turn = self._m.step(name, _in_doubt_policy(opts.in_doubt), opts.retry, opts.kind)
        rtype = return_type(fn)
        if isinstance(turn, Return):
            fault("replay")
            return from_raw(turn.result, rtype)
        if turn.plan.in_doubt and not self._m.replaying:
            _metrics.step_metrics(self._driver.metric_agent, name).in_doubt.inc()
        while True:
            action = turn.next(time.time())
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
            result: Any = await run_step(self._guard, fn, args, kwargs)
            raw = to_raw(result)
            fault("after_step")
        except StepInterrupted as e:
            turn.interrupted(e.error, time.perf_counter() - t0, time.time())
            series.failed.inc()
            raise RunCancelledInterrupt() from None
        except Exception as e:
            spent = time.perf_counter() - t0
            failed = turn.raised(e, spent, time.time(), self._charged(meter))
            series.duration.observe(spent)
            (series.retry_scheduled if failed is None else series.failed).inc()
            return None
        finally:
            current_info.reset(token)
            self._driver.running(None)
        spent = time.perf_counter() - t0
        done = turn.returned(raw, spent, time.time(), self._charged(meter))
        series.duration.observe(spent)
        if isinstance(done, Return):
            series.completed.inc()
            return done
        series.failed.inc()
        return None

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
        turn.reconciled(None if found is NOT_DONE else to_raw(found), time.time())

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
        **options: Any,
    ) -> ModelResponse:
        """Send one request to ``model`` as a journaled step (``llm:<model.name>``, kind
        ``llm``) and return its ``ModelResponse``; replay returns the recorded one.

        ``messages`` is a prompt (one user message) or the conversation; ``options`` are
        ``ModelRequest`` fields (``max_tokens``, ``temperature``, ``stop``, ``tool_choice``,
        ``extra``...). The step gives the model its idempotency key, streams the text to the
        run's output stream with ``stream=True``, and charges the usage, priced by ``prices``
        (else the model's own table), to the run's budget. ``retry`` defaults to
        ``sojourn.actors.llm.LLM_RETRY`` (a 429's ``Retry-After`` is the delay). See
        docs/llm.md.

        Raises:
            StepError: the request failed for good (its ``error_type`` names the model
                error: ``ModelRequestRejected``, ``ModelRateLimited``...).
        """
        from ..llm._call import call_model  # imported on first use: httpx is not needed before

        return await call_model(
            self,
            model,
            messages,
            tools=tools,
            stream=stream,
            retry=retry,
            prices=prices,
            **options,
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

    # --- versioning -------------------------------------------------------------------------

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new branch of a code change: ``True`` for runs that reach
        this point under code that has it (a marker is recorded), ``False`` for runs whose
        history passed this point before the change. Wrap the change, keep the old branch::

            if ctx.patched("send-sms-too"):
                await ctx.step(send_sms, user)      # new code
            await ctx.step(send_email, user)        # both

        The answer is the same for every call with the same id in one run. When no run that
        took the old branch is left (``sojourn replay --all-live`` says so), replace the call
        by ``ctx.deprecate_patch(change_id)`` and drop the old branch; see the guide.

        Raises:
            ValueError: ``change_id`` is empty or longer than 200 characters.
        """
        self._check_patch_id(change_id)
        self._driver.check_live()
        return self._m.patched(change_id, time.time())

    def deprecate_patch(self, change_id: str) -> None:
        """The second step of retiring ``ctx.patched(change_id)``: the old branch is gone, and
        runs that recorded the change's marker still replay. Remove this call too once those
        runs have ended."""
        self._check_patch_id(change_id)
        self._driver.check_live()
        self._m.deprecate_patch(change_id)

    @staticmethod
    def _check_patch_id(change_id: str) -> None:
        if not isinstance(change_id, str) or not 0 < len(change_id) <= PATCH_ID_MAX:
            raise ValueError(f"a patch's change id is a string of 1 to {PATCH_ID_MAX} characters")

    # --- durable waits ---------------------------------------------------------------------

    async def sleep(
        self, duration: Duration | None = None, *, until: datetime | None = None
    ) -> None:
        """Sleep durably: the run parks and a broker-kept timer wakes it (no process waits).

        Args:
            duration: seconds (number) or a ``timedelta``.
            until: an aware ``datetime`` instead of a duration. A time in the past returns now.
        """
        if (duration is None) == (until is None):
            raise ValueError("ctx.sleep takes a duration or until=, not both")
        if until is not None and until.tzinfo is None:
            raise ValueError("ctx.sleep(until=...) needs a timezone-aware datetime")
        await self._wait(WaitKey.sleep(), timeout=duration, until=until)

    @overload
    async def wait_for(self, name: str, *, timeout: Duration | None = None) -> Any: ...

    @overload
    async def wait_for(self, name: str, *, type: type[T]) -> T: ...

    @overload
    async def wait_for(self, name: str, *, timeout: Duration | None, type: type[T]) -> T | None: ...

    async def wait_for(
        self, name: str, *, timeout: Duration | None = None, type: Any = None
    ) -> Any:
        """Wait for the signal ``name`` and return its payload (decoded as ``type``), or
        ``None`` when ``timeout`` passes first.

        A signal that arrived before this call is buffered in the run's history and consumed
        here, oldest first: none is lost.
        """
        got = await self._receive(name, timeout=timeout)
        return None if got is None else from_raw(got.payload, Any if type is None else type)

    async def _receive(self, name: str, *, timeout: Duration | None = None) -> RecordedWait | None:
        """``wait_for`` for sojourn's own patterns, which need to know who sent the signal: its
        payload (raw) with ``sent_by`` and ``sender_verified``, or ``None`` on timeout. The
        same wait as ``wait_for`` (key ``signal:<name>``): either replays the other's history."""
        validate_signal_name(name)
        return await self._wait(WaitKey.signal(name), signals=(name,), timeout=timeout)

    async def select(self, *names: str, timeout: Duration | None = None) -> Selected | None:
        """Wait for the first of several signals (and optionally a timeout).

        Returns ``Selected(name, payload)`` for the signal that came first (oldest first if
        several were already buffered), or ``None`` on timeout.
        """
        if not names:
            raise ValueError("ctx.select needs at least one signal name")
        for n in names:
            validate_signal_name(n)
        got = await self._wait(WaitKey.select(*names), signals=names, timeout=timeout)
        if got is None:
            return None
        return Selected(name=got.signal or "", payload=from_raw(got.payload, Any))

    async def _wait(
        self,
        key: WaitKey,
        *,
        signals: tuple[str, ...] = (),
        timeout: Duration | None = None,
        until: datetime | None = None,
        children: tuple[str, ...] = (),
    ) -> RecordedWait | None:
        """The one wait primitive: returns how the wait ended (``None``: timed out) or parks."""
        self._driver.check_live()

        def deadline() -> float | None:
            if until is not None:
                return until.timestamp()
            return None if timeout is None else time.time() + _seconds(timeout)

        turn = self._m.wait(key.format(), signals=signals, deadline=deadline, children=children)
        if not isinstance(turn, WaitTurn):
            return turn
        return await self._decide(turn)

    async def _decide(self, turn: WaitTurn) -> RecordedWait | None:
        looked = False
        while True:
            action = turn.next(time.time(), looked=looked)
            if action is None:
                return None
            if isinstance(action, RecordedWait):
                if action.outcome == "signal" and turn.deadline is not None:
                    self._driver.cancel_timer(turn.position)
                return action
            if isinstance(action, LookupChildren):
                looked = True
                for child in action.children:
                    outcome = await self._driver.child_outcome(child)
                    if outcome is not None:
                        return turn.child_ended(to_raw(outcome), outcome.status, time.time())
                continue
            await self._driver.park(action)
            if not turn.signal_waiting():
                # Unwinds (``Parked``), or rests here while the worker keeps the run, and
                # returns once it resumed it with what others appended: look again, as a new
                # activation would (``worker/sticky.py``).
                await self._driver.rest()
                looked = False
            # a signal arrived while the wait was being recorded: take it now

    # --- children --------------------------------------------------------------------------

    async def start_child(self, agent: str | Any, input: Any = None) -> ChildHandle:
        """Start a run of another agent as this run's child; returns a handle to await.

        The child's run id is ``<run_id>-c<position>``, so a replay or a retry starts it
        once. Cancelling this run cancels its children.

        Raises:
            PayloadTooLarge: the child's input does not fit in one message.
        """
        self._driver.check_live()
        name = agent if isinstance(agent, str) else str(agent.name)
        got = self._m.child(name)
        if isinstance(got, Return):
            return ChildHandle(self, from_raw(got.result, str), name)
        body = encode(
            _wire.StartTrigger(input=to_raw(input), run_id=got.child_id, parent_run_id=self.run_id)
        )
        if len(body) > self._max_payload:
            raise PayloadTooLarge(
                f"child run input is {len(body)} bytes; the limit is {self._max_payload}",
                run_id=self.run_id,
            )
        await self._driver.start_child(name, body, got.child_id)
        self._m.child_started(got, name, time.time())
        return ChildHandle(self, got.child_id, name)

    @overload
    def child(self, agent: str | Any, input: Any = None) -> ChildCall[Any]: ...

    @overload
    def child(self, agent: str | Any, input: Any = None, *, type: type[T]) -> ChildCall[T]: ...

    def child(self, agent: str | Any, input: Any = None, *, type: Any = None) -> ChildCall[Any]:
        """Run another agent as a child: await this for its output (the run parks meanwhile),
        or pass it to ``ctx.gather`` with others to run them at once. Nothing starts until
        it is awaited or gathered."""
        return ChildCall(lambda: self.start_child(agent, input), Any if type is None else type)

    async def gather(
        self,
        *aws: Awaitable[Any],
        return_exceptions: bool = False,
        limit: int | None = None,
    ) -> list[Any]:
        """Run several operations at once and return their results in argument order, the
        same on every replay whichever finishes first::

            a, b, kid = await ctx.gather(
                ctx.step(fetch, url1), ctx.step(fetch, url2), ctx.child("summarise", doc)
            )

        Each argument is one ``ctx.step(...)`` call (``ctx.llm(...)`` too, or a coroutine that
        makes exactly one step call before it awaits anything), a ``ctx.child(...)`` or a
        ``handle.result()``. Children are started first, in argument order; steps then run
        concurrently (at most ``limit`` at once, started in argument order); child results are
        awaited last, in argument order (the run parks until each has ended). A failure is
        raised once every argument has settled: the first in argument order, or each in its
        place with ``return_exceptions=True``.

        Raises:
            GatherError: an argument makes a second journaled call, or one after awaiting
                something, or a wait or child start of its own (its position would depend on
                timing, which a replay cannot reproduce); a gather inside a gather.
            ValueError: more than 1000 arguments, or a ``limit`` below 1.
            StepError, ChildRunError: the first failure in argument order
                (``return_exceptions=False``).
        """
        self._driver.check_live()
        return await _gather.gather(
            self._m, self._driver.commit, aws, return_exceptions=return_exceptions, limit=limit
        )

    async def _await_child(self, handle: ChildHandle, tp: Any) -> Any:
        got = await self._wait(
            WaitKey.child(handle.run_id),
            signals=(child_signal(handle.run_id),),
            children=(handle.run_id,),
        )
        assert got is not None
        outcome: ChildOutcome = from_raw(got.payload, ChildOutcome)
        if outcome.status != "completed":
            detail = f": {outcome.error.code}: {outcome.error.message}" if outcome.error else ""
            raise ChildRunError(
                f"child run {handle.run_id} ({handle.agent}) {outcome.status}{detail}",
                run_id=self.run_id,
                child_run_id=handle.run_id,
                status=outcome.status,
            )
        return from_raw(outcome.output, tp)

    # --- long conversations ------------------------------------------------------------

    def continue_as_new(self, input: Any) -> NoReturn:
        """End this run and carry on in a new run of the same agent with ``input`` and an
        empty history: a conversation of thousands of turns stays as quick to wake as one of
        ten. Never returns (it raises a ``BaseException`` that ``except Exception`` cannot
        catch), whether awaited or not.

        The new run's id is ``<first run id>-g<n>``; it keeps this run's parent, agent and
        budget, and the signals this run holds that no wait took. The chain's first id stays
        the handle of the whole conversation: ``Client.result``, ``sojourn watch`` and
        signals and cancels sent to it follow the chain to its current run, and a parent
        learns the outcome of the chain's last run. ``input`` larger than
        ``Settings.value_inline_max`` is stored by reference, its unchanged parts shared.

        Raises:
            TypeError: ``input`` is not JSON-encodable.
        """
        self._driver.check_live()
        self._m.check()
        try:
            raw = to_raw(input)
        except msgspec.EncodeError as e:
            raise TypeError(f"ctx.continue_as_new input must be JSON-encodable: {e}") from e
        raise ContinueAsNew(raw)

    # --- approvals and polling -----------------------------------------------------------

    async def approval(
        self,
        name: str,
        *,
        approvers: Sequence[str],
        timeout: Duration,
        remind: Callable[[str, str], Any] | None = None,
        remind_every: Duration | None = None,
        escalate: Callable[[str, str | None, str], Any] | None = None,
        on_timeout: Literal["deny", "approve", "fail"] = "deny",
        allowed: Sequence[str] = (),
    ) -> ApprovalDecision:
        """Wait for a human decision, with reminders, an escalation chain and a final policy.

        Each approver in turn gets ``timeout`` to answer; ``remind(approver, name)`` runs as a
        step when the approver is asked and every ``remind_every`` after that;
        ``escalate(approver, next_approver_or_None, name)`` runs as a step when an approver's
        time is up. After the last approver, ``on_timeout`` decides: ``deny``, ``approve`` or
        ``fail`` (raises ``ApprovalTimeout``). A decision is the signal
        ``approval.<name>`` with payload ``{"approve": bool, "by": "...", "note": "..."}``;
        the returned ``ApprovalDecision`` says who decided and when, and the history keeps the
        whole audit (requests, reminders, escalations, the decision).

        Who decided: on a deployment with authentication, the signal's sender as the broker
        authenticated it (the payload's ``by`` is ignored), and a decision from anyone but the
        approver asked now, or one of ``allowed`` (names that may decide at any stage), is
        refused: recorded in the history (a ``refusal`` value naming the sender) while the
        wait goes on to the same deadline. Without authentication ``by`` is the payload's claim
        (else the signal's ``sent_by``), unchecked: ``ApprovalDecision.verified`` tells which.
        """
        return await _approval(
            self,
            name,
            approvers=approvers,
            timeout=timeout,
            remind=remind,
            remind_every=remind_every,
            escalate=escalate,
            on_timeout=on_timeout,
            allowed=allowed,
        )

    async def poll(
        self,
        check: Callable[..., Awaitable[R | None]] | Callable[..., R | None],
        /,
        *args: Any,
        every: Duration,
        backoff: float = 2.0,
        max_interval: Duration | None = None,
        timeout: Duration | None = None,
        **kwargs: Any,
    ) -> R:
        """Poll an external job: run ``check(*args, **kwargs)`` as a step until it returns
        something other than ``None``, pausing ``every`` (times ``backoff`` after each check,
        at most ``max_interval``) on a broker timer between checks, never in a process.

        Every check counts against the run's poll cap (``@agent(..., poll_cap=N)``, default
        1000): a run that reaches it is *suspended* (visible in ``sojourn status``), not failed
        and not left polling; ``sojourn resume RUN`` grants it another ``N`` checks.

        Raises:
            PollTimeout: ``timeout`` passed before the job finished.
        """
        return await _poll(
            self,
            check,
            *args,
            every=every,
            backoff=backoff,
            max_interval=max_interval,
            timeout=timeout,
            **kwargs,
        )

    async def _count_poll(self, what: str) -> None:
        suspend = self._m.count_poll(what, time.time())
        if suspend is not None:
            if suspend.unit is not None:
                _metrics.BUDGET_BREACHES.labels(self._driver.metric_agent, suspend.unit).inc()
            await self._driver.suspend(suspend.event)

    # --- journaled values --------------------------------------------------------------------

    def _value(self, kind: str, make: Callable[[], Any], tp: Any) -> Any:
        self._driver.check_live()
        return from_raw(self._m.value(kind, make, time.time()).result, tp)

    async def spend(self, *, usd: float = 0.0, tokens: int = 0) -> None:
        """Record what the run just spent (an LLM call's cost and tokens), journaled.

        Totals are counted in ``sojourn_spend_total``. When the agent has a ``Budget`` and the
        run's total reaches it, the run is suspended (reason ``budget``) before it can spend
        more; ``sojourn resume RUN`` grants the same budget again.

        Raises:
            ValueError: a negative amount.
        """
        if usd < 0 or tokens < 0:
            raise ValueError("ctx.spend amounts must not be negative")
        self._driver.check_live()
        live, over = self._m.spend(usd, tokens, time.time())
        agent = self._driver.metric_agent
        if live:
            _metrics.count_spend(agent, "usd", usd)
            _metrics.count_spend(agent, "tokens", tokens)
        if over is not None:
            _metrics.BUDGET_BREACHES.labels(agent, over.unit or "usd").inc()
            await self._driver.suspend(over.event)

    def now(self) -> datetime:
        """The current time (UTC), journaled: replay returns the recorded instant."""
        value: datetime = self._value("now", lambda: datetime.now(UTC), datetime)
        return value

    def uuid(self) -> _uuid.UUID:
        """A random UUID4, journaled."""
        value: _uuid.UUID = self._value("uuid", _uuid.uuid4, _uuid.UUID)
        return value

    def random(self) -> float:
        """A float in [0, 1), journaled."""
        value: float = self._value("random", _random.random, float)
        return value

    def callback(self, signal: str, *, ttl: Duration) -> str:
        """A token to hand an external system (an e-signature service, a payment provider)
        that will call back over HTTP: the gateway delivers its POST body as the signal
        ``signal`` to this run, once however often it is repeated, until ``ttl`` has passed.
        Wait for it with ``ctx.wait_for(signal)`` as for any signal.

        Journaled: a replay returns the same token (so it is in the run's history; treat the
        history as holding a capability until the token expires). Each call is a new token
        with its own signal id: hand out one per callback you expect.

        Raises:
            InvalidName: ``signal`` is not a signal name, or a reserved (``sojourn-``) one.
            ValueError: ``ttl`` is not more than 0 and at most 366 days.
            CallbackKeysMissing: the worker has no callback keys (``SOJOURN_CALLBACK_KEYS``
                or ``Worker(callback_keys=...)``); a replay of a recorded token needs none.
        """
        check_callback_signal(signal)
        seconds = check_ttl(_seconds(ttl))
        keys = self._callback_keys
        if keys is None and not self._m.replaying and not self.offline:
            # Refused before the call takes a position: nothing is recorded.
            raise CallbackKeysMissing(
                f"ctx.callback needs callback keys: set {CALLBACK_KEYS_ENV} to a key file "
                "(one `KID SECRET` per line) or pass Worker(callback_keys=CallbackKeys(...))",
                run_id=self.run_id,
            )

        def issue() -> str:
            assert keys is not None  # a recorded token is returned without issuing one
            return keys.issue(self.run_id, signal, seconds, time.time())

        token: str = self._value("callback", issue, str)
        return token


def _journal_refusal(ctx: Context, refused: ApprovalRefused) -> None:
    """Record a refused decision in the run's history (a ``refusal`` value), for the audit."""
    ctx._value("refusal", lambda: refused, ApprovalRefused)


async def _approval(
    ctx: Context,
    name: str,
    *,
    approvers: Sequence[str],
    timeout: Duration,
    remind: Callable[[str, str], Any] | None = None,
    remind_every: Duration | None = None,
    escalate: Callable[[str, str | None, str], Any] | None = None,
    on_timeout: Literal["deny", "approve", "fail"] = "deny",
    allowed: Sequence[str] = (),
) -> ApprovalDecision:
    """Ask ``approvers`` in turn; see ``Context.approval``. (Here rather than in
    ``patterns``, which then needs nothing of this module: no import circle.)"""
    if not approvers:
        raise ValueError("an approval needs at least one approver")
    if isinstance(allowed, str):
        raise TypeError("allowed is a sequence of names, not one string")
    anyone = frozenset(allowed)
    signal = f"approval.{name}"
    for stage, approver in enumerate(approvers):
        if remind is not None:
            await ctx.step(remind, approver, name)  # the request itself
        stage_deadline = ctx.now() + timedelta(seconds=_seconds(timeout))
        next_remind: datetime | None = None  # kept when an answer is ignored or refused
        while True:
            now = ctx.now()
            until = stage_deadline
            if remind_every is not None and remind is not None:
                if next_remind is None:
                    next_remind = now + timedelta(seconds=_seconds(remind_every))
                until = min(until, next_remind)
            got = await ctx._receive(signal, timeout=max((until - now).total_seconds(), 0.0))
            if got is not None:
                verdict = judge(
                    from_raw(got.payload, Any),
                    got.sent_by,
                    got.sender_verified,
                    name=name,
                    stage=stage,
                    approver=approver,
                    allowed=anyone,
                )
                if verdict is None:
                    continue  # keep waiting, to the same deadline
                if isinstance(verdict, ApprovalRefused):
                    _journal_refusal(ctx, verdict)
                    continue  # keep waiting, to the same deadline
                return ApprovalDecision(
                    approved=verdict.approve,
                    by=verdict.by,
                    at=ctx.now(),
                    note=verdict.note,
                    via="decision",
                    stage=stage,
                    verified=verdict.verified,
                )
            if ctx.now() >= stage_deadline:
                break
            assert remind is not None
            await ctx.step(remind, approver, name)  # a reminder
            next_remind = None
        nxt = approvers[stage + 1] if stage + 1 < len(approvers) else None
        if escalate is not None:
            await ctx.step(escalate, approver, nxt, name)
    if on_timeout == "fail":
        raise ApprovalTimeout(
            f"approval '{name}' got no decision from {list(approvers)}", run_id=ctx.run_id
        )
    return ApprovalDecision(
        approved=on_timeout == "approve",
        by="policy",
        at=ctx.now(),
        note=f"no decision before the last deadline: {on_timeout}",
        via="policy",
        stage=len(approvers) - 1,
    )


async def _poll(
    ctx: Context,
    check: Callable[..., Awaitable[R | None]] | Callable[..., R | None],
    *args: Any,
    every: Duration,
    backoff: float = 2.0,
    max_interval: Duration | None = None,
    timeout: Duration | None = None,
    **kwargs: Any,
) -> R:
    """Check until done; see ``Context.poll``."""
    if backoff < 1.0:
        raise ValueError("backoff must be >= 1.0")
    interval = _seconds(every)
    cap_interval = None if max_interval is None else _seconds(max_interval)
    deadline = None if timeout is None else ctx.now() + timedelta(seconds=_seconds(timeout))
    while True:
        await ctx._count_poll(getattr(check, "__name__", "check"))
        result: Any = await ctx.step(check, *args, **kwargs)
        if result is not None:
            return cast(R, result)
        if not ctx.replaying:
            _metrics.IDLE_POLLS.labels(_metrics.agent_label(ctx.agent)).inc()
        if deadline is not None:
            left = (deadline - ctx.now()).total_seconds()
            if left <= 0:
                raise PollTimeout(
                    f"poll of {getattr(check, '__name__', 'check')} timed out", run_id=ctx.run_id
                )
            pause = min(interval, left)
        else:
            pause = interval
        # Its own wait key, so that history (and the watchdog) can count idle polls.
        await ctx._wait(WaitKey.poll(), timeout=pause)
        interval *= backoff
        if cap_interval is not None:
            interval = min(interval, cap_interval)


class ChildHandle:
    """A child run started with ``ctx.start_child``; await ``result()`` for its output."""

    def __init__(self, ctx: Context, run_id: str, agent: str) -> None:
        self._ctx = ctx
        self.run_id = run_id
        self.agent = agent

    @overload
    def result(self) -> ChildResult[Any]: ...

    @overload
    def result(self, *, type: type[T]) -> ChildResult[T]: ...

    def result(self, *, type: Any = None) -> ChildResult[Any]:
        """Wait (durably: the run parks) until the child ends; return its output. Await it, or
        pass it to ``ctx.gather`` with others.

        Raises:
            ChildRunError: the child failed, was cancelled, or its trigger was rejected.
        """
        tp = Any if type is None else type
        return ChildResult(lambda: self._ctx._await_child(self, tp))

    def __repr__(self) -> str:
        return f"ChildHandle({self.agent!r}, {self.run_id!r})"
