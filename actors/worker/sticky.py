"""Sticky activations: a parked run's code kept suspended in its worker, resumed in place.

Every activation of a run replays its code from the top against the journal, so waking a run
costs time in proportion to everything it did before: loading the history, folding it, and
re-executing the code through every recorded operation. For a conversation of thousands of
turns that is most of every turn (docs/decisions/0021-sticky-activations-and-fold-snapshots.md).

So the worker that parks a run may keep its activation instead of unwinding it: the agent's
coroutine stays suspended inside the wait (``Context._decide`` awaits ``Body.rest``), with its
machine, journal and last sequence. The next wake of the run that comes to *this* worker (a
signal, a timer) reads only what was appended after that sequence and, when it holds only
signals, folds them in and lets the coroutine go on: no load, no fold of the history, no replay.
Replay is deterministic, so going on from the kept coroutine is what replaying it would do.
Anything else (another writer's decision, a cancel, a gap the fence would refuse) discards the
kept copy and the run is activated as usual.

A kept run is *not* active: it holds no slot, its worker's heartbeats do not list it
(decision 0018: a run is held only while it executes) and any other worker may take it at
any time; the kept copy then finds that worker's decisions after its last sequence, or is
refused by the fence, and is discarded. Nothing about a run is only here: a worker that dies
with kept runs loses nothing, their histories say everything.

``Body`` drives one activation's code in a task of its own, so that the activation can return
(its wake acked, its slot released) while the code rests; ``StickyRuns`` is the worker's
bounded, least-recently-used set of kept activations.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from sojourn.broker.tasks import cancel_and_wait

from ..core.actions import Parked

__all__ = ["STICKY_RUNS", "Body", "Keepable", "StickyRuns"]

STICKY_RUNS = 2_000
"""Parked activations a worker keeps by default (``Worker(sticky_runs=...)``; 0: none)."""

T = TypeVar("T")

CANCEL_GRACE = 5.0
"""Seconds a cancelled body's task is given to end (cancelled again meanwhile, should its
code swallow a cancel) before the one waiting on it goes on."""


class Body(Generic[T]):
    """An activation's code, run in a task of its own so that it can rest inside a wait after
    the activation returned, and go on later from there.

    ``drive`` starts the code, or lets a resting one go on, and returns when the code ends (its
    result) or rests again (``None``). The code calls ``rest`` where it would otherwise unwind
    with ``Parked``: it returns when ``drive`` is called again, and raises ``Parked`` when the
    body is ``discard``-ed instead.
    """

    __slots__ = ("_rested", "_resume", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[T] | None = None
        self._rested: asyncio.Future[None] | None = None
        """Set while ``drive`` waits: done when the code rests."""
        self._resume: asyncio.Future[None] | None = None
        """Set while the code rests: what ``rest`` awaits."""

    @property
    def resting(self) -> bool:
        """Whether the code is suspended in ``rest`` (kept, to be driven on or discarded)."""
        return self._resume is not None and not self._resume.done()

    @property
    def can_rest(self) -> bool:
        """Whether the code may rest now: it runs under ``drive`` and is not resting yet."""
        return self._rested is not None and not self._rested.done()

    @property
    def ended(self) -> bool:
        """Whether the code has ended (or never started)."""
        return self._task is None or self._task.done()

    async def drive(self, start: Callable[[], Coroutine[Any, Any, T]]) -> T | None:
        """Run the code from ``start()`` (the first time) or from its rest; its result when it
        ends, ``None`` when it rests again.

        Cancelled (a worker stopping), it cancels the code and waits for it to unwind.

        Raises:
            RuntimeError: the code ended, or is running under another ``drive`` already.
            BaseException: whatever the code raised.
        """
        loop = asyncio.get_running_loop()
        if self._rested is not None:
            raise RuntimeError("this body is already being driven")
        if self._task is None:
            self._rested = loop.create_future()
            self._task = loop.create_task(start())
            self._task.add_done_callback(_retrieve)
        elif self.resting:
            assert self._resume is not None
            self._rested = loop.create_future()
            resume, self._resume = self._resume, None
            resume.set_result(None)
        else:
            raise RuntimeError("this body's code has ended")
        task, rested = self._task, self._rested
        # Whichever comes first: the code ends, or it rests (``asyncio.wait``'s
        # FIRST_COMPLETED, without its sets and per-call closures). Neither is cancelled.
        either: asyncio.Future[None] = loop.create_future()

        def first(_: object) -> None:
            if not either.done():
                either.set_result(None)

        task.add_done_callback(first)
        rested.add_done_callback(first)
        try:
            await either
        except asyncio.CancelledError:
            await cancel_and_wait(task, CANCEL_GRACE)
            raise
        finally:
            task.remove_done_callback(first)
            rested.remove_done_callback(first)
            self._rested = None
        if task.done():
            return task.result()
        return None

    async def rest(self) -> None:
        """Called by the code (under ``drive``): suspend here until driven on.

        Raises:
            Parked: the body was discarded (unwind: nothing more may be written), or it cannot
                rest (not under ``drive``, or resting already).
        """
        rested = self._rested
        if rested is None or rested.done():
            raise Parked()
        resume: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resume = resume
        rested.set_result(None)
        await resume  # a result: go on; ``Parked``: discarded

    def discard(self) -> None:
        """Unwind resting code with ``Parked`` (it ends soon after, in its own task)."""
        resume, self._resume = self._resume, None
        if resume is not None and not resume.done():
            resume.set_exception(Parked())

    async def wait_ended(self) -> None:
        """Until the code has ended (it was discarded, or it ends on its own)."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)

    def cancel(self) -> None:
        """Cancel the code's task (a last resort: ``discard`` lets it unwind quietly)."""
        if self._task is not None:
            self._task.cancel()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Retrieve a finished body's exception: a discarded body's end is nobody's concern."""
    if not task.cancelled():
        task.exception()


class Keepable(Protocol):
    """What ``StickyRuns`` keeps: an activation whose code rests (``Activation``)."""

    @property
    def body(self) -> Body[Any] | None: ...

    def discard(self) -> None:
        """Never write anything again, and unwind the resting code."""


K = TypeVar("K", bound=Keepable)


class StickyRuns(Generic[K]):
    """A worker's kept activations, by run id, at most ``limit``; the least recently kept are
    discarded first.

    ``take`` hands a kept activation out (it is no longer kept: one user at a time);
    ``keep`` keeps one again after it rested. ``close`` discards all of them (the worker
    stops). The counters say what happened to kept runs, for tests and benchmarks.
    """

    def __init__(self, limit: int = STICKY_RUNS) -> None:
        if limit < 0:
            raise ValueError(f"sticky_runs must be 0 or more, not {limit}")
        self.limit = limit
        self._runs: OrderedDict[str, K] = OrderedDict()
        self._unwinding: set[Body[Any]] = set()
        self._closed = False
        self.kept = 0
        """Times an activation was kept."""
        self.resumed = 0
        """Wakes that let a kept activation go on (no load, no fold, no replay)."""
        self.discarded: Counter[str] = Counter()
        """Kept activations discarded, by why: ``evicted`` (the limit), ``changed`` (someone
        else wrote to the run), ``closed`` (the worker stopped), ``error`` (the tail could not
        be read), ``declined`` (not kept: disabled, or stopping)."""

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    @property
    def enabled(self) -> bool:
        """Whether an activation that parks may rest to be kept (else it unwinds)."""
        return self.limit > 0 and not self._closed

    def keep(self, run_id: str, act: K) -> bool:
        """Keep ``act``, whose code rests, as the run's; ``False``: discarded instead (disabled,
        closed, or it does not rest). May discard the least recently kept to make room."""
        body = act.body
        if not self.enabled or body is None or not body.resting:
            self._discard(act, "declined")
            return False
        old = self._runs.pop(run_id, None)
        if old is not None and old is not act:  # pragma: no cover - take() precedes keep()
            self._discard(old, "changed")
        self._runs[run_id] = act
        self.kept += 1
        while len(self._runs) > self.limit:
            _, oldest = self._runs.popitem(last=False)
            self._discard(oldest, "evicted")
        return True

    def take(self, run_id: str) -> K | None:
        """The run's kept activation, no longer kept (the caller resumes or discards it)."""
        return self._runs.pop(run_id, None)

    def drop(self, run_id: str, why: str = "dropped") -> None:
        """Discard the run's kept activation, if any (its next wake activates it from its
        history: for instance after its agent's code changed in this process)."""
        act = self._runs.pop(run_id, None)
        if act is not None:
            self._discard(act, why)

    def resumed_one(self) -> None:
        self.resumed += 1

    def discard(self, act: K, why: str) -> None:
        """Discard an activation ``take`` handed out that cannot be resumed."""
        self._discard(act, why)

    def _discard(self, act: K, why: str) -> None:
        self.discarded[why] += 1
        act.discard()
        body = act.body
        if body is not None and not body.ended:
            self._unwinding.add(body)
            task = asyncio.get_running_loop().create_task(body.wait_ended())
            task.add_done_callback(lambda _t: self._unwinding.discard(body))

    def kill(self) -> None:
        """Cancel every kept activation's code at once, nothing unwound (the worker dies)."""
        self._closed = True
        while self._runs:
            _, act = self._runs.popitem(last=False)
            if act.body is not None:
                act.body.cancel()

    async def close(self, grace: float = 5.0) -> None:
        """Discard every kept activation and wait (at most ``grace`` seconds) until their
        code has unwound; code still running then is cancelled."""
        self._closed = True
        while self._runs:
            _, act = self._runs.popitem(last=False)
            self._discard(act, "closed")
        bodies = list(self._unwinding)
        if not bodies:
            return
        waiting = [asyncio.ensure_future(b.wait_ended()) for b in bodies]
        _, late = await asyncio.wait(waiting, timeout=grace)
        for b in bodies:
            if not b.ended:
                b.cancel()
        for t in late:
            t.cancel()
