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
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.headers import MSG_ID
from sojourn.broker.progress import Progress
from sojourn.broker.timers import cancel_timers, schedule_timer
from sojourn.schemas.codec import decode_events, encode, encode_events, to_raw
from sojourn.schemas.config import VALUE_ENVELOPE
from sojourn.schemas.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    Fenced,
    NondeterminismError,
    PayloadTooLarge,
)
from sojourn.schemas.events import (
    BudgetChanged,
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
from sojourn.schemas.vocabulary import TerminalStatus
from sojourn.schemas.wire import CancelBody, ChildOutcome, ErrorBody

from ..agents.agent import Agent
from ..agents.callbacks import CallbackKeys
from ..agents.context import Context
from ..client.output import StepOutput, chunk_limit
from ..core.machine import (
    Limits,
    Machine,
    Park,
    Parked,
    RunCancelledInterrupt,
    clip_text,
    error_info,
)
from ..core.state import OpRecord, RunState, fold
from ..history.chain import ChainTaken, ContinueAsNew, current_run, pass_on, start_next
from ..history.snapshots import Snapshot, fold_history
from ..history.values import Values, values_for
from ..ops.metrics import APPENDS, EVENTS_APPENDED, TOOL_CALLS, agent_label
from .faults import fault
from .interrupt import StepGuard
from .sticky import Body

__all__ = ["Activation", "AppendRefused", "Outcome", "RunCancelledInterrupt", "fit_prefix"]

Outcome = TerminalStatus | Literal["suspended", "waiting", "fenced", "noop"]

EXTERNAL_EVENTS = (CancelRequested, SignalReceived, BudgetChanged)
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
KeepTimer = Callable[[int, float, "list[Decision] | None"], bool]
"""Keep a wait's timer in process (its position, its deadline, the run's history if short:
the activation the timer starts need not read it); ``False``: not kept."""

KEPT_HISTORY_MAX = 16
"""Decisions of a run's history kept with its in-process timer, at most (longer ones are in
the worker's history cache, which reads only what came after)."""

LIFETIME_TIMER = "lifetime"
"""The timer id of the broker timer that wakes a parked run at the end of its lifetime."""

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


class Activation:
    """Executes one run from its history until it completes, fails, parks or is fenced."""

    def __init__(
        self,
        *,
        agent: Agent[Any, Any],
        run_id: str,
        store: EventStore,
        history: list[Decision],
        writer: str,
        flush_delay: float = 0.02,
        progress: Progress | None = None,
        heartbeat: Callable[[], None] | None = None,
        keep_timer: KeepTimer | None = None,
        backstops: frozenset[int] = frozenset(),
        keep_run: Callable[[], bool] | None = None,
        snapshot: Snapshot | None = None,
        callback_keys: CallbackKeys | None = None,
    ) -> None:
        """``keep_timer``: the worker's in-process timers (``InProcessTimers.keep`` for this
        run), which take the timers of the waits this activation parks on; the broker's copy
        is then written ``timer_backstop`` later. ``backstops``: waits whose broker timer is
        such a later copy (this activation was woken by the in-process one): removed once
        those waits have ended. ``keep_run``: whether the worker may keep this activation
        when it parks on a wait (its code then rests there instead of unwinding: ``rest``,
        ``worker/sticky.py``). ``snapshot``: a fold of a prefix of ``history``
        (``history/snapshots.py``), so that only what came after it is folded.
        ``callback_keys``: the worker's keyring, which signs the run's ``ctx.callback`` tokens."""
        self.agent = agent
        self.callback_keys = callback_keys
        self.keep_timer = keep_timer
        self.backstops = backstops
        self.progress = progress if progress is not None else Progress()
        self.poke_heartbeat = heartbeat or (lambda: None)
        self.metric_agent = agent_label(agent.name)
        self._appends_metric = APPENDS.labels(self.metric_agent)
        self._events_metric = EVENTS_APPENDED.labels(self.metric_agent)
        self.tool_calls = TOOL_CALLS.labels(self.metric_agent)
        self.run_id = run_id
        self.store = store
        self.writer = writer
        self.flush_delay = flush_delay
        self.last_seq = history[-1].seq if history else 0
        self.decisions: list[Decision] | None = (
            list(history) if keep_timer is not None and len(history) <= KEPT_HISTORY_MAX else None
        )
        """The run's history as this activation knows it (what it loaded, what it and others
        appended since), while short: handed to the in-process timer of a wait it parks on."""
        settings = store.settings
        limit = min(settings.max_value, store.max_decision - VALUE_ENVELOPE)
        self.snapshot = fold_history(history, snapshot)
        """The history as loaded, folded: what the worker's history cache may keep."""
        self.keep_run = keep_run
        self.body: Body[Outcome] | None = None if keep_run is None else Body()
        """The agent's code in a task of its own, when the worker may keep it resting."""
        self.machine = Machine(
            self.snapshot.state,
            run_id=run_id,
            limits=Limits(
                max_value=limit,
                max_value_why=(
                    f"the server's max_payload less {VALUE_ENVELOPE} bytes"
                    if limit < settings.max_value
                    else "Settings.max_value"
                ),
                crash_loop_limit=settings.crash_loop_limit,
                poll_cap=agent.poll_cap,
                budget=agent.budget,
                retry=agent.retry,
                compensates=agent.on_cancel is not None,
                lifetime=agent.lifetime,
            ),
            on_record=self._arm_flush,
        )
        self.guard = StepGuard(self._look_for_cancel)
        """Interrupts this activation's running steps for a cancel (``worker/interrupt.py``)."""
        self._expiry: asyncio.TimerHandle | None = None
        self._lifetime_timer_set = False
        self.compensation_error: ErrorInfo | None = None
        self.fenced = False
        self.appends = 0
        self.timers_used = bool(backstops)
        self._lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.refused: Exception | None = None
        """Why an append failed for good, once one did (see ``AppendRefused``)."""
        self._unacked: list[RunEvent] = []
        """A decision whose append may have landed (its ack was lost in an outage): the next
        decision sends it first, unchanged, so the store can tell whether it landed."""
        self._background: set[asyncio.Task[None]] = set()
        self._with_refs: list[Decision] | None = history if self.snapshot.refs else None
        """The history as loaded when it holds values by reference: read back before the
        code runs (``_load_values``)."""

    @property
    def state(self) -> RunState:
        """The run as folded: its history when loaded, plus what others appended since."""
        return self.machine.state

    @state.setter
    def state(self, value: RunState) -> None:
        self.machine.state = value

    @property
    def pending(self) -> list[RunEvent]:
        """Events the machine recorded that are not stored yet."""
        return self.machine.pending

    @pending.setter
    def pending(self, value: list[RunEvent]) -> None:
        self.machine.pending = value

    # --- the Driver of Context ----------------------------------------------------------------

    @property
    def agent_name(self) -> str:
        return self.agent.name

    def report(self, details: msgspec.Raw) -> None:
        """A step's progress details, from the loop or from a step's thread."""
        progress = self.progress
        progress.details = details
        progress.changed = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop or self._loop is None:
            self.poke_heartbeat()
        else:
            self._loop.call_soon_threadsafe(self.poke_heartbeat)

    def running(self, step: str | None) -> None:
        progress = self.progress
        progress.step, progress.details = step, None
        progress.step_started_at = None if step is None else time.time()

    def _arm_flush(self) -> None:
        """Events were queued: make sure they are flushed soon if no decision follows."""
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

    def check_live(self) -> None:
        """Called before every journaled operation: stop if nothing more may be written."""
        if self.fenced:
            raise Fenced(self.run_id)
        if self.refused is not None:
            raise AppendRefused()

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
            if starts and self.machine.cancel_due():
                # A cancel is known already (a notice, a look): start nothing new.
                batch, interrupted = batch[:ours], True
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
                        if starts and done <= ours < len(batch) and self.machine.cancel_due():
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
                for dropped in events:
                    if isinstance(dropped, StepStarted):
                        self.machine.start_dropped(dropped)
                raise RunCancelledInterrupt()

    def _stored(self, batch: list[RunEvent], seq: int) -> None:
        self.appends += 1
        if self.decisions is not None:
            mid = f"{self.run_id}:{self.last_seq}:{self.writer}"
            self.decisions.append(Decision(seq, tuple(batch), self.writer, mid))
            if len(self.decisions) > KEPT_HISTORY_MAX:
                self.decisions = None
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

    @property
    def values(self) -> Values:
        """Large values by reference (the worker's piece store and cache)."""
        store = self.store
        return values_for(store.broker, store.names, store.settings)

    async def _load_values(self) -> None:
        """Read back the values the history holds by reference and fold it again with them,
        so the code replays on the values it recorded.

        Raises:
            ValueUnreadable: a reference or a piece cannot be trusted (the worker wedges the
                run with the reason).
        """
        history, self._with_refs = self._with_refs, None
        assert history is not None
        events = await self.values.resolve(e for d in history for e in d.events)
        self.machine = dataclasses.replace(self.machine, state=fold(events))

    async def _append(self, batch: list[RunEvent]) -> int:
        try:
            batch = await self.values.externalize(batch)  # large values by reference
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
        if self.decisions is not None:
            self.decisions.extend(newer)

    # --- waits, backoffs, suspensions and children (the Driver of Context) ---------------------

    async def park(self, action: Park) -> None:
        """Record the wait (timer first, then the event: a recorded wait never lacks its timer)
        and flush what is pending with it."""
        if action.deadline is not None:
            fires_at = action.deadline
            keep = self.keep_timer
            if keep is not None and keep(action.position, action.deadline, self.decisions):
                fires_at += self.store.settings.timer_backstop  # woken in process, in time
            await self._io(
                schedule_timer(
                    self.store.broker,
                    self.store.names,
                    self.run_id,
                    str(action.position),
                    fires_at,
                    agent=self.agent.name,
                )
            )
            self.timers_used = True
        await self._set_lifetime_timer(action.deadline)
        await self.commit([action.event] if action.event is not None else [])

    def cancel_timer(self, position: int) -> None:
        """Drop a wait's timer in the background: a timer left behind only wakes the run for
        nothing (its wake finds the wait ended)."""
        self._later(self._cancel_timer(position))

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

    async def backoff(self, position: int, retry_at: float) -> None:
        """Wait until a retry is due: on a broker timer (a crash or deploy meanwhile loses
        nothing), in this process too when it is short."""
        left = retry_at - time.time()
        if left <= 0:
            return
        await self._io(
            schedule_timer(
                self.store.broker,
                self.store.names,
                self.run_id,
                str(position),
                retry_at,
                agent=self.agent.name,
            )
        )
        self.timers_used = True
        if left > IN_PROCESS_BACKOFF:
            await self._set_lifetime_timer(retry_at)
        await self.commit([])  # the failed attempt, with its retry_at
        if left > IN_PROCESS_BACKOFF:
            raise Parked()
        await asyncio.sleep(left)

    async def rest(self) -> None:
        """The code parked on a wait: unwind it (``Parked``), or, when the worker may keep
        this activation, let the code rest here until the worker resumes it with what others
        appended meanwhile (returns: the wait looks again) or discards it (``Parked``)."""
        body = self.body
        if (
            body is None
            or not body.can_rest
            or self.keep_run is None
            or not self.keep_run()
            or self.fenced
            or self.refused is not None
            or self.pending
            or self._unacked
            or self._lock.locked()
        ):
            raise Parked()
        await body.rest()

    async def suspend(self, event: RunSuspended) -> None:
        """Park the run visibly for a human (``sojourn resume`` lifts it)."""
        await self._set_lifetime_timer(None)
        await self.commit([event])
        raise Parked()

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        """Publish a child's start on the spawn subject, idempotent by the child's run id."""
        await self._io(
            self.store.broker.publish(
                self.store.names.spawn(agent, self.sender),
                body,
                {MSG_ID: f"start:{agent}:{child_id}"},
            )
        )

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        return await self._io(child_outcome(self.store, child_id))

    def step_output(self, position: int, attempt: int) -> StepOutput:
        """The output writer of the step execution whose ``StepStarted`` was just stored: the
        decision holding it is ``last_seq``, which names the execution (an in-doubt step run
        again may keep its attempt number, never its start's sequence)."""
        store = self.store
        settings = store.settings
        return StepOutput(
            lambda: store.broker,
            store.names,
            self.run_id,
            position=position,
            attempt=attempt,
            execution=self.last_seq,
            limit=lambda broker: chunk_limit(settings.max_payload, broker.max_payload),
            retry_for=settings.append_timeout,
        )

    @property
    def sender(self) -> str:
        """The sender token of what this activation publishes on the inbox (child starts and
        notices, cancel cascades): the worker's authenticated NATS user, if any."""
        return self.store.broker.sender("worker")

    # --- the activation -----------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Drive the agent to its next resting point and record it."""
        if self._with_refs is not None:
            await self._load_values()
        outcome = await self._drive()
        if self.backstops and outcome != "fenced" and not self.state.terminal:
            # (An ended run's timers were all removed with its end.)
            ops = self.state.ops
            for p in self.backstops:
                if p < len(ops) and ops[p].kind == "wait" and ops[p].status == "completed":
                    self.cancel_timer(p)
        return outcome

    async def _drive(self) -> Outcome:
        """Run the code to its next resting point: in a ``Body`` when it may rest in a wait
        (``waiting``, the code kept suspended), else right here."""
        body = self.body
        if body is None:
            return await self._run()
        outcome = await body.drive(self._run)
        return "waiting" if outcome is None else outcome

    # --- a kept activation (``worker/sticky.py``) -------------------------------------------------

    @property
    def resting(self) -> bool:
        """Whether the code rests in a wait, to be resumed (``resume_with``) or discarded."""
        return self.body is not None and self.body.resting

    def resume_with(self, newer: list[Decision]) -> bool:
        """Take what was appended after ``last_seq`` while the code rested, if it allows
        going on from the kept code: only signals, and a lifetime not passed. ``False``: it
        does not (another writer's decision, a cancel...), and nothing was changed; the
        caller discards this activation and activates the run from its history.

        Going on equals replaying: the kept code is where a replay of the same history would
        bring it, and signals only add to what the wait looks at (as in ``_rebase``)."""
        if not self.resting or self.fenced or self.refused is not None:
            return False
        if any(not isinstance(e, SignalReceived) for d in newer for e in d.events):
            return False
        ends = self.machine.lifetime_ends()
        if ends is not None and ends <= time.time():
            return False  # the cancel of an expired run is the cold path's to take
        if newer:
            self.state = fold((e for d in newer for e in d.events), self.state)
            self.last_seq = newer[-1].seq
            if self.decisions is not None:
                self.decisions.extend(newer)
                if len(self.decisions) > KEPT_HISTORY_MAX:
                    self.decisions = None
        return True

    def rebind(
        self,
        *,
        writer: str,
        progress: Progress,
        heartbeat: Callable[[], None],
        backstops: frozenset[int] = frozenset(),
    ) -> None:
        """A kept activation resumed for a new wake: it writes and reports as that wake's
        activation (its writer names the activation a heartbeat lists)."""
        self.writer = writer
        self.progress = progress
        self.poke_heartbeat = heartbeat
        self.backstops = backstops
        self.timers_used = self.timers_used or bool(backstops)

    def discard(self) -> None:
        """Never write anything again, and unwind resting code (with ``Parked``: nothing is
        written on the way out)."""
        self.fenced = True
        if self.body is not None:
            self.body.discard()

    async def _run(self) -> Outcome:
        self._loop = asyncio.get_running_loop()
        s = self.state
        if s.terminal:
            await self._after_end()  # redo the end's side jobs: a crash may have cut them off
            return "noop"
        self._watch_lifetime()
        if s.status == "suspended" and self.machine.cancel_reason() is not None:
            # (No compensation: a suspended run's code may not even replay.)
            return await self._end([self.machine.cancelled(time.time())], "cancelled")
        if s.status == "new" or s.status == "suspended":
            return "noop"
        try:
            if self.machine.cancel_due() and self.agent.on_cancel is None:
                raise RunCancelledInterrupt()
            ctx = Context(
                self.machine,
                self,
                self.store.settings.max_payload,
                output=self.step_output,
                guard=self.guard,
                callback_keys=self.callback_keys,
            )
            arg = self.agent.decode_input(bytes(s.input or b"null"))
            output = await self._main(ctx, arg)
            m = self.machine
            if m.nondeterminism is None:
                m.journal.finish()
            else:
                raise m.nondeterminism
            if m.fatal is not None:
                raise m.fatal
            raw = to_raw(output)
            too_big = m.oversized(raw, "the run's output")
            if too_big is not None:
                raise too_big
            await self.commit([RunCompleted(output=raw, at=time.time())])
        except Fenced:
            self.fenced = True
            return "fenced"
        except Parked:
            return "waiting"
        except ContinueAsNew as c:
            return await self._continue(c.input)
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
            ended = self.machine.cancelled(time.time(), self.compensation_error)
            return await self._end([ended], "cancelled")
        except NondeterminismError as e:
            return await self._suspend_nondeterminism(e)
        except Exception as e:
            m = self.machine
            if m.nondeterminism is not None:
                return await self._suspend_nondeterminism(m.nondeterminism)
            err = error_info(m.fatal if m.fatal is not None else e)
            return await self._end([RunFailed(error=err, at=time.time())], "failed")
        finally:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            self._unwatch()
        await self._after_end()
        return "completed"

    # --- cancel: interrupts, compensation, lifetime (``worker/interrupt.py``) ---------------------

    async def _main(self, ctx: Context, arg: Any) -> Any:
        """The agent's code; when a cancel stops it, its compensation (``on_cancel``) runs
        before the cancel goes on to end the run."""
        try:
            return await self.agent.call(ctx, arg)
        except RunCancelledInterrupt:
            if self.machine.take_cancel(time.time()):
                await self._compensate(ctx, arg)
            raise

    async def _compensate(self, ctx: Context, arg: Any) -> None:
        """Run the compensation; what it raises (a failed step, any error) is kept for
        ``RunCancelled.compensation_error``: the run ends cancelled all the same. Parking,
        fencing, a broker outage, a terminate and the like unwind as they would the code."""
        m = self.machine
        try:
            await self.agent.compensate(ctx, arg)
            if m.nondeterminism is None:
                m.journal.finish()
        except NondeterminismError:
            raise
        except Exception as e:
            if m.nondeterminism is not None:
                raise m.nondeterminism from None
            self.compensation_error = error_info(m.fatal if m.fatal is not None else e)
            return
        if m.nondeterminism is not None:
            raise m.nondeterminism

    def noticed(self) -> None:
        """The intake's notice: a cancel of this run may be recorded. Read what was appended
        and, if a cancel is due, interrupt the steps in flight (``Interrupts``)."""
        if self._loop is not None and not self.fenced:
            self._later(self._on_notice())

    async def _on_notice(self) -> None:
        with contextlib.suppress(Exception):
            why = await self._look_for_cancel(fresh=True)
            if why is not None:
                self.guard.interrupt(why)

    async def _look_for_cancel(self, fresh: bool = False) -> str | None:
        """Why the running steps must stop (``None``: they go on): a cancel appended since
        this activation's last decision (one direct get tells whether anything was; read
        when ``fresh`` or when it was), or the run's lifetime."""
        m = self.machine
        if not fresh and not m.cancel_due():
            last = await self.store.broker.direct_get_last(
                self.store.names.events_stream, self.store.names.events(self.run_id)
            )
            fresh = last is not None and last.seq > self.last_seq
        if fresh and not m.cancel_due():
            await self._catch_up()
        if not m.cancel_due():
            return None
        if m.compensating:
            return "the run was terminated"
        why = m.cancel_reason() or "cancelled"
        return f"the run was {'terminated' if m.state.terminate_requested else 'cancelled'}" + (
            "" if why == "cancelled" else f" ({why})"
        )

    async def _catch_up(self) -> None:
        """Fold in what others appended since this activation's last decision (a cancel, a
        signal). A decision of another writer is left to the fence: this activation's next
        append is refused, as it would have been without the look."""
        async with self._lock:
            if self.fenced:
                return
            newer = await self.store.load(self.run_id, after_seq=self.last_seq)
            if not newer:
                return
            if any(not isinstance(e, EXTERNAL_EVENTS) for d in newer for e in d.events):
                return
            self.state = fold((e for d in newer for e in d.events), self.state)
            self.last_seq = newer[-1].seq
            if self.decisions is not None:
                self.decisions.extend(newer)

    def _watch_lifetime(self) -> None:
        """Past the run's lifetime, it is cancelled: now, or when it passes while this
        activation runs (interrupting the steps in flight)."""
        m = self.machine
        ends = m.lifetime_ends()
        if ends is None or m.expire(time.time()):
            return
        assert self._loop is not None
        self._expiry = self._loop.call_later(ends - time.time(), self._expire)

    def _expire(self) -> None:
        self._expiry = None
        m = self.machine
        if m.expire(time.time()) and not m.compensating:
            self.guard.interrupt(f"the run was cancelled ({m.expired})")

    def _unwatch(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.guard.close()

    async def _set_lifetime_timer(self, wakes_at: float | None) -> None:
        """Before the run parks (``wakes_at``: when its own timer wakes it, if it has one):
        a broker timer at the end of its lifetime, so that a run parked past it is woken, with
        no process alive, and ended. Not needed when the run wakes before that anyway."""
        ends = self.machine.lifetime_ends()
        if ends is None or self._lifetime_timer_set or (wakes_at is not None and wakes_at < ends):
            return
        await self._io(
            schedule_timer(
                self.store.broker,
                self.store.names,
                self.run_id,
                LIFETIME_TIMER,
                ends,
                agent=self.agent.name,
            )
        )
        self._lifetime_timer_set = self.timers_used = True

    async def _continue(self, raw: msgspec.Raw) -> Outcome:
        """``ctx.continue_as_new``: store what is pending, create and wake the chain's next run
        (once, ``start_next``), then record this run's end naming it."""
        m = self.machine
        try:
            if m.nondeterminism is not None:
                raise m.nondeterminism
            m.journal.finish()
        except NondeterminismError as e:
            return await self._suspend_nondeterminism(e)
        problem: Exception | None = m.fatal or m.oversized(raw, "the input of continue_as_new")
        if problem is None:
            try:
                self.agent.decode_input(bytes(raw))
            except msgspec.ValidationError as e:
                problem = TypeError(
                    f"ctx.continue_as_new input does not match agent '{self.agent.name}': {e}"
                )
        if problem is not None:
            return await self._end([RunFailed(error=error_info(problem), at=time.time())], "failed")
        try:
            await self.commit([])  # the last step's result is stored before the next run exists
        except Fenced:
            return "fenced"
        except BrokerLost as e:
            raise BrokerUnavailable(str(e.__cause__ or e), run_id=self.run_id) from e
        except AppendRefused:
            raise self._refusal() from None
        if self.state.cancel_requested is not None:
            return await self._end(
                [RunCancelled(reason=self.state.cancel_requested, at=time.time())], "cancelled"
            )
        try:
            nxt = await start_next(
                store=self.store,
                values=self.values,
                run_id=self.run_id,
                agent=self.agent.name,
                code_version=self.agent.version,
                state=self.state,
                consumed=m.consumed,
                input=raw,
                writer=self.writer,
                carried=m.chain_spending(),
            )
        except ChainTaken as e:
            return await self._end([RunFailed(error=error_info(e), at=time.time())], "failed")
        fault("continued")
        return await self._end(
            [RunCompleted(output=_NULL, continued_as=nxt, at=time.time())], "completed"
        )

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
            for child in dict.fromkeys([*s.children, *self.machine.children]):
                if await child_outcome(self.store, child) is None:
                    await broker.publish(
                        names.cancel(child, self.sender),
                        encode(
                            CancelBody(
                                reason=f"parent {self.run_id} cancelled",
                                terminate=s.terminate_requested,  # a terminate cascades as one
                            )
                        ),
                        {MSG_ID: f"cascade:{child}"},
                    )
        if not s.terminal:
            return  # a suspension is not an end: the parent keeps waiting, timers stay
        if s.continued_as is not None:
            # Not the chain's end: its last run tells the parent. Pass on what came too late.
            await pass_on(self.store, s, self.machine.consumed, s.continued_as, self.sender)
        elif s.parent_run_id:
            child = s.chain_root or self.run_id  # the id the parent knows the chain by
            outcome = outcome_of(child, s)
            await broker.publish(
                names.child_end(s.parent_run_id, child, self.sender),
                encode(outcome),
                {MSG_ID: f"child-end:{child}"},
            )
        may_have_lifetime_timer = self.agent.lifetime is not None
        if (
            self.timers_used
            or may_have_lifetime_timer
            or any(_timer_may_be_stored(op) for op in s.ops)
        ):
            await cancel_timers(broker, names, self.run_id)


def _timer_may_be_stored(op: OpRecord) -> bool:
    """Whether a timer of ``op`` may still be in the wake stream when its run ends: a wait with
    a deadline that ended otherwise than by it (cancelled, or by a signal whose own purge may
    have failed), or a step that was retried (a short backoff is waited out in the process,
    its timer left to fire). A wait that timed out was woken by its timer, which the broker
    removed when it fired; should it fire later after all, it wakes an ended run: nothing.
    (A run woken by its worker's in-process timer has ``backstops``: its activation removes
    the broker's later copy itself.)"""
    if op.kind == "wait":
        return op.deadline is not None and op.outcome != "timeout"
    return op.kind == "step" and op.attempts > 1


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
    """The outcome of ``child_id`` if its history says it ended, else ``None``: of its
    chain's last run, if it continued as new (with its output read back if it is stored by
    reference)."""
    _, last = await current_run(store.broker, store.names, child_id)
    if last is None:
        return None
    events = decode_events(last.data)
    for e in events:
        if isinstance(e, RunCompleted):
            if e.output_ref is not None:
                values = values_for(store.broker, store.names, store.settings)
                e = await values.resolve_one(e)
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
