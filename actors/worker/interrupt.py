"""Interrupting running steps: a cancel that takes effect within a second, and step timeouts.

A cancel is recorded by the intake (``CancelRequested``). Without more, the worker executing
the run would learn it only at its next append, after the running step returned, which for a
hung step is never. So:

- **The notice.** Once the cancel is stored, the intake publishes a core NATS message (never
  stored, empty) on ``<prefix>.interrupt.<run_id>`` (``publish_interrupt``). Every worker
  subscribes to ``<prefix>.interrupt.*`` without a queue group (cancels are rare), and the one
  executing the run (``Interrupts``) tells its activation, which reads what was appended since
  its last decision (the notice is only a hint: a forged one costs a read and changes
  nothing) and, when a cancel is indeed due, interrupts the steps in flight (``StepGuard``).
- **The backup.** A notice can be lost (a reconnect). While a step has been running for more
  than ``POLL_AFTER`` seconds, the activation looks at its run's last stored message every
  ``POLL_EVERY`` seconds (one direct get), so a lost notice costs seconds, not forever.
- **Interrupting.** A step runs as a task of its own (async) or in a thread of its own (sync),
  awaited together with a trip wire. An async step is cancelled; a sync one cannot be stopped
  and is *abandoned*: its thread runs on (a daemon thread, so it never holds up the process's
  exit), and its result, should one come, is discarded. Either way the attempt is recorded as
  failed (``Cancelled`` or ``Abandoned``, never retried) and the run's code is stopped.
- **Timeouts.** ``@step(timeout=...)`` bounds an attempt the same way: past it, the attempt
  fails with ``StepTimeout`` (a ``TimeoutError``) and is retried as its policy says.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, Subscription
from sojourn.broker.names import Names
from sojourn.schemas.errors import InvalidName, StepTimeout
from sojourn.schemas.events import ErrorInfo

from ..agents.steps import is_async
from ..core.retry import step_options

__all__ = [
    "CANCEL_GRACE",
    "POLL_AFTER",
    "POLL_EVERY",
    "Interruptible",
    "Interrupts",
    "StepGuard",
    "StepInterrupted",
    "publish_interrupt",
    "run_step",
]

log = logging.getLogger("sojourn.interrupt")

POLL_AFTER = 2.0
"""Seconds a step runs before its activation starts looking for a cancel itself."""

POLL_EVERY = 2.0
"""Seconds between those looks (one direct get each), while steps are in flight."""

CANCEL_GRACE = 0.25
"""Seconds a cancelled async step is given to unwind (its ``finally`` blocks) before the run
moves on without it (a step that swallows the cancellation is left behind)."""


class StepInterrupted(BaseException):
    """A running step was interrupted by a cancel (raised out of ``StepGuard.run``).

    A ``BaseException``: it is not the step's failure to retry, and agent code must not be
    able to catch it. ``error`` is what the attempt's ``StepFailed`` records."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


def _interrupted(why: str, sync: bool) -> ErrorInfo:
    if sync:
        return ErrorInfo(
            type="Abandoned",
            message=f"{why}: the step runs in a thread, which cannot be stopped: it was "
            "abandoned (its result, should it come, is discarded)",
        )
    return ErrorInfo(type="Cancelled", message=f"{why}: the step's task was cancelled")


def _timed_out(timeout: float, sync: bool) -> StepTimeout:
    what = (
        "it runs in a thread, which cannot be stopped, and was abandoned (its result, should "
        "it come, is discarded)"
        if sync
        else "it was cancelled"
    )
    return StepTimeout(f"the attempt ran past its timeout of {timeout:g}s: {what}", timeout=timeout)


class StepGuard:
    """The steps one activation has in flight, and how to stop them.

    ``look`` is the backup for a lost notice: asked every ``poll_every`` seconds once a step
    has been in flight for ``poll_after``, it returns why the run must stop (``None``: go on).
    A step that ends sooner costs no look, no task and no timer beyond its own.
    """

    def __init__(
        self,
        look: Callable[[], Awaitable[str | None]] | None = None,
        *,
        poll_after: float = POLL_AFTER,
        poll_every: float = POLL_EVERY,
    ) -> None:
        self._look = look
        self._poll_after = poll_after
        self._poll_every = poll_every
        self._wires: set[asyncio.Future[str | None]] = set()
        """One per attempt in flight: resolved by its end (``None``), its timeout
        (``_TIMED_OUT``) or an interrupt (why)."""
        self._poll_at: asyncio.TimerHandle | None = None
        """The timer that starts the looks: armed at most once, and left armed across steps
        that end sooner (it looks at ``_busy_since`` when it fires), so a step costs no timer
        of its own."""
        self._busy_since: float | None = None
        """Loop time since which attempts have been in flight without a pause (none: idle)."""
        self._poller: asyncio.Task[None] | None = None
        self.interrupts = 0
        """Steps this guard interrupted."""

    @property
    def in_flight(self) -> int:
        return len(self._wires)

    def interrupt(self, why: str) -> int:
        """Stop every step in flight (``why`` goes into what each records); returns how many
        there were. A step that starts afterwards is not affected: the run's machine stops
        the code before it (``Machine.cancel_due``)."""
        tripped = 0
        for wire in self._wires:
            if not wire.done():
                wire.set_result(why)
                tripped += 1
        self.interrupts += tripped
        return tripped

    def close(self) -> None:
        """The activation ended: stop looking."""
        self._stop_looking()

    def _stop_looking(self) -> None:
        if self._poll_at is not None:
            self._poll_at.cancel()
            self._poll_at = None
        self._idle()

    def _idle(self) -> None:
        """No attempt in flight: stop the looks (the timer stays armed; see ``_poll_at``)."""
        self._busy_since = None
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _start_looking(self) -> None:
        self._poll_at = None
        since = self._busy_since
        if since is None or not self._wires or self._poller is not None:
            return
        loop = asyncio.get_running_loop()
        due = since + self._poll_after
        if loop.time() < due:  # the steps in flight now began after the timer was armed
            self._poll_at = loop.call_at(due, self._start_looking)
            return
        self._poller = loop.create_task(self._poll())

    async def _poll(self) -> None:
        assert self._look is not None
        while self._wires:
            try:
                why = await self._look()
            except Exception as e:  # a look is a backup: the next one may succeed
                log.debug("looking for a cancel failed: %s", e)
                why = None
            if why is not None:
                self.interrupt(why)
            await asyncio.sleep(self._poll_every)

    async def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None = None,
    ) -> Any:
        """Run one attempt of ``fn`` until it returns, raises, is interrupted or times out.

        Raises:
            StepInterrupted: a cancel interrupted it (``interrupt``).
            StepTimeout: it ran past ``timeout`` seconds.
            Exception: whatever ``fn`` raised.
        """
        loop = asyncio.get_running_loop()
        sync = not is_async(fn)
        wire: asyncio.Future[str | None] = loop.create_future()

        def ended(_: object) -> None:
            if not wire.done():
                wire.set_result(None)

        work: asyncio.Future[Any]
        if sync:
            work = _in_thread(loop, fn, args, kwargs)
            work.add_done_callback(ended)
        else:  # the task trips the wire itself as it ends: no callback turn in between
            work = loop.create_task(_tripping(wire, fn, args, kwargs))
        deadline = None if timeout is None else loop.call_later(timeout, _time_out, wire)
        if not self._wires:
            self._busy_since = loop.time()
        self._wires.add(wire)
        if self._look is not None and self._poll_at is None and self._poller is None:
            self._poll_at = loop.call_later(self._poll_after, self._start_looking)
        try:
            why = await wire
        except asyncio.CancelledError:  # the activation itself is cancelled (a shutdown)
            work.cancel()
            raise
        finally:
            self._wires.discard(wire)
            if not self._wires:
                self._idle()
            if deadline is not None:
                deadline.cancel()
        if why is None or work.done():
            if sync:
                work.remove_done_callback(ended)
            result = work.result()
            if inspect.isawaitable(result):  # a sync function that returned an awaitable
                result = await result
            return result
        if not sync:
            work.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait((work,), timeout=CANCEL_GRACE)
        work.add_done_callback(_forget_outcome)
        if why is _TIMED_OUT:
            assert timeout is not None
            raise _timed_out(timeout, sync)
        raise StepInterrupted(_interrupted(why, sync))


async def _tripping(
    wire: asyncio.Future[str | None],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """An async step's task: ``fn``'s attempt, which trips ``wire`` (``None``: it ended) as it
    ends, returns or raises, in the same turn of the loop as the task completes."""
    try:
        return await fn(*args, **kwargs)
    finally:
        if not wire.done():
            wire.set_result(None)


_TIMED_OUT = "\x00timed out"
"""What a wire says when its attempt's timeout passed (no interrupt reason looks like it)."""


def _time_out(wire: asyncio.Future[str | None]) -> None:
    if not wire.done():
        wire.set_result(_TIMED_OUT)


async def run_step(
    guard: StepGuard | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """One attempt of the step ``fn``, bounded by its ``@step(timeout=...)`` and interrupted
    by ``guard`` (none: only the timeout applies, as in a test's driver)."""
    return await (guard or StepGuard()).run(fn, args, kwargs, step_options(fn).timeout)


class _Threads:
    """Daemon threads for sync steps, kept a while when idle, as many as steps need.

    Not the default executor: an abandoned step may never end, and a bounded pool it held
    would run out of threads after a few such steps (and hold up the interpreter's exit).
    """

    IDLE_FOR = 30.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # claimed: that thread takes this job
            self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._serve, name="sojourn-step", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_FOR)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # no claimed job is waiting: go
                        self._idle -= 1
                        return
                continue
            job()
            with self._lock:
                self._idle += 1


_THREADS = _Threads()


def _in_thread(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> asyncio.Future[Any]:
    """``fn(*args, **kwargs)`` on a step thread (``_Threads``), with the caller's context
    (the step's ``current_step()``), as a future of the loop."""
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # abandoned: the result is discarded
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def body() -> None:
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as e:  # handed to the loop, raised there
            ok, value = False, e
        else:
            ok = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, ok, value)

    _THREADS.submit(body)
    return future


def _forget_outcome(work: asyncio.Future[Any]) -> None:
    """An interrupted or timed-out attempt's late outcome is discarded (and marked retrieved,
    so asyncio does not log it as never retrieved)."""
    if not work.cancelled():
        work.exception()


# --- the worker's side: notices ----------------------------------------------------------


class Interruptible(Protocol):
    """What the worker tells of a notice: the activation executing the run."""

    def noticed(self) -> None:
        """A cancel of this run may have been recorded: look, and interrupt if so."""


class Interrupts:
    """The runs a worker executes, by run id, for the intake's interrupt notices."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self._runs: dict[str, Interruptible] = {}
        self._sub: Subscription | None = None
        self.notices = 0
        """Notices received for runs executing here."""

    @contextlib.contextmanager
    def track(self, run_id: str, activation: Interruptible) -> Iterator[None]:
        """While the block runs, notices for ``run_id`` go to ``activation``."""
        self._runs[run_id] = activation
        try:
            yield
        finally:
            if self._runs.get(run_id) is activation:
                del self._runs[run_id]

    def notice(self, run_id: str) -> bool:
        """A notice for ``run_id``: tell its activation if it executes here."""
        act = self._runs.get(run_id)
        if act is None:
            return False
        self.notices += 1
        act.noticed()
        return True

    async def subscribe(self, broker: Broker) -> None:
        """Hear every notice of the deployment (core NATS, no queue group)."""

        async def on_notice(msg: Delivery) -> None:
            try:
                run_id = self.names.parse_interrupt(msg.subject)
            except InvalidName:
                return  # not ours to act on: a notice is only a hint
            self.notice(run_id)

        self._sub = await broker.subscribe(self.names.interrupts_all, cb=on_notice)

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def publish_interrupt(broker: Broker, names: Names, run_id: str) -> None:
    """Tell whichever worker executes ``run_id`` that a cancel is recorded (best effort: the
    executing activation's own looks, and the run's wake, are the backups)."""
    try:
        await broker.publish_core(names.interrupt(run_id), b"")
    except Exception as e:
        log.debug("run %s: interrupt notice not sent: %s", run_id, e)
