"""One *activation* of a run: load → fold → replay the agent's code → run live until it ends.

This is the only module of the run core that awaits the broker. Its rules:

- Appends are serialized and fenced (``expected_seq`` = the last sequence this activation saw).
- A step's completion is not appended on its own: it rides with the next decision (the next
  step's start, or the run's end), so a steady-state step costs one append. If no decision
  follows within ``flush_delay`` the completion is flushed alone.
- On ``ConcurrencyConflict`` we read what was appended since. Events written by the intake
  (cancel requests today; signals later) commute with our decision: fold them in and append
  again on top. Anything else means another worker owns the run: raise ``Fenced`` into the
  agent code and stop, writing nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.leases import Progress
from sojourn.broker.timers import cancel_timers, schedule_timer
from sojourn.schemas.codec import decode_events, encode, to_raw
from sojourn.schemas.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    Fenced,
    NondeterminismError,
    PayloadTooLarge,
)
from sojourn.schemas.events import (
    CancelRequested,
    ChildStarted,
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunSuspended,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.wire import ChildOutcome, ErrorBody

from .agent import Agent
from .context import CHILD_SIGNAL, Context, Parked
from .journal import Journal, RecordedWait
from .metrics import APPENDS, EVENTS_APPENDED, agent_label
from .state import RunState, SignalRecord, fold

__all__ = ["Activation", "Outcome", "RunCancelledInterrupt"]

Outcome = Literal["completed", "failed", "cancelled", "suspended", "waiting", "fenced", "noop"]

EXTERNAL_EVENTS = (CancelRequested, SignalReceived)
"""Events other parties append to a run without owning it; they commute with our decisions."""


_OP_EVENTS = (
    StepStarted,
    StepCompleted,
    StepFailed,
    ValueRecorded,
    WaitStarted,
    WaitCompleted,
    ChildStarted,
)
T = TypeVar("T")
_NULL = to_raw(None)
IN_PROCESS_BACKOFF = 5.0
"""Backoffs up to this many seconds also sleep in the worker (the timer is set regardless)."""
DECIDE_SIGNAL = "sojourn-decide"
"""Prefix of the signal carrying an operator's decision about an in-doubt step."""


class InDoubtDecision(msgspec.Struct, frozen=True, kw_only=True):
    """``sojourn decide``: what to do with an in-doubt step."""

    action: Literal["retry", "skip", "fail"]
    result: msgspec.Raw = msgspec.Raw(b"null")
    by: str | None = None


_decision_decoder = msgspec.json.Decoder(InDoubtDecision)


def decode_decision(data: bytes) -> InDoubtDecision:
    return _decision_decoder.decode(data)


class BrokerLost(BaseException):
    """Unwinds agent code when an append could not reach the broker in time.

    A ``BaseException`` so that an agent's ``except Exception`` cannot turn a broker outage
    into a recorded failure of the run.
    """


class RunCancelledInterrupt(BaseException):
    """Unwinds agent code when a cancel was requested (not catchable by ``except Exception``)."""


class Activation:
    """Executes one run from its history until it completes, fails, parks or is fenced."""

    def __init__(
        self,
        *,
        agent: Agent[object, object],
        run_id: str,
        store: EventStore,
        history: list[Decision],
        writer: str,
        flush_delay: float = 0.02,
        progress: Progress | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self.agent = agent
        self.progress = progress if progress is not None else Progress()
        self.poke_heartbeat = heartbeat or (lambda: None)
        self.metric_agent = agent_label(agent.name)
        self._appends_metric = APPENDS.labels(self.metric_agent)
        self._events_metric = EVENTS_APPENDED.labels(self.metric_agent)
        self.run_id = run_id
        self.store = store
        self.writer = writer
        self.flush_delay = flush_delay
        self.last_seq = history[-1].seq if history else 0
        self.state: RunState = fold(e for d in history for e in d.events)
        self.journal = Journal(self.state)
        self.pending: list[RunEvent] = []
        self.fenced = False
        self.appends = 0
        self.timers_used = False
        self._lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._nondeterminism: NondeterminismError | None = None
        self.consumed: set[str] = set()
        self.children: list[str] = list(self.state.children)
        self._background: set[asyncio.Task[None]] = set()

    # --- used by Context ----------------------------------------------------------------------

    def buffer(self, event: RunEvent) -> None:
        """Queue an event for the next append; make sure it is flushed soon if nothing follows."""
        self.pending.append(event)
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self.flush_delay, self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_handle = None
        if not self.pending or self.fenced:
            return
        if self._lock.locked():
            # An append is in flight and did not take these events: look again shortly.
            self._flush_handle = asyncio.get_running_loop().call_later(
                self.flush_delay, self._flush_soon
            )
            return
        task = asyncio.get_running_loop().create_task(self._flush_quietly())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _flush_quietly(self) -> None:
        try:
            await self.commit([])
        except (Fenced, RunCancelledInterrupt, BrokerLost):
            pass  # BrokerLost keeps the events buffered: the next decision retries them

    def note_nondeterminism(self, e: NondeterminismError) -> None:
        """Remember a divergence even if the agent's code catches the exception."""
        if self._nondeterminism is None:
            self._nondeterminism = e

    def check_cancelled(self) -> None:
        if self.fenced:
            raise Fenced(self.run_id)
        if self.state.cancel_requested is not None:
            raise RunCancelledInterrupt()

    async def commit(self, events: list[RunEvent]) -> None:
        """Append the buffered events plus ``events`` as one decision, fenced.

        Buffered events are taken when the append starts; events buffered while it is in flight
        wait for the next decision (or the flush timer).
        """
        async with self._lock:
            if self.fenced:
                raise Fenced(self.run_id)
            taken, self.pending = self.pending, []
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            batch = [*taken, *events]
            if not batch:
                return
            interrupted = False
            while True:
                try:
                    seq = await self._append(batch)
                except ConcurrencyConflict:
                    await self._rebase()
                    if self.state.cancel_requested is not None and any(
                        isinstance(e, StepStarted) for e in events
                    ):
                        # Cancelled while we were about to start a step: record what already
                        # happened, but start nothing new.
                        events, batch, interrupted = [], list(taken), True
                        if not batch:
                            raise RunCancelledInterrupt() from None
                    continue
                except BrokerLost:
                    self.pending[:0] = taken  # keep them for the next attempt
                    raise
                break
            self.appends += 1
            self.last_seq = seq
            self._appends_metric.inc()
            self._events_metric.inc(len(batch))
            # Live operations need no folding (the journal only consults what was recorded
            # before this activation); folding them would copy the op index on every step.
            others = [e for e in batch if not isinstance(e, _OP_EVENTS)]
            if others:
                self.state = fold(others, self.state)
            if interrupted:
                raise RunCancelledInterrupt()

    async def _io(self, op: Awaitable[T]) -> T:
        """Broker I/O done on behalf of agent code: an outage unwinds it as ``BrokerLost``."""
        try:
            return await op
        except (BrokerUnavailable, JetStreamError) as e:
            raise BrokerLost() from e

    async def _append(self, batch: list[RunEvent]) -> int:
        try:
            return await self.store.append(
                self.run_id, batch, expected_seq=self.last_seq, writer=self.writer
            )
        except (BrokerUnavailable, JetStreamError) as e:
            raise BrokerLost() from e

    async def _rebase(self) -> None:
        newer = await self.store.load(self.run_id, after_seq=self.last_seq)
        foreign = [e for d in newer for e in d.events if not isinstance(e, EXTERNAL_EVENTS)]
        if foreign or not newer:
            self.fenced = True
            raise Fenced(self.run_id)
        self.state = fold((e for d in newer for e in d.events), self.state)
        self.last_seq = newer[-1].seq

    # --- waits (used by Context) -------------------------------------------------------------

    def _find_signal(self, names: tuple[str, ...]) -> SignalRecord | None:
        for rec in self.state.signals:
            if rec.name in names and rec.signal_id not in self.consumed:
                return rec
        return None

    def resolve_wait(
        self, p: int, key: str, signals: tuple[str, ...], deadline: float | None
    ) -> RecordedWait | None:
        """Decide a wait from what is known now: a buffered signal, else a passed deadline."""
        sig = self._find_signal(signals)
        if sig is not None:
            self.consumed.add(sig.signal_id)
            self.buffer(
                WaitCompleted(
                    position=p,
                    key=key,
                    outcome="signal",
                    payload=sig.payload,
                    signal=sig.name,
                    signal_id=sig.signal_id,
                    at=time.time(),
                )
            )
            if deadline is not None:
                self._later(self._cancel_timer(p))
            return RecordedWait(position=p, outcome="signal", payload=sig.payload, signal=sig.name)
        if deadline is not None and time.time() >= deadline:
            self.buffer(
                WaitCompleted(position=p, key=key, outcome="timeout", payload=_NULL, at=time.time())
            )
            return RecordedWait(position=p, outcome="timeout", payload=_NULL, signal=None)
        return None

    async def resolve_child_wait(
        self, p: int, key: str, children: tuple[str, ...]
    ) -> RecordedWait | None:
        """A child may have ended without its notification reaching us: look at its history."""
        for child in children:
            outcome = await self._io(child_outcome(self.store, child))
            if outcome is not None:
                payload = to_raw(outcome)
                self.buffer(
                    WaitCompleted(
                        position=p,
                        key=key,
                        outcome="child",
                        payload=payload,
                        child_status=outcome.status,
                        at=time.time(),
                    )
                )
                return RecordedWait(position=p, outcome="child", payload=payload, signal=None)
        return None

    async def park(
        self, p: int, deadline: float | None, event: WaitStarted | None, signals: tuple[str, ...]
    ) -> bool:
        """Record the wait (timer first, then the event: a recorded wait never lacks its timer)
        and flush; return True if a matching signal turned up meanwhile."""
        if deadline is not None:
            await self._io(
                schedule_timer(self.store.broker, self.store.names, self.run_id, str(p), deadline)
            )
            self.timers_used = True
        await self.commit([event] if event is not None else [])
        return self._find_signal(signals) is not None

    async def _cancel_timer(self, p: int) -> None:
        names = self.store.names
        with contextlib.suppress(Exception):
            await self.store.broker.api(
                f"$JS.API.STREAM.PURGE.{names.wake_stream}",
                {"filter": names.timer(self.run_id, str(p))},
            )

    def _later(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def backoff(self, p: int, retry_at: float) -> None:
        """Wait until a retry is due: on a broker timer (a crash or deploy meanwhile loses
        nothing), in this process too when it is short."""
        left = retry_at - time.time()
        if left <= 0:
            return
        await self._io(
            schedule_timer(self.store.broker, self.store.names, self.run_id, str(p), retry_at)
        )
        self.timers_used = True
        await self.commit([])  # the failed attempt, with its retry_at
        if left > IN_PROCESS_BACKOFF:
            raise Parked()
        await asyncio.sleep(left)

    def take_decision(self, p: int, attempt: int) -> InDoubtDecision | None:
        """An operator's decision about attempt ``attempt`` of the in-doubt step at ``p``
        (signal ``sojourn-decide.<p>.<attempt>``: a later attempt in doubt asks again)."""
        name = f"{DECIDE_SIGNAL}.{p}.{attempt}"
        for rec in reversed(self.state.signals):
            if rec.name == name:
                try:
                    return decode_decision(bytes(rec.payload))
                except msgspec.MsgspecError:
                    return None
        return None

    async def suspend(self, reason: str, detail: str) -> None:
        """Park the run visibly for a human (``sojourn resume`` lifts it)."""
        await self.commit([RunSuspended(reason=reason, detail=detail, at=time.time())])
        raise Parked()

    async def start_child_run(self, agent: str, input: Any, child_id: str) -> None:
        names = self.store.names
        body = encode({"input": input, "run_id": child_id, "parent_run_id": self.run_id})
        limit = self.store.settings.max_payload
        if len(body) > limit:
            raise PayloadTooLarge(
                f"child run input is {len(body)} bytes; the limit is {limit}",
                run_id=self.run_id,
            )
        await self._io(
            self.store.broker.publish(
                names.start(agent), body, {"Nats-Msg-Id": f"start:{agent}:{child_id}"}
            )
        )
        self.children.append(child_id)

    # --- the activation -----------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Drive the agent to its next resting point and record it."""
        s = self.state
        if s.terminal:
            await self._after_end()  # redo the end's side jobs: a crash may have cut them off
            return "noop"
        if s.status == "suspended" and s.cancel_requested is not None:
            return await self._end(
                [RunCancelled(reason=s.cancel_requested, at=time.time())], "cancelled"
            )
        if s.status == "new" or s.status == "suspended":
            return "noop"
        try:
            if s.cancel_requested is not None:
                raise RunCancelledInterrupt()
            ctx = Context(self)
            arg = self.agent.decode_input(bytes(s.input or b"null"))
            if self.agent.takes_input:
                output = await self.agent.fn(ctx, arg)
            else:
                output = await self.agent.fn(ctx)  # type: ignore[call-arg]
            if self._nondeterminism is None:
                self.journal.finish()
            else:
                raise self._nondeterminism
            await self.commit([RunCompleted(output=to_raw(output), at=time.time())])
        except Fenced:
            self.fenced = True
            return "fenced"
        except Parked:
            return "waiting"
        except BrokerLost as e:
            # Not the agent's failure: the broker is gone. Nothing more is written; the worker
            # hands the run back and it resumes from its last recorded event later.
            raise BrokerUnavailable(str(e.__cause__ or e), run_id=self.run_id) from e
        except asyncio.CancelledError:
            # The worker is shutting down (a deploy). Record the steps that did finish, so the
            # next worker does not run them again; a step cut off mid-way stays in doubt.
            if self.pending and not self.fenced:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(self._flush_quietly()), 2.0)
            raise
        except RunCancelledInterrupt:
            return await self._end(
                [RunCancelled(reason=self.state.cancel_requested or "", at=time.time())],
                "cancelled",
            )
        except NondeterminismError as e:
            return await self._suspend_nondeterminism(e)
        except Exception as e:
            if self._nondeterminism is not None:
                return await self._suspend_nondeterminism(self._nondeterminism)
            err = ErrorInfo(
                type=type(e).__name__,
                message=str(e),
                traceback="".join(traceback.format_exception(e))[-4000:],
            )
            return await self._end([RunFailed(error=err, at=time.time())], "failed")
        finally:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
        await self._after_end()
        return "completed"

    async def _suspend_nondeterminism(self, e: NondeterminismError) -> Outcome:
        return await self._end(
            [RunSuspended(reason="nondeterminism", detail=e.message, at=time.time())], "suspended"
        )

    async def _end(self, events: list[RunEvent], outcome: Outcome) -> Outcome:
        try:
            await self.commit(events)
        except Fenced:
            return "fenced"
        except RunCancelledInterrupt:  # pragma: no cover - commit never raises it
            return "cancelled"
        await self._after_end()
        return outcome

    async def _after_end(self) -> None:
        """After the terminal event: cancel live children, tell the parent, drop timers.

        Each is idempotent (deterministic Msg-Ids), so an activation that finds the run
        already ended simply does them again; the caller acks its wake only afterwards.
        """
        s = self.state
        broker, names = self.store.broker, self.store.names
        if s.status == "cancelled":
            for child in dict.fromkeys([*s.children, *self.children]):
                if await child_outcome(self.store, child) is None:
                    await broker.publish(
                        names.cancel(child),
                        encode({"reason": f"parent {self.run_id} cancelled", "by": self.run_id}),
                        {"Nats-Msg-Id": f"cascade:{child}"},
                    )
        if not s.terminal:
            return  # a suspension is not an end: the parent keeps waiting, timers stay
        if s.parent_run_id:
            outcome = outcome_of(self.run_id, s)
            await broker.publish(
                names.signal(s.parent_run_id, f"{CHILD_SIGNAL}.{self.run_id}"),
                encode(outcome),
                {"Nats-Msg-Id": f"child-end:{self.run_id}"},
            )
        if self.timers_used or any(
            op.kind == "wait" or (op.kind == "step" and op.attempts > 1) for op in s.ops
        ):
            await cancel_timers(broker, names, self.run_id)


def outcome_of(run_id: str, s: RunState) -> ChildOutcome:
    """How an ended run looks to its parent."""
    if not s.terminal:
        raise ValueError(f"run {run_id} has not ended ({s.status})")
    if s.status == "completed":
        return ChildOutcome(child_run_id=run_id, status="completed", output=s.output or _NULL)
    if s.status == "failed":
        err = s.error
        body = ErrorBody(code=err.type if err else "error", message=err.message if err else "")
        return ChildOutcome(child_run_id=run_id, status="failed", output=_NULL, error=body)
    return ChildOutcome(
        child_run_id=run_id,
        status="cancelled",
        output=_NULL,
        error=ErrorBody(code="cancelled", message=s.cancel_requested or ""),
    )


async def child_outcome(store: EventStore, child_id: str) -> ChildOutcome | None:
    """The outcome of ``child_id`` if its history says it ended, else ``None``."""
    last = await store.broker.direct_get_last(
        store.names.events_stream, store.names.events(child_id)
    )
    if last is None:
        return None
    events = decode_events(last.data)
    for e in events:
        if isinstance(e, RunCompleted):
            return ChildOutcome(child_run_id=child_id, status="completed", output=e.output)
        if isinstance(e, RunFailed):
            return ChildOutcome(
                child_run_id=child_id,
                status="failed",
                output=_NULL,
                error=ErrorBody(code=e.error.type, message=e.error.message),
            )
        if isinstance(e, RunCancelled):
            return ChildOutcome(
                child_run_id=child_id,
                status="cancelled",
                output=_NULL,
                error=ErrorBody(code="cancelled", message=e.reason),
            )
    return None
