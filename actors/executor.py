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
- A failed append is never swallowed. A broker outage keeps the events buffered (``BrokerLost``
  unwinds the code if it happened in the foreground); any other failure (a JetStream error, a
  decision the server would refuse) is kept, and the next journaled call or the end of the
  activation raises it (``AppendRefused``): nothing more is written, and the worker retries
  the run later from its last recorded event.
- A stored value (a step's result, a journaled value, the run's output) is at most
  ``max_value`` bytes, checked before it is appended: a larger step result fails the step with
  ``PayloadTooLarge``, a larger output fails the run. A decision larger than the server takes
  is split into several messages, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.leases import Progress
from sojourn.broker.timers import cancel_timers, schedule_timer
from sojourn.schemas.codec import decode_decision, decode_events, encode, encode_events, to_raw
from sojourn.schemas.config import VALUE_ENVELOPE
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
from sojourn.schemas.wire import DECIDE_SIGNAL, ChildOutcome, ErrorBody, InDoubtDecision

from .agent import Agent
from .context import Context, Parked, clip_text, error_info
from .journal import Journal, RecordedWait
from .metrics import APPENDS, EVENTS_APPENDED, agent_label
from .state import RunState, SignalRecord, fold

__all__ = ["Activation", "AppendRefused", "Outcome", "RunCancelledInterrupt", "fit_prefix"]

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


class BrokerLost(BaseException):
    """Unwinds agent code when an append could not reach the broker in time.

    A ``BaseException`` so that an agent's ``except Exception`` cannot turn a broker outage
    into a recorded failure of the run.
    """


class AppendRefused(BaseException):
    """Unwinds agent code when a decision could not be stored for a reason other than a broker
    outage (a JetStream error, a decision the server would refuse).

    The activation keeps the original error (``Activation.refused``): every later journaled
    call and the end of the activation raise this again, and ``Activation.run`` ends with the
    original error, so the worker retries the run later from its last recorded event (and
    gives up after ``max_activation_failures``). A ``BaseException`` so that agent code cannot
    go on to record an outcome the history does not support.
    """


def is_outage(e: BaseException) -> bool:
    """Whether an append failed because the broker is away (keep the events, try later)."""
    if isinstance(e, BrokerUnavailable):
        return True
    return isinstance(e, JetStreamError) and e.code == 503


def fit_prefix(sizes: list[int], limit: int) -> int:
    """How many of the leading events fit in one message of at most ``limit`` bytes, given each
    event's encoded size (a decision is the JSON array ``[e1,e2,...]``); 0 if not even one."""
    used = 1  # "["
    for n, size in enumerate(sizes):
        used += size + 1  # the event, then "," or "]"
        if used > limit:
            return n
    return len(sizes)


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
        self.refused: Exception | None = None
        """Why an append failed for good, once one did (see ``AppendRefused``)."""
        self._unacked: list[RunEvent] = []
        """A decision whose append may have landed (its ack was lost in an outage): the next
        decision sends it first, unchanged, so the store can tell whether it landed."""
        self._fatal: PayloadTooLarge | None = None
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
        if not self.pending or self.fenced or self.refused is not None:
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
        """The flush timer's append. Nothing it meets is dropped: an outage keeps the events
        buffered for the next decision, and any other failure is kept in ``refused`` for the
        agent's next journaled call (or the end of the activation) to raise."""
        try:
            await self.commit([])
        except (Fenced, RunCancelledInterrupt, BrokerLost, AppendRefused):
            pass
        except Exception as e:  # pragma: no cover - commit turns failures into AppendRefused
            if self.refused is None:
                self.refused = e

    @property
    def max_value(self) -> int:
        """The largest value (in bytes of JSON) this run may store: ``Settings.max_value``,
        and at most what one message can carry with ``VALUE_ENVELOPE`` to spare."""
        return min(self.store.settings.max_value, self.store.max_decision - VALUE_ENVELOPE)

    def oversized(self, raw: bytes, what: str) -> PayloadTooLarge | None:
        """The error to record if ``raw`` is too large to store, else ``None``."""
        limit = self.max_value
        if len(raw) <= limit:
            return None
        if limit < self.store.settings.max_value:
            why = f"the server's max_payload less {VALUE_ENVELOPE} bytes"
        else:
            why = "Settings.max_value"
        return PayloadTooLarge(
            f"{what} is {len(raw)} bytes; the limit for one stored value is {limit} bytes "
            f"({why}): store large data elsewhere and pass a reference",
            run_id=self.run_id,
        )

    def note_fatal(self, e: PayloadTooLarge) -> None:
        """A journaled value could not be stored: the run fails with ``e``, even if the agent's
        code catches it (its position is taken but nothing was recorded there)."""
        if self._fatal is None:
            self._fatal = e

    def note_nondeterminism(self, e: NondeterminismError) -> None:
        """Remember a divergence even if the agent's code catches the exception."""
        if self._nondeterminism is None:
            self._nondeterminism = e

    def check_cancelled(self) -> None:
        """Called before every journaled operation: stop if the run cannot go on."""
        if self.fenced:
            raise Fenced(self.run_id)
        if self.refused is not None:
            raise AppendRefused()
        if self._fatal is not None:
            raise self._fatal
        if self.state.cancel_requested is not None:
            raise RunCancelledInterrupt()

    async def commit(self, events: list[RunEvent]) -> None:
        """Append the buffered events plus ``events`` as one decision, fenced.

        Buffered events are taken when the append starts; events buffered while it is in flight
        wait for the next decision (or the flush timer). A decision larger than the server
        accepts is appended as several messages, in order; a single event that does not fit is
        refused (it cannot happen with values within ``max_value``).

        Raises:
            Fenced: another worker owns the run.
            RunCancelledInterrupt: a cancel came in while this decision was starting a step.
            BrokerLost: the broker stayed away; the events not stored stay buffered.
            AppendRefused: this or an earlier append failed for another reason.
        """
        async with self._lock:
            if self.refused is not None:
                raise AppendRefused()
            if self.fenced:
                raise Fenced(self.run_id)
            taken, self.pending = self.pending, []
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            unacked, self._unacked = self._unacked, []
            batch = [*unacked, *taken, *events]
            if not batch:
                return
            ours = len(batch) - len(events)  # batch[ours:] are ``events``
            starts = any(isinstance(e, StepStarted) for e in events)
            fixed = len(unacked)  # the first message must be exactly ``unacked``
            done = 0  # batch[:done] is stored
            stop = 0  # batch[done:stop] is the message being appended
            cap: int | None = None  # at most this many events in the next message
            interrupted = False
            try:
                while done < len(batch):
                    if fixed:
                        stop = done + fixed
                    else:
                        stop = len(batch) if cap is None else done + cap
                    chunk = batch[done:stop]
                    try:
                        seq = await self._append(chunk)
                    except PayloadTooLarge:
                        if fixed or len(chunk) == 1:
                            raise
                        sizes = [len(encode_events([e])) - 2 for e in batch[done:]]
                        cap = fit_prefix(sizes, self.store.max_decision)
                        if cap == 0:
                            raise
                        continue
                    except ConcurrencyConflict:
                        await self._rebase()
                        if (
                            starts
                            and done <= ours < len(batch)
                            and self.state.cancel_requested is not None
                        ):
                            # Cancelled while we were about to start a step: record what
                            # already happened, but start nothing new.
                            batch, interrupted = batch[:ours], True
                        continue
                    self._stored(chunk, seq)
                    done, fixed, cap = stop, 0, None
            except BrokerLost:
                # Keep what was not stored for the next decision. The message in flight may
                # have landed: it is sent first next time, unchanged (same fence, same
                # Msg-Id), so the store's landed check can tell.
                self._unacked = batch[done:stop]
                self.pending[:0] = batch[max(stop, done) : max(ours, stop, done)]
                raise
            except (Fenced, RunCancelledInterrupt):
                raise
            except Exception as e:
                self.refused = e
                raise AppendRefused() from e
            if interrupted:
                raise RunCancelledInterrupt()

    def _stored(self, batch: list[RunEvent], seq: int) -> None:
        self.appends += 1
        self.last_seq = seq
        self._appends_metric.inc()
        self._events_metric.inc(len(batch))
        # Live operations need no folding (the journal only consults what was recorded
        # before this activation); folding them would copy the op index on every step.
        others = [e for e in batch if not isinstance(e, _OP_EVENTS)]
        if others:
            self.state = fold(others, self.state)

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
            if is_outage(e):
                raise BrokerLost() from e
            raise

    async def _rebase(self) -> None:
        newer = await self._io(self.store.load(self.run_id, after_seq=self.last_seq))
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
                names.spawn(agent, self.sender),
                body,
                {"Nats-Msg-Id": f"start:{agent}:{child_id}"},
            )
        )
        self.children.append(child_id)

    @property
    def sender(self) -> str:
        """The sender token of what this activation publishes on the inbox (child starts and
        notices, cancel cascades): the worker's authenticated NATS user, if any."""
        return self.store.broker.sender("worker")

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
            if self._fatal is not None:
                raise self._fatal
            raw = to_raw(output)
            too_big = self.oversized(raw, "the run's output")
            if too_big is not None:
                raise too_big
            await self.commit([RunCompleted(output=raw, at=time.time())])
        except Fenced:
            self.fenced = True
            return "fenced"
        except Parked:
            return "waiting"
        except BrokerLost as e:
            # Not the agent's failure: the broker is gone. Nothing more is written; the worker
            # hands the run back and it resumes from its last recorded event later.
            raise BrokerUnavailable(str(e.__cause__ or e), run_id=self.run_id) from e
        except AppendRefused:
            # Not the agent's failure either, and not one to record: the history could not
            # take what happened. The worker retries the run from its last recorded event.
            raise self._refusal() from None
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
            err = error_info(self._fatal if self._fatal is not None else e)
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
        except BrokerLost as e:
            raise BrokerUnavailable(str(e.__cause__ or e), run_id=self.run_id) from e
        except AppendRefused:
            raise self._refusal() from None
        await self._after_end()
        return outcome

    def _refusal(self) -> Exception:
        """The error an activation ends with when an append was refused."""
        e = self.refused
        assert e is not None
        return e

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
                        names.cancel(child, self.sender),
                        encode({"reason": f"parent {self.run_id} cancelled"}),
                        {"Nats-Msg-Id": f"cascade:{child}"},
                    )
        if not s.terminal:
            return  # a suspension is not an end: the parent keeps waiting, timers stay
        if s.parent_run_id:
            outcome = outcome_of(self.run_id, s)
            await broker.publish(
                names.child_end(s.parent_run_id, self.run_id, self.sender),
                encode(outcome),
                {"Nats-Msg-Id": f"child-end:{self.run_id}"},
            )
        if self.timers_used or any(
            op.kind == "wait" or (op.kind == "step" and op.attempts > 1) for op in s.ops
        ):
            await cancel_timers(broker, names, self.run_id)


def _error_body(code: str, message: str) -> ErrorBody:
    """An error as a parent sees it, clipped: a child's end notice stays bounded."""
    return ErrorBody(code=clip_text(code, 200), message=clip_text(message))


def outcome_of(run_id: str, s: RunState) -> ChildOutcome:
    """How an ended run looks to its parent. Its size is at most ``Settings.max_child_notice``
    for a run whose output was checked against ``max_value``."""
    if not s.terminal:
        raise ValueError(f"run {run_id} has not ended ({s.status})")
    if s.status == "completed":
        return ChildOutcome(child_run_id=run_id, status="completed", output=s.output or _NULL)
    if s.status == "failed":
        err = s.error
        body = _error_body(err.type if err else "error", err.message if err else "")
        return ChildOutcome(child_run_id=run_id, status="failed", output=_NULL, error=body)
    return ChildOutcome(
        child_run_id=run_id,
        status="cancelled",
        output=_NULL,
        error=_error_body("cancelled", s.cancel_requested or ""),
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
                error=_error_body(e.error.type, e.error.message),
            )
        if isinstance(e, RunCancelled):
            return ChildOutcome(
                child_run_id=child_id,
                status="cancelled",
                output=_NULL,
                error=_error_body("cancelled", e.reason),
            )
    return None
