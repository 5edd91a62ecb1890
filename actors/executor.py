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
from typing import Literal

from sojourn.broker.eventstore import Decision, EventStore
from sojourn.schemas.codec import to_raw
from sojourn.schemas.errors import ConcurrencyConflict, Fenced, NondeterminismError
from sojourn.schemas.events import (
    CancelRequested,
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)

from .agent import Agent
from .context import Context
from .journal import Journal
from .state import RunState, fold

__all__ = ["Activation", "Outcome", "RunCancelledInterrupt"]

Outcome = Literal["completed", "failed", "cancelled", "suspended", "fenced", "noop"]

EXTERNAL_EVENTS = (CancelRequested,)
"""Events other parties append to a run without owning it; they commute with our decisions."""


_OP_EVENTS = (StepStarted, StepCompleted, StepFailed, ValueRecorded)


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
    ) -> None:
        self.agent = agent
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
        self._lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._nondeterminism: NondeterminismError | None = None

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
        except (Fenced, RunCancelledInterrupt):
            pass

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
                    seq = await self.store.append(
                        self.run_id, batch, expected_seq=self.last_seq, writer=self.writer
                    )
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
                break
            self.appends += 1
            self.last_seq = seq
            # Live operations need no folding (the journal only consults what was recorded
            # before this activation); folding them would copy the op index on every step.
            others = [e for e in batch if not isinstance(e, _OP_EVENTS)]
            if others:
                self.state = fold(others, self.state)
            if interrupted:
                raise RunCancelledInterrupt()

    async def _rebase(self) -> None:
        newer = await self.store.load(self.run_id, after_seq=self.last_seq)
        foreign = [e for d in newer for e in d.events if not isinstance(e, EXTERNAL_EVENTS)]
        if foreign or not newer:
            self.fenced = True
            raise Fenced(self.run_id)
        self.state = fold((e for d in newer for e in d.events), self.state)
        self.last_seq = newer[-1].seq

    # --- the activation -----------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Drive the agent to its next resting point and record it."""
        s = self.state
        if s.status == "new" or s.terminal or s.status == "suspended":
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
            return "completed"
        except Fenced:
            self.fenced = True
            return "fenced"
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
        return outcome
