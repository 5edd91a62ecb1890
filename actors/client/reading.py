"""Reading runs from their histories: ``history``, ``state``, ``status``, ``liveness``,
``pending``, ``current_run`` and ``result`` (which waits for a run's end).

Everything here reads what the broker stores (the events stream, its archive, the inbox, the
heartbeats): no projector is needed. A run that retention archived is read from the archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, TypeVar, overload

import msgspec

from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.follow import read_all
from sojourn.broker.progress import ProgressStore
from sojourn.projections.liveness import Thresholds, claim, classify, holders
from sojourn.projections.summary import summarize_all
from sojourn.schemas.codec import decode_wedge_record, decode_worker_beat, from_raw
from sojourn.schemas.errors import RunNotFound, SojournError
from sojourn.schemas.events import (
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
)
from sojourn.schemas.health import Liveness
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from sojourn.schemas.names import validate_token

from ..core.state import RunState, fold
from ..history.chain import current_run
from ..history.pending import PendingRun, find_pending
from ..history.values import values_for
from ..ops.archive import read_archived
from .base import ClientBase
from .watching import end_in

__all__ = ["RunCancelledError", "RunFailedError", "RunReading"]

T = TypeVar("T")

UNSTORED_FIRST_RELOOK = 5
"""After a first look that finds nothing of the run stored, ``Client.result`` looks again
in 2**5 ms (32 ms), then 64 ... 512 ms, rather than in 2 ms: the run is pending or starting
(or archived, which that second look reads). Its end can be published only once its first
append is stored, after that look, so the subscription hears it; the looks are a backstop (a
replica that lags behind, the archive), and one 2 ms later would land in the middle of a
starting run's first appends."""

FRESH_FOR = 1.0
FRESH_FIRST_LOOK = 0.010
"""``Client.result`` of a run this client started itself less than ``FRESH_FOR`` seconds
before (a trigger the inbox stored as new) looks at its last stored message only once its
end is heard or ``FRESH_FIRST_LOOK`` seconds have passed, not at once: such a run's end is
almost always published after the subscription, which hears it, and the look's round trip
would otherwise run while the run itself is starting. The look stays, a backstop for an end
stored before the subscription (a client slowed down between the two calls); then the
answer comes that much later."""


class RunFailedError(SojournError):
    """The awaited run failed; ``error`` is the recorded ``ErrorInfo``."""

    def __init__(self, run_id: str, error: ErrorInfo | None) -> None:
        detail = f"{error.type}: {error.message}" if error else "unknown error"
        super().__init__(f"run {run_id} failed: {detail}", run_id=run_id)
        self.error = error


class RunCancelledError(SojournError):
    """The awaited run was cancelled."""


class RunReading(ClientBase):
    """``Client``'s reads of runs' histories: ``history``, ``state``, ``liveness``, ``pending``,
    ``current_run``, ``status``, ``result``."""

    async def history(self, run_id: str) -> list[Decision]:
        """Every stored decision of the run, oldest first (empty if it does not exist).

        An ended run that retention moved out of the hot streams (``Settings.retain_ended``)
        is read from the archive: the same decisions as before. The hot stream is asked
        first; the archive only when it holds nothing of the run (or, should anything have
        been appended after the run was archived, not its start).

        Raises:
            HistoryError: the run's archived copy is damaged.
        """
        validate_token(run_id, "run_id")
        hot = await self.store.load(run_id)
        if hot and hot[0].events and isinstance(hot[0].events[0], RunStarted):
            return hot
        archived = await read_archived(self.archive, run_id)
        if not archived:
            return hot
        return [*archived, *(d for d in hot if d.seq > archived[-1].seq)]

    async def state(self, run_id: str) -> RunState:
        """The run's current state (the fold of its history).

        Raises:
            RunNotFound: no such run.
        """
        history = await self.history(run_id)
        if not history:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        return fold(e for d in history for e in d.events)

    async def liveness(self, run_id: str, *, now: float | None = None) -> Liveness:
        """What the run is doing now, judged like the watchdog judges it: from its history,
        the last heartbeat of the worker that holds it, and any wedge record.

        Raises:
            RunNotFound: no such run.
        """
        history = await self.history(run_id)
        if not history:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        summary = summarize_all((d.seq, 0, d.events) for d in history)
        progress = await ProgressStore(self.broker, self.names).last(run_id)
        m = await self.broker.direct_get_last(self.names.health_stream, self.names.wedge(run_id))
        wedge = None
        if m is not None:
            with contextlib.suppress(msgspec.MsgspecError):
                wedge = decode_wedge_record(m.data)
        limits = Thresholds(
            stall_after=self.settings.stall_threshold, overdue_after=self.settings.overdue_after
        )
        beats = []
        for b in await read_all(self.broker, self.names.health_stream, self.names.workers_all):
            with contextlib.suppress(msgspec.MsgspecError):
                beats.append(decode_worker_beat(b.data))
        listed = holders(beats).get(run_id)
        lease, beat = claim(listed, progress), listed[0] if listed else None
        now = time.time() if now is None else now
        return classify(summary, lease, now, limits, wedge, beat)

    async def pending(self, run_id: str) -> PendingRun | None:
        """The run's start, if it is stored in the inbox and no worker has taken it yet (the
        run has no history): which agent it names and since when it waits. ``None`` for a run
        that exists, or of which nothing is known.

        Only starts that name their run in the subject are found (``Client.start`` and
        ``sojourn start`` send that form; a start on ``<prefix>.start.<agent>`` is not)."""
        validate_token(run_id, "run_id")
        if await self.store.last_seq(run_id) > 0:
            return None
        return await find_pending(
            self.broker, self.names, run_id, max_payload=self.settings.max_payload
        )

    async def current_run(self, run_id: str) -> str:
        """The run of ``run_id``'s continue-as-new chain that carries on now: ``run_id``
        itself unless it continued as new (``RunState.continued_as`` names the next run;
        ``status`` is then ``completed``), else its chain's latest run."""
        validate_token(run_id, "run_id")
        current, _ = await current_run(self.broker, self.names, run_id)
        return current

    async def status(self, run_id: str) -> str:
        """``pending``, ``running``, ``waiting``, ``suspended``, ``completed``, ``failed`` or
        ``cancelled``. A run whose start is stored and not yet taken by a worker is
        ``pending`` (see ``pending``).

        Raises:
            RunNotFound: the run has no history and no stored start.
        """
        history = await self.history(run_id)
        if history:
            return fold(e for d in history for e in d.events).status
        if await self.pending(run_id) is None:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        return "pending"

    @overload
    async def result(self, run_id: str, *, timeout: float | None = None) -> Any: ...

    @overload
    async def result(self, run_id: str, *, timeout: float | None = None, type: type[T]) -> T: ...

    async def result(self, run_id: str, *, timeout: float | None = None, type: Any = None) -> Any:
        """Wait for the run to end and return its output, decoded as ``type``.

        Works for runs that ended long ago and runs that have not started yet. A run that
        continued as new (``ctx.continue_as_new``) has not ended for this: the answer is the
        outcome of its chain's last run, whichever run of the chain ``run_id`` names.

        Raises:
            RunFailedError / RunCancelledError: the run ended without output.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        validate_token(run_id, "run_id")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end = await self._end_of(run_id, deadline, timeout)
            if isinstance(end, RunCompleted) and end.continued_as is not None:
                run_id, _ = await current_run(self.broker, self.names, end.continued_as)
                continue
            if isinstance(end, RunCompleted) and end.output_ref is not None:
                end = await values_for(self.broker, self.names, self.settings).resolve_one(end)
            return _outcome(run_id, end, Any if type is None else type)

    async def _end_of(self, run_id: str, deadline: float | None, timeout: float | None) -> RunEvent:
        """The terminal event of ``run_id``, once it is stored (before ``deadline``)."""
        changed = asyncio.Event()

        async def on_event(msg: Delivery) -> None:
            # Only a hint: a plain subscriber also sees appends the stream refused (a fenced
            # writer's), so the answer is always read back from what the stream stored.
            if end_in(msg.data) is not None:
                changed.set()

        # Subscribe first, then look at the last stored message: whichever way the end
        # arrives, it is seen, and only one message is read (not the whole history). No flush
        # between them: the server reads this connection's SUB before the look sent after it
        # (both go out in one write), so an end published once it has the SUB is heard, and
        # one stored before the look is read; what a cluster's routes or a lagging replica may
        # hide meanwhile, the looks below find (a flush would not: it waits for our server).
        sub = await self.broker.subscribe(self.names.events(run_id), cb=on_event)
        # An end published just before the SUB is never heard, and may be stored only after
        # the first look: look again shortly (2, 4, 8 ... 512 ms) before the 5 s cadence.
        hinted = 1
        looks = 0
        archive_looked = False
        try:
            if self._just_started(run_id, FRESH_FOR):
                # Its end comes after the subscription (see FRESH_FIRST_LOOK): heard, then read.
                wait = FRESH_FIRST_LOOK
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
            while True:
                last = await self.broker.direct_get_last(
                    self.names.events_stream, self.names.events(run_id)
                )
                looks += 1
                event = end_in(last.data) if last is not None else None
                # A run not in the stream is archived (it ended long ago: its end is there) or
                # not stored yet (just started). The archive is read once, at the second look
                # (32 ms later: ``UNSTORED_FIRST_RELOOK``) or when the time is up: a run started
                # just before costs no archive read once it is stored by then.
                remaining = None if deadline is None else deadline - time.monotonic()
                due = remaining is not None and remaining <= 0
                if last is None and not archive_looked and (looks > 1 or due):
                    archive_looked = True
                    event = await self._archived_end(run_id)
                if event is not None:
                    return event
                if last is None and looks == 1:
                    hinted = UNSTORED_FIRST_RELOOK  # its end is heard (see the constant)
                if due:
                    raise TimeoutError(f"run {run_id} did not finish within {timeout}s")
                # Re-read now and then too: a core subscription misses what is published
                # while the connection is down.
                wait = 5.0 if remaining is None else min(remaining, 5.0)
                if hinted:
                    # The live message can overtake the stored copy's visibility to a direct
                    # get by a moment (on a cluster, a replica that has not applied it yet
                    # may answer): look again shortly (2, 4, 8 ... 512 ms), not in 5 s.
                    wait = min(wait, 0.001 * 2**hinted)
                    hinted = hinted + 1 if hinted < 9 else 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
                if changed.is_set():
                    changed.clear()
                    hinted = 1
        finally:
            await sub.unsubscribe()

    async def _archived_end(self, run_id: str) -> RunEvent | None:
        """The terminal event of an archived run (``None``: the run is not archived)."""
        archived = await read_archived(self.archive, run_id)
        ends = [e for d in archived[-1:] for e in d.events if isinstance(e, TERMINAL_EVENTS)]
        return ends[-1] if ends else None


def _outcome(run_id: str, event: RunEvent, tp: Any) -> Any:
    if isinstance(event, RunCompleted):
        return from_raw(event.output, tp)
    if isinstance(event, RunFailed):
        raise RunFailedError(run_id, event.error)
    assert isinstance(event, RunCancelled)
    raise RunCancelledError(f"run {run_id} was cancelled: {event.reason}", run_id=run_id)
