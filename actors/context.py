"""``Context``: what agent code uses to do anything that must survive a crash.

Every method here is journaled. On replay a recorded step returns its recorded result without
running; a recorded ``now()``/``uuid()``/``random()`` returns the recorded value. Code *between*
these calls must be deterministic and side-effect free: it runs again on every replay.

Replay hazards (they raise ``NondeterminismError`` at the next journaled call, or corrupt
nothing but behave differently): reading the wall clock or ``random`` directly, iterating a
``set`` whose order depends on hashing of str, branching on environment variables or on the
current time, or calling steps in a different order after a deploy.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import random as _random
import time
import traceback
import typing
import uuid as _uuid
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

import msgspec

from sojourn.broker.names import validate_signal_name
from sojourn.schemas import wire as _wire
from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.errors import (
    ChildRunError,
    NondeterminismError,
    PayloadTooLarge,
    RetryableError,
    StepError,
    TerminalError,
)
from sojourn.schemas.events import (
    ChildStarted,
    ErrorInfo,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
    WaitStarted,
)
from sojourn.schemas.wire import ChildOutcome

from . import metrics as _metrics
from . import patterns as _patterns
from .faults import fault
from .journal import Execute, OpenWait, Recorded, RecordedFailure, RecordedWait
from .patterns import ApprovalDecision
from .retry import DEFAULT_RETRYABLE, NOT_DONE, RetryPolicy, StepOptions, step_options

if TYPE_CHECKING:
    from .executor import Activation

__all__ = [
    "ChildHandle",
    "Context",
    "Parked",
    "Selected",
    "StepInfo",
    "current_step",
    "heartbeat",
    "idempotency_headers",
]

HEARTBEAT_DETAILS_MAX = 8 * 1024
"""Largest ``ctx.heartbeat(details)`` in bytes of JSON: it rides on every lease renewal."""

Duration = float | int | timedelta
"""Seconds as a number, or a ``timedelta``."""


class Parked(BaseException):
    """Unwinds agent code when the run parks on a wait (not catchable by ``except Exception``).

    The run's position and wake condition are recorded; no coroutine is kept anywhere.
    """


@dataclass(frozen=True, slots=True)
class Selected:
    """Which of several awaited signals arrived first, and its payload."""

    name: str
    payload: Any


def _seconds(d: Duration) -> float:
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


_RUN_AGAIN: Any = object()


ERROR_TEXT_MAX = 4000
"""Characters of an error message (and of a traceback's tail) kept in history: a failure
recorded as data stays small, and so does the end notice of a failed child."""


def clip_text(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text``, cut to ``limit`` characters with a note saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def error_info(e: BaseException) -> ErrorInfo:
    """An exception as recorded data: its type name, message (clipped) and traceback tail."""
    return ErrorInfo(
        type=clip_text(type(e).__name__, 200),
        message=clip_text(str(e)),
        traceback="".join(traceback.format_exception(e))[-ERROR_TEXT_MAX:],
    )


def _failure_text(name: str, attempts: int, err: ErrorInfo) -> str:
    """The ``StepError`` message: built from recorded data only, so replay says the same."""
    return f"step '{name}' failed after {attempts} attempt(s): {err.type}: {err.message}"


def child_run_id(parent: str, position: int) -> str:
    """``<parent>-c<position>``; hashed when that would pass the 128-character id limit (deep
    nesting), so a child id is always valid and always the same for the same parent and call."""
    plain = f"{parent}-c{position}"
    if len(plain) <= 128:
        return plain
    digest = hashlib.blake2b(parent.encode(), digest_size=12).hexdigest()
    return f"{parent[:80]}-h{digest}-c{position}"


def _retry_delay(e: Exception, policy: RetryPolicy | None, attempt: int) -> float | None:
    """Seconds until the next attempt, or ``None`` when the failure is final."""
    if isinstance(e, TerminalError):
        return None
    if isinstance(e, RetryableError):
        p = policy or DEFAULT_RETRYABLE
        if attempt >= p.attempts:
            return None
        return e.retry_after if e.retry_after is not None else p.delay(attempt)
    if policy is None or attempt >= policy.attempts or not isinstance(e, policy.retry_on):
        return None
    return policy.delay(attempt)


CHILD_SIGNAL = _wire.CHILD_SIGNAL

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step may know about itself.

    ``idempotency_key`` is ``<run_id>/<position>``: the same on every attempt, on every worker,
    after every restart. Pass it to external APIs (``Idempotency-Key`` header, a unique column)
    so that a step re-run after a crash does not act twice.
    """

    run_id: str
    position: int
    name: str
    attempt: int
    idempotency_key: str
    in_doubt: bool
    report: Callable[[Any], None] | None = None

    def heartbeat(self, details: Any = None) -> None:
        """Report this step's progress (see ``heartbeat``)."""
        if self.report is not None:
            self.report(details)


_current: ContextVar[StepInfo | None] = ContextVar("sojourn_current_step", default=None)


def current_step() -> StepInfo:
    """The step being executed by the calling code (inside a step function only).

    Raises:
        RuntimeError: called outside a step.
    """
    info = _current.get()
    if info is None:
        raise RuntimeError("current_step() is only available inside a function run by ctx.step")
    return info


def heartbeat(details: Any = None) -> None:
    """Report the progress of the step being executed (from inside a step function, also from
    a sync one running in a thread): ``details`` (JSON, at most 8 KiB) is shown by
    ``sojourn status`` and rides on the run's next heartbeat, sent within a second.

    A step's heartbeat needs no call: its worker heartbeats for it while it runs. Call this to
    say how far a long step has got.

    Raises:
        RuntimeError: called outside a step.
        PayloadTooLarge: ``details`` encodes to more than 8 KiB.
    """
    current_step().heartbeat(details)


def idempotency_headers(header: str = "Idempotency-Key") -> dict[str, str]:
    """HTTP headers carrying the current step's idempotency key, for APIs that deduplicate on
    it (Stripe, most payment and email providers): a step re-run after a crash sends the same
    key, so the provider acts once.

    Example:
        >>> async def charge(card: str, cents: int) -> str:          # doctest: +SKIP
        ...     r = await http.post("https://api.example.com/charges",
        ...                         json={"card": card, "amount": cents},
        ...                         headers=idempotency_headers())
        ...     return r.json()["id"]

    Raises:
        RuntimeError: called outside a step.
    """
    return {header: current_step().idempotency_key}


def _memo(compute: Callable[[Callable[..., Any]], T]) -> Callable[[Callable[..., Any]], T]:
    """Cache a per-function fact; unhashable callables are computed each time."""
    cached = functools.lru_cache(maxsize=4096)(compute)

    def lookup(fn: Callable[..., Any]) -> T:
        try:
            return cached(fn)
        except TypeError:  # unhashable callable
            return compute(fn)

    return lookup


def _hinted_return(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return", Any)
    except Exception:
        return Any


def _coroutine_function(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


_return_type = _memo(_hinted_return)
_is_async = _memo(_coroutine_function)


def step_name(fn: Callable[..., Any]) -> str:
    """The journaled name of a step function (its ``__name__``, or ``@step(name=...)``)."""
    explicit = getattr(fn, "__sojourn_step_name__", None)
    if isinstance(explicit, str):
        return explicit
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and not hasattr(fn, "__name__"):
        return step_name(inner)
    return str(getattr(fn, "__name__", type(fn).__name__))


class Context:
    """The handle an agent run gets as its first argument."""

    def __init__(self, activation: Activation) -> None:
        self._act = activation
        self._loop = asyncio.get_running_loop()
        self._spent_usd = 0.0
        self._spent_tokens = 0
        self._journal = activation.journal
        self._polls = 0

    @property
    def run_id(self) -> str:
        return self._act.run_id

    @property
    def agent(self) -> str:
        return self._act.agent.name

    @property
    def replaying(self) -> bool:
        """True while the code re-executes recorded history (e.g. to skip logging)."""
        return self._journal.replaying

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
        progress = self._act.progress
        progress.details = raw
        progress.changed = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._act.poke_heartbeat()
        else:
            self._loop.call_soon_threadsafe(self._act.poke_heartbeat)

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
        self._act.check_cancelled()
        name = step_name(fn)
        try:
            plan = self._journal.step(name)
        except NondeterminismError as e:
            self._act.note_nondeterminism(e)
            raise
        rtype = _return_type(fn)
        if isinstance(plan, Recorded):
            fault("replay")
            return from_raw(plan.result, rtype)
        if isinstance(plan, RecordedFailure):
            raise StepError(
                _failure_text(name, plan.attempts, plan.error),
                error_type=plan.error.type,
                run_id=self.run_id,
                step=name,
            )
        assert isinstance(plan, Execute)
        opts = step_options(fn)
        policy = opts.retry or self._act.agent.retry
        while True:
            if plan.retry_at is not None:
                await self._act.backoff(plan.position, plan.retry_at)
            elif plan.in_doubt:
                if not self._journal.replaying:
                    _metrics.STEPS_IN_DOUBT.labels(*self._labels(name)).inc()
                settled = await self._settle_in_doubt(fn, name, plan, opts, rtype)
                if settled is not _RUN_AGAIN:
                    return settled
            outcome = await self._attempt(fn, name, plan, args, kwargs, policy)
            if isinstance(outcome, Execute):
                plan = outcome  # a retry is due
                continue
            return from_raw(outcome, rtype)

    async def _attempt(
        self,
        fn: Callable[..., Any],
        name: str,
        plan: Execute,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: RetryPolicy | None,
    ) -> msgspec.Raw | Execute:
        """One recorded attempt: start, run, record the result or the failure."""
        await self._act.commit(
            [StepStarted(position=plan.position, name=name, attempt=plan.attempt, at=time.time())]
        )
        labels = self._labels(name)
        _metrics.TOOL_CALLS.labels(labels[0]).inc()
        if plan.attempt > 1 and not plan.in_doubt:
            _metrics.STEP_RETRIES.labels(*labels).inc()
        progress = self._act.progress
        progress.step, progress.step_started_at, progress.details = name, time.time(), None
        token = _current.set(self._info(name, plan))
        t0 = time.perf_counter()
        try:
            if _is_async(fn):
                result: Any = await fn(*args, **kwargs)
            else:
                result = await asyncio.to_thread(fn, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            raw = to_raw(result)
            fault("after_step")
        except Exception as e:
            delay = _retry_delay(e, policy, plan.attempt)
            return self._failed(name, plan, e, delay, time.perf_counter() - t0, labels)
        finally:
            _current.reset(token)
            progress.step = progress.step_started_at = progress.details = None
        spent = time.perf_counter() - t0
        too_big = self._act.oversized(raw, f"the result of step '{name}'")
        if too_big is not None:
            # Not retried: another attempt would most likely return the same data.
            return self._failed(name, plan, too_big, None, spent, labels)
        _metrics.STEP_DURATION.labels(*labels).observe(spent)
        _metrics.STEPS.labels(*labels, "completed").inc()
        self._act.buffer(
            StepCompleted(
                position=plan.position,
                name=name,
                attempt=plan.attempt,
                result=raw,
                duration=spent,
                at=time.time(),
            )
        )
        return raw

    def _failed(
        self,
        name: str,
        plan: Execute,
        e: Exception,
        delay: float | None,
        spent: float,
        labels: tuple[str, str],
    ) -> Execute:
        """Record a failed attempt; return the next attempt's plan, or raise ``StepError``."""
        err = error_info(e)
        retry_at = None if delay is None else time.time() + delay
        _metrics.STEP_DURATION.labels(*labels).observe(spent)
        outcome = "failed" if retry_at is None else "retry_scheduled"
        _metrics.STEPS.labels(*labels, outcome).inc()
        self._act.buffer(
            StepFailed(
                position=plan.position,
                name=name,
                attempt=plan.attempt,
                error=err,
                duration=spent,
                retry_at=retry_at,
                at=time.time(),
            )
        )
        if retry_at is not None:
            return Execute(
                position=plan.position,
                attempt=plan.attempt + 1,
                in_doubt=False,
                retry_at=retry_at,
            )
        raise StepError(
            _failure_text(name, plan.attempt, err),
            error_type=err.type,
            run_id=self.run_id,
            step=name,
        ) from e

    def _labels(self, step: str) -> tuple[str, str]:
        agent = self._act.metric_agent
        return agent, _metrics.step_label(agent, step)

    def _info(self, name: str, plan: Execute) -> StepInfo:
        return StepInfo(
            run_id=self.run_id,
            position=plan.position,
            name=name,
            attempt=plan.attempt,
            idempotency_key=f"{self.run_id}/{plan.position}",
            in_doubt=plan.in_doubt,
            report=self.heartbeat,
        )

    async def _settle_in_doubt(
        self, fn: Callable[..., Any], name: str, plan: Execute, opts: StepOptions, rtype: Any
    ) -> Any:
        """A step that may have run: apply its in-doubt policy before running it again.

        A step cut off ``Settings.crash_loop_limit`` times in a row is probably what kills its
        worker (a segfault, running out of memory): running it again would take down worker
        after worker. Whatever its policy, it then waits for a human, like ``in_doubt="ask"``.
        """
        limit = self._act.store.settings.crash_loop_limit
        crash_loop = 0 < limit <= plan.interrupted
        policy = "ask" if crash_loop else opts.in_doubt
        if policy == "retry":
            return _RUN_AGAIN
        if policy == "ask":
            decision = self._act.take_decision(plan.position, plan.attempt - 1)
            if decision is None:
                decide = (
                    f"decide with `sojourn decide {self.run_id} {plan.position} "
                    "retry|skip|fail [--result JSON]`"
                )
                if crash_loop:
                    await self._act.suspend(
                        "crash_loop",
                        f"step '{name}' at position {plan.position} (key "
                        f"{self.run_id}/{plan.position}) was cut off {plan.interrupted} times in "
                        "a row: it may be what kills its worker; " + decide,
                    )
                await self._act.suspend(
                    "in_doubt",
                    f"step '{name}' at position {plan.position} (key "
                    f"{self.run_id}/{plan.position}) started but its end was never recorded; "
                    + decide,
                )
            assert decision is not None
            if decision.action == "retry":
                return _RUN_AGAIN
            if decision.action == "skip":
                return self._record_without_running(name, plan, decision.result, rtype)
            err = ErrorInfo(
                type="InDoubtFailed",
                message=f"failed by decision of {decision.by or 'an operator'}",
            )
            raise self._fail_in_doubt(name, plan, err)
        # A reconcile function: ask the external system, by idempotency key.
        token = _current.set(self._info(name, plan))
        try:
            key = f"{self.run_id}/{plan.position}"
            if _is_async(policy):
                found = await policy(key)
            else:  # like a sync step: off the event loop, so heartbeats keep going
                found = await asyncio.to_thread(policy, key)
                if inspect.isawaitable(found):
                    found = await found
        finally:
            _current.reset(token)
        if found is NOT_DONE:
            return _RUN_AGAIN
        return self._record_without_running(name, plan, to_raw(found), rtype)

    def _fail_in_doubt(self, name: str, plan: Execute, err: ErrorInfo) -> StepError:
        """Record the earlier, in-doubt attempt of a step as failed with ``err``; return the
        ``StepError`` the agent's code gets (the same on replay)."""
        self._act.buffer(
            StepFailed(
                position=plan.position,
                name=name,
                attempt=plan.attempt - 1,
                error=err,
                at=time.time(),
            )
        )
        return StepError(
            _failure_text(name, plan.attempt - 1, err),
            error_type=err.type,
            run_id=self.run_id,
            step=name,
        )

    def _record_without_running(
        self, name: str, plan: Execute, raw: msgspec.Raw, rtype: Any
    ) -> Any:
        """Settle an in-doubt step with a known result: its earlier attempt did the work."""
        too_big = self._act.oversized(raw, f"the result of step '{name}'")
        if too_big is not None:
            raise self._fail_in_doubt(name, plan, error_info(too_big)) from too_big
        self._act.buffer(
            StepCompleted(
                position=plan.position,
                name=name,
                attempt=plan.attempt - 1,
                result=raw,
                at=time.time(),
            )
        )
        return from_raw(raw, rtype)

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
        await self._wait("sleep", timeout=duration, until=until)

    async def wait_for(self, name: str, *, timeout: Duration | None = None, type: Any = Any) -> Any:
        """Wait for the signal ``name`` and return its payload (decoded as ``type``), or
        ``None`` when ``timeout`` passes first.

        A signal that arrived before this call is buffered in the run's history and consumed
        here, oldest first: none is lost.
        """
        validate_signal_name(name)
        got = await self._wait(f"signal:{name}", signals=(name,), timeout=timeout)
        return None if got is None else from_raw(got.payload, type)

    async def select(self, *names: str, timeout: Duration | None = None) -> Selected | None:
        """Wait for the first of several signals (and optionally a timeout).

        Returns ``Selected(name, payload)`` for the signal that came first (oldest first if
        several were already buffered), or ``None`` on timeout.
        """
        if not names:
            raise ValueError("ctx.select needs at least one signal name")
        for n in names:
            validate_signal_name(n)
        got = await self._wait("select:" + "|".join(names), signals=names, timeout=timeout)
        if got is None:
            return None
        return Selected(name=got.signal or "", payload=from_raw(got.payload, Any))

    async def start_child(self, agent: str | Any, input: Any = None) -> ChildHandle:
        """Start a run of another agent as this run's child; returns a handle to await.

        The child's run id is ``<run_id>-c<position>``, so a replay or a retry starts it
        once. Cancelling this run cancels its children.
        """
        self._act.check_cancelled()
        name = agent if isinstance(agent, str) else str(agent.name)
        try:
            plan = self._journal.child(name)
        except NondeterminismError as e:
            self._act.note_nondeterminism(e)
            raise
        if isinstance(plan, Recorded):
            return ChildHandle(self, from_raw(plan.result, str), name)
        child_id = child_run_id(self.run_id, plan.position)
        await self._act.start_child_run(name, input, child_id)
        self._act.buffer(
            ChildStarted(position=plan.position, child_run_id=child_id, agent=name, at=time.time())
        )
        return ChildHandle(self, child_id, name)

    async def child(self, agent: str | Any, input: Any = None, *, type: Any = Any) -> Any:
        """Run another agent as a child and return its output (the run parks meanwhile)."""
        handle = await self.start_child(agent, input)
        return await handle.result(type=type)

    async def _await_child(self, handle: ChildHandle, tp: Any) -> Any:
        name = f"{CHILD_SIGNAL}.{handle.run_id}"
        got = await self._wait(f"child:{handle.run_id}", signals=(name,), children=(handle.run_id,))
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
        """
        return await _patterns.approval(
            self,
            name,
            approvers=approvers,
            timeout=timeout,
            remind=remind,
            remind_every=remind_every,
            escalate=escalate,
            on_timeout=on_timeout,
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
        return await _patterns.poll(
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
        self._polls += 1
        cap = self._act.agent.poll_cap
        allowance = cap * (1 + self._act.state.cap_resumes)
        if self._polls > allowance and not self._journal.replaying:
            await self._act.suspend(
                "cap",
                f"poll cap of {cap} checks reached (polling {what}); "
                "`sojourn resume RUN` allows another {cap}".replace("{cap}", str(cap)),
            )

    async def _wait(
        self,
        key: str,
        *,
        signals: tuple[str, ...] = (),
        timeout: Duration | None = None,
        until: datetime | None = None,
        children: tuple[str, ...] = (),
    ) -> RecordedWait | None:
        """The one wait primitive: returns how the wait ended (``None``: timed out) or parks."""
        self._act.check_cancelled()
        try:
            plan = self._journal.wait(key)
        except NondeterminismError as e:
            self._act.note_nondeterminism(e)
            raise
        if isinstance(plan, RecordedWait):
            return None if plan.outcome == "timeout" else plan
        assert isinstance(plan, OpenWait)
        p = plan.position
        if plan.recorded is not None:
            deadline = plan.recorded.deadline
        elif until is not None:
            deadline = until.timestamp()
        elif timeout is not None:
            deadline = time.time() + _seconds(timeout)
        else:
            deadline = None
        record = plan.recorded is None
        while True:
            done = self._act.resolve_wait(p, key, signals, deadline)
            if done is None and children:
                done = await self._act.resolve_child_wait(p, key, children)
            if done is not None:
                return None if done.outcome == "timeout" else done
            event = None
            if record:
                event = WaitStarted(
                    position=p,
                    key=key,
                    signals=signals,
                    deadline=deadline,
                    children=children,
                    at=time.time(),
                )
            if await self._act.park(p, deadline, event, signals):
                record = False
                continue  # a signal arrived while we recorded the wait: take it now
            raise Parked()

    def _value(self, kind: str, make: Callable[[], Any], tp: Any) -> Any:
        self._act.check_cancelled()
        try:
            plan = self._journal.value(kind)
        except NondeterminismError as e:
            self._act.note_nondeterminism(e)
            raise
        if isinstance(plan, Recorded):
            return from_raw(plan.result, tp)
        raw = to_raw(make())
        too_big = self._act.oversized(raw, f"the value of ctx.{kind}()")
        if too_big is not None:
            self._act.note_fatal(too_big)
            raise too_big
        self._act.buffer(
            ValueRecorded(
                position=plan.position,
                kind=kind,
                value=raw,
                at=time.time(),
            )
        )
        return from_raw(raw, tp)

    async def spend(self, *, usd: float = 0.0, tokens: int = 0) -> None:
        """Record what the run just spent (an LLM call's cost and tokens), journaled.

        Totals appear in ``sojourn status`` and ``sojourn_spend_total``. When the agent has a
        ``Budget`` and the run's total reaches it, the run is suspended (reason ``budget``)
        before it can spend more; ``sojourn resume RUN`` grants the same budget again.

        Raises:
            ValueError: a negative amount.
        """
        if usd < 0 or tokens < 0:
            raise ValueError("ctx.spend amounts must not be negative")
        replaying = self._journal.replaying
        self._value("spend", lambda: {"usd": usd, "tokens": tokens}, dict)
        self._spent_usd += usd
        self._spent_tokens += tokens
        agent = self._act.metric_agent
        if not replaying:
            _metrics.SPEND.labels(agent, "usd").inc(usd)
            _metrics.SPEND.labels(agent, "tokens").inc(tokens)
        budget = self._act.agent.budget
        if budget is None:
            return
        grants = 1 + self._act.state.budget_resumes
        over = [
            (unit, spent, limit * grants)
            for unit, spent, limit in (
                ("usd", self._spent_usd, budget.usd),
                ("tokens", self._spent_tokens, budget.tokens),
            )
            if limit is not None and spent >= limit * grants
        ]
        if over and not self._journal.replaying:
            unit, spent, allowed = over[0]
            _metrics.BUDGET_BREACHES.labels(agent, unit).inc()
            await self._act.suspend(
                "budget",
                f"spent {spent:g} {unit} of a budget of {allowed:g}; "
                "`sojourn resume RUN` grants the same budget again",
            )

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


class ChildHandle:
    """A child run started with ``ctx.start_child``; await ``result()`` for its output."""

    def __init__(self, ctx: Context, run_id: str, agent: str) -> None:
        self._ctx = ctx
        self.run_id = run_id
        self.agent = agent

    async def result(self, *, type: Any = Any) -> Any:
        """Wait (durably: the run parks) until the child ends; return its output.

        Raises:
            ChildRunError: the child failed, was cancelled, or its trigger was rejected.
        """
        return await self._ctx._await_child(self, type)

    def __repr__(self) -> str:
        return f"ChildHandle({self.agent!r}, {self.run_id!r})"
