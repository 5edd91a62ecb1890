"""One *activation* of a run: load → fold → replay the agent's code → run live until it ends.

``Activation`` drives the agent's code to its next resting point (the run ends, parks on a
wait, suspends, or is fenced) and is the ``Driver`` its ``Context`` calls. Its parts, each in a
module of its own:

- what it appends to the run's history, serialized, fenced, batched and never lost
  (``worker/appends.py``: the rules are written there);
- the broker timers that wake a parked run (``worker/run_timers.py``);
- what it tells the run's children and parent (``worker/children.py``);
- the cancel it watches for while steps run (``StepGuard``, ``worker/interrupt.py``) and the
  code kept resting in a wait (``Body``, ``worker/sticky.py``).

A stored value (a step's result, a journaled value, the run's output) is at most
``max_value`` bytes, checked before it is appended: a larger step result fails the step with
``PayloadTooLarge``, a larger output fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable
from time import time as _real_time
from typing import Any, Literal

import msgspec

from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.headers import MSG_ID
from sojourn.broker.progress import Progress
from sojourn.schemas.codec import to_raw
from sojourn.schemas.config import VALUE_ENVELOPE
from sojourn.schemas.errors import BrokerUnavailable, Fenced, NondeterminismError
from sojourn.schemas.events import (
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunSuspended,
    SignalReceived,
)
from sojourn.schemas.vocabulary import TerminalStatus
from sojourn.schemas.wire import ChildOutcome

from ..agents.agent import Agent
from ..agents.callbacks import CallbackKeys
from ..agents.context import Context
from ..client.output import StepOutput, chunk_limit
from ..core.actions import Park, Parked, RunCancelledInterrupt
from ..core.limits import Limits
from ..core.machine import Machine
from ..core.state import RunState, fold
from ..core.steps import error_info
from ..history.chain import ChainTaken, ContinueAsNew, pass_on, start_next
from ..history.snapshots import Snapshot, fold_history
from ..ops.metrics import TOOL_CALLS, agent_label
from ..telemetry import child_headers, run_trace
from .appends import KEPT_HISTORY_MAX, Appender, AppendRefused, BrokerLost, broker_io
from .children import cascade_cancel, child_outcome, tell_parent
from .clock import Clock, Timer
from .faults import fault
from .holds import AgentHolds
from .interrupt import StepGuard
from .limits import SharedLimits
from .opening import Opening
from .run_timers import IN_PROCESS_BACKOFF, KeepTimer, RunTimers
from .slots import SlotWaits
from .sticky import Body

__all__ = ["Activation", "Outcome"]

Outcome = TerminalStatus | Literal["suspended", "waiting", "fenced", "noop"]
_NULL = to_raw(None)


class Activation(SlotWaits):
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
        opening: Opening | None = None,
        clock: Clock | None = None,
        holds: AgentHolds | None = None,
        limits: SharedLimits | None = None,
    ) -> None:
        """``keep_timer``: the worker's in-process timers (``InProcessTimers.keep`` for this
        run), which take the timers of the waits this activation parks on; the broker's copy
        is then written ``timer_backstop`` later. ``backstops``: waits whose broker timer is
        such a later copy (this activation was woken by the in-process one): removed once
        those waits have ended. ``keep_run``: whether the worker may keep this activation
        when it parks on a wait (its code then rests there instead of unwinding: ``rest``,
        ``worker/sticky.py``). ``snapshot``: a fold of a prefix of ``history``
        (``history/snapshots.py``), so that only what came after it is folded.
        ``callback_keys``: the worker's keyring, which signs the run's ``ctx.callback`` tokens.
        ``opening``: the run is not stored yet (``history`` is its ``RunStarted``): the first
        append stores it (``worker/opening.py``). ``clock``: the runs' clock, which stamps
        what the run records and times its waits (``worker/clock.py``). ``holds``: the
        agents' holds (``worker/holds.py``): a held agent's run suspends before its next step.
        ``limits``: the shared rate limits (``worker/limits.py``) its steps take slots of."""
        self.agent = agent
        self.holds = holds
        self.limits = limits
        self.clock = clock or Clock()
        self.callback_keys = callback_keys
        self.progress = progress if progress is not None else Progress()
        self.poke_heartbeat = heartbeat or (lambda: None)
        self.metric_agent = agent_label(agent.name)
        self.tool_calls = TOOL_CALLS.labels(self.metric_agent)
        self.run_id = run_id
        self.store = store
        self.log = Appender(
            run_id=run_id,
            store=store,
            writer=writer,
            history=history,
            keep_history=keep_timer is not None,
            flush_delay=flush_delay,
            metric_agent=self.metric_agent,
            machine=lambda: self.machine,
            opening=opening,
        )
        """What this activation appends to the run's history (``worker/appends.py``)."""
        self.timers = RunTimers(
            store=store,
            run_id=run_id,
            agent=agent.name,
            keep_timer=keep_timer,
            backstops=backstops,
            priority=lambda: (self.state.priority, self.state.fairness),
        )
        """The run's broker timers this activation sets and removes."""
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
            on_record=self.log.arm_flush,
            held=None if holds is None else functools.partial(holds.of, agent.name),
            limit_records=None if limits is None else limits.record,
        )
        self.guard = StepGuard(self._look_for_cancel)
        """Interrupts this activation's running steps for a cancel (``worker/interrupt.py``)."""
        self._expiry: Timer | None = None
        self.compensation_error: ErrorInfo | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._with_refs: list[Decision] | None = history if self.snapshot.refs else None
        """The history as loaded when it holds values by reference: read back before the
        code runs (``_load_values``)."""
        self.trace = run_trace(self, history)
        """The run's spans (``sojourn.actors.telemetry``); ``None`` when nothing traces."""

    @property
    def state(self) -> RunState:
        """The run as folded: its history when loaded, plus what others appended since."""
        return self.machine.state

    @property
    def last_seq(self) -> int:
        """The sequence of the last decision of the run this activation knows of."""
        return self.log.last_seq

    @property
    def fenced(self) -> bool:
        """Whether another worker owns the run: this activation writes nothing more."""
        return self.log.fenced

    @property
    def pending(self) -> list[RunEvent]:
        """Events the machine recorded that are not stored yet."""
        return self.machine.pending

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

    def time(self) -> float:
        """The runs' clock: now, in wall seconds (virtual in a test environment)."""
        return self.clock.now()

    def running(self, step: str | None) -> None:
        progress = self.progress
        progress.step, progress.details = step, None
        progress.step_started_at = None if step is None else _real_time()

    def check_live(self) -> None:
        """Called before every journaled operation: stop if nothing more may be written."""
        self.log.check_live()

    async def commit(self, events: list[RunEvent]) -> None:
        """Append the buffered events plus ``events`` as one decision (``Appender.commit``)."""
        await self.log.commit(events)

    async def _load_values(self) -> None:
        """Read back the values the history holds by reference and fold it again with them,
        so the code replays on the values it recorded.

        Raises:
            ValueUnreadable: a reference or a piece cannot be trusted (the worker wedges the
                run with the reason).
        """
        history, self._with_refs = self._with_refs, None
        assert history is not None
        events = await self.log.values.resolve(e for d in history for e in d.events)
        self.machine = dataclasses.replace(self.machine, state=fold(events))

    # --- waits, backoffs, suspensions and children (the Driver of Context) ---------------------

    async def park(self, action: Park) -> None:
        """Record the wait (timer first, then the event: a recorded wait never lacks its timer)
        and flush what is pending with it."""
        if action.deadline is not None:
            await self.timers.for_wait(action.position, action.deadline, self.log.decisions)
        await self._set_lifetime_timer(action.deadline)
        await self.commit([action.event] if action.event is not None else [])

    def cancel_timer(self, position: int) -> None:
        """Drop a wait's timer in the background: a timer left behind only wakes the run for
        nothing (its wake finds the wait ended)."""
        self.timers.cancel(position)

    async def backoff(self, position: int, retry_at: float) -> None:
        """Wait until a retry is due: on a broker timer (a crash or deploy meanwhile loses
        nothing), in this process too when it is short."""
        left = retry_at - self.clock.now()
        if left <= 0:
            return
        await self.timers.schedule(str(position), retry_at)
        if left > IN_PROCESS_BACKOFF:
            await self._set_lifetime_timer(retry_at)
        await self.commit([])  # the failed attempt, with its retry_at
        if left > IN_PROCESS_BACKOFF:
            raise Parked()
        await self.clock.sleep_until(retry_at)

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
            or not self.log.quiet
        ):
            raise Parked()
        await body.rest()

    async def suspend(self, event: RunSuspended) -> None:
        """Park the run visibly for a human (``sojourn resume`` lifts it)."""
        await self._set_lifetime_timer(None)
        await self.commit([event])
        hold = self.holds.of(self.agent.name) if self.holds is not None else None
        if self.holds is not None and hold is not None and hold.detail() == event.detail:
            await self.holds.mark(self.agent.name, self.run_id)  # held for its agent's hold
        raise Parked()

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        """Publish a child's start on the spawn subject, idempotent by the child's run id.
        The intake starts a child only of a stored parent: a parent opened in memory is
        stored first (``worker/opening.py``)."""
        if not self.log.stored:
            await self.commit([])
        await broker_io(
            self.store.broker.publish(
                self.store.names.spawn(agent, self.sender, self.state.priority),
                body,
                {MSG_ID: f"start:{agent}:{child_id}", **child_headers(self.trace, child_id)},
            )
        )
        fault("child_spawned", f"child {child_id} of agent {agent}")

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        return await broker_io(child_outcome(self.store, child_id))

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
        trace = self.trace
        outcome = await (self._drive() if trace is None else trace.activation(self._drive))
        if outcome != "fenced" and not self.state.terminal:
            # (An ended run's timers were all removed with its end.)
            self.timers.drop_backstops(self.state.ops)
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
        bring it, and signals only add to what the wait looks at (as when ``Appender`` rebases)."""
        if not self.resting or self.fenced or self.log.refused is not None:
            return False
        if any(not isinstance(e, SignalReceived) for d in newer for e in d.events):
            return False
        ends = self.machine.lifetime_ends()
        if ends is not None and ends <= self.clock.now():
            return False  # the cancel of an expired run is the cold path's to take
        if newer:
            self.log.take(newer)
            if self.log.decisions is not None and len(self.log.decisions) > KEPT_HISTORY_MAX:
                self.log.decisions = None
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
        self.log.writer = writer
        self.progress = progress
        self.poke_heartbeat = heartbeat
        self.timers.rebind(backstops)

    def discard(self) -> None:
        """Never write anything again, and unwind resting code (with ``Parked``: nothing is
        written on the way out)."""
        self.log.fenced = True
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
            return await self._end([self.machine.cancelled(self.clock.now())], "cancelled")
        if s.status == "new" or s.status == "suspended":
            return "noop"
        if s.queued:  # waits for a slot of its concurrency key (decision 0048): a cancel ends it
            if self.machine.cancel_reason() is None:
                return "noop"
            return await self._end([self.machine.cancelled(self.clock.now())], "cancelled")
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
            await self.commit([RunCompleted(output=raw, at=self.clock.now())])
        except Fenced:
            self.log.fenced = True
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
            raise self.log.refusal() from None
        except asyncio.CancelledError:
            # The worker is shutting down (a deploy). Record the steps that did finish, so the
            # next worker does not run them again; a step cut off mid-way stays in doubt.
            if self.pending and not self.fenced:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(self.log.flush_quietly()), 2.0)
            raise
        except RunCancelledInterrupt:
            ended = self.machine.cancelled(self.clock.now(), self.compensation_error)
            return await self._end([ended], "cancelled")
        except NondeterminismError as e:
            return await self._suspend_nondeterminism(e)
        except Exception as e:
            m = self.machine
            if m.nondeterminism is not None:
                return await self._suspend_nondeterminism(m.nondeterminism)
            err = error_info(m.fatal if m.fatal is not None else e)
            return await self._end([RunFailed(error=err, at=self.clock.now())], "failed")
        finally:
            self.log.disarm()
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
            if self.machine.take_cancel(self.clock.now()):
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

    def _later(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
            await self.log.catch_up()
        if not m.cancel_due():
            return None
        if m.compensating:
            return "the run was terminated"
        why = m.cancel_reason() or "cancelled"
        return f"the run was {'terminated' if m.state.terminate_requested else 'cancelled'}" + (
            "" if why == "cancelled" else f" ({why})"
        )

    def _watch_lifetime(self) -> None:
        """Past the run's lifetime, it is cancelled: now, or when it passes while this
        activation runs (interrupting the steps in flight)."""
        m = self.machine
        ends = m.lifetime_ends()
        if ends is None or m.expire(self.clock.now()):
            return
        self._expiry = self.clock.call_at(ends, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        m = self.machine
        if m.expire(self.clock.now()) and not m.compensating:
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
        await self.timers.for_lifetime(self.machine.lifetime_ends(), wakes_at)

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
            return await self._end(
                [RunFailed(error=error_info(problem), at=self.clock.now())], "failed"
            )
        try:
            await self.commit([])  # the last step's result is stored before the next run exists
        except Fenced:
            return "fenced"
        except BrokerLost as e:
            raise BrokerUnavailable(str(e.__cause__ or e), run_id=self.run_id) from e
        except AppendRefused:
            raise self.log.refusal() from None
        if self.state.cancel_requested is not None:
            return await self._end(
                [RunCancelled(reason=self.state.cancel_requested, at=self.clock.now())], "cancelled"
            )
        try:
            nxt = await start_next(
                store=self.store,
                values=self.log.values,
                run_id=self.run_id,
                agent=self.agent.name,
                code_version=self.agent.version,
                state=self.state,
                consumed=m.consumed,
                input=raw,
                writer=self.log.writer,
                carried=m.chain_spending(),
            )
        except ChainTaken as e:
            return await self._end([RunFailed(error=error_info(e), at=self.clock.now())], "failed")
        fault("continued")
        return await self._end(
            [RunCompleted(output=_NULL, continued_as=nxt, at=self.clock.now())], "completed"
        )

    async def _suspend_nondeterminism(self, e: NondeterminismError) -> Outcome:
        return await self._end(
            [RunSuspended(reason="nondeterminism", detail=e.message, at=self.clock.now())],
            "suspended",
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
            raise self.log.refusal() from None
        await self._after_end()
        return outcome

    async def _after_end(self) -> None:
        """After the terminal event: cancel live children, tell the parent, drop timers.

        Each is idempotent (deterministic Msg-Ids), so an activation that finds the run
        already ended simply does them again; the caller acks its wake only afterwards.
        """
        s = self.state
        if s.status == "cancelled":
            children = dict.fromkeys([*s.children, *self.machine.children])
            await cascade_cancel(self.store, self.run_id, s, children, self.sender)
        if not s.terminal:
            return  # a suspension is not an end: the parent keeps waiting, timers stay
        if s.continued_as is not None:
            # Not the chain's end: its last run tells the parent. Pass on what came too late.
            await pass_on(self.store, s, self.machine.consumed, s.continued_as, self.sender)
        elif s.parent_run_id:
            await tell_parent(self.store, self.run_id, s, self.sender)
        await self.timers.clear(s.ops, lifetime=self.agent.lifetime is not None)
        if s.concurrency is not None:  # give its slot back, admit the next (decision 0048)
            from .concurrency import KeySlots

            await KeySlots(self.store, self.log.writer, self.clock.now).release(s)
