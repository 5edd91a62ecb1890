"""The inbox loop: a worker's intake consumer, its messages handled concurrently and each run's
in order.

Messages about the same run (a start, then its cancel; a burst of signals) are handled one at a
time in the order the inbox stored them (a batch's redeliveries put back in that order), each
waiting for the one before while kept alive; messages about
different runs go at once, up to ``IN_FLIGHT`` (256) at a time. A message refused by its bytes alone
(``Refusals.screen``) never waits behind the others. Trouble with one message is settled here:
a message whose bytes no decoder could read is refused, broker trouble and bugs have it
retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import msgspec

from sojourn.broker.delivery import Delivery
from sojourn.broker.names import InboxSubject
from sojourn.schemas.codec import peek_run_id
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.priority import PRIORITY_DEFAULT

from ..ops import metrics
from .fairness import FairWindow
from .intake import Intake
from .lanes import Lane
from .refusals import Screened
from .tenancy import count_redelivery, times_delivered

__all__ = ["BULK_IN_FLIGHT", "IN_FLIGHT", "InboxLoop"]

IN_FLIGHT = 256
"""Inbox messages one worker fetches at a time and handles at once. A burst of starts is taken
in one pull and opened together (each is light until its run's first append); 64 made a burst
of 100 starts wait for the first 64 runs' first appends before the rest were even read."""

BULK_IN_FLIGHT = 32
"""The same for the lanes of priorities 4 and 5 (decision 0049): a burst of bulk starts keeps
fewer tasks ready on the event loop at once, so an urgent run's round trips wait behind fewer
of them; the bulk runs themselves wait in their lane, not on the loop."""

FIRST_WRITE_WAIT = 0.002
"""Seconds the intake's loop waits, at most, for the starts it just handed out to put their
runs' first appends on the wire before it asks for more (``_first_writes``)."""
INBOX_WINDOW = 4096
"""Inbox messages a lane's loop reads ahead of what it handles, to share its turns fairly
between fairness keys (``FairWindow``); and at most ``INBOX_WINDOW_BYTES`` of them."""
INBOX_WINDOW_BYTES = 16 * 2**20

log = logging.getLogger("sojourn.worker")


class InboxLoop:
    """Takes one worker's inbox messages and hands them to its ``Intake``."""

    def __init__(self, intake: Intake, settings: Settings) -> None:
        self.intake = intake
        self.settings = settings
        self.busy = 0
        """Messages of this lane being handled now."""

    async def run(self, lane: Lane, stopping: asyncio.Event) -> None:
        """Fetch the inbox messages of one lane and handle them concurrently; messages about
        the same run (same subject) are handled in arrival order."""
        room = IN_FLIGHT if lane.priority <= PRIORITY_DEFAULT else BULK_IN_FLIGHT
        inflight = asyncio.Semaphore(room)
        tails: dict[str, asyncio.Task[None]] = {}
        # Read ahead and handed out fairly between the starts' fairness keys (decision 0049).
        window = FairWindow(
            lane.sub,
            window=INBOX_WINDOW,
            window_bytes=INBOX_WINDOW_BYTES,
            keep_alive=max(0.5, self.settings.lease_ttl / 3),
            max_message=self.settings.max_payload,
        )
        while not stopping.is_set():
            try:
                await inflight.acquire()  # room for one at least: take no more than fits
                inflight.release()
                msgs = await window.fetch(batch=max(1, room - self.busy), timeout=lane.poll)
                starting: list[asyncio.Event] = []
                for msg, screened, key in self._in_run_order(msgs):
                    count_redelivery(msg, "intake")
                    await inflight.acquire()
                    progress = None
                    if screened is None or screened.rejected is not None:
                        # Refused by its bytes alone: at once, never behind the messages about
                        # the same run (it changes nothing about it).
                        key, prev = f"refused:{id(msg)}", None
                    else:
                        prev = tails.get(key)
                        if screened.inbox is not None and screened.inbox.kind in STARTS:
                            _waited(lane, msg)
                            if prev is None:  # handled now, not behind a message of its run
                                progress = asyncio.Event()
                                starting.append(progress)
                    self.busy += 1
                    task = asyncio.create_task(self._one(msg, prev, inflight, screened, progress))
                    tails[key] = task
                    task.add_done_callback(functools.partial(_forget, tails, key))
                await _first_writes(starting)
            except asyncio.CancelledError:
                for t in list(tails.values()):
                    t.cancel()
                await window.close()  # what it held comes back to any worker after ack_wait
                raise
            except Exception:
                log.exception("intake loop error; continuing")
                await asyncio.sleep(0.5)

    def _in_run_order(self, msgs: list[Delivery]) -> list[tuple[Delivery, Screened | None, str]]:
        """``msgs`` screened, with their order keys (``""`` for one refused by its bytes), each
        run's messages in the order the inbox stored them, in the places the batch gave that
        run (the interleaving between runs is the fetch's).

        Redeliveries come back in the order their ack waits and pauses ran out, not the one
        they were stored in: a signal handed back while its run's start was held by a worker
        that then died may come in the same batch as that start, ahead of it. Handled first,
        it would find no run and be handed back again for as long as its deliveries say
        (``Intake._not_yet``: up to 30 s after many crashes) while its run waits for it."""
        out: list[tuple[Delivery, Screened | None, str]] = []
        places: dict[str, list[int]] = {}
        for i, m in enumerate(msgs):
            sc = self._screen(m)
            key = "" if sc is None or sc.rejected is not None else self._order_key(m, sc.inbox)
            out.append((m, sc, key))
            if key:
                places.setdefault(key, []).append(i)
        for idx in places.values():
            if len(idx) > 1:
                ordered = sorted((out[i] for i in idx), key=lambda x: x[0].stream_seq)
                for i, item in zip(idx, ordered, strict=True):
                    out[i] = item
        return out

    def _order_key(self, m: Delivery, inbox: InboxSubject | None) -> str:
        """Messages about one run are handled in order (a start before its cancel); ``inbox``
        is the subject as ``screen`` parsed it. Total: whatever the message, a key (one that
        names no run is handled alone)."""
        if inbox is None:
            return m.subject
        if inbox.kind in ("start", "spawn"):
            run_id = inbox.name or (
                peek_run_id(m.data) if len(m.data) <= self.settings.max_payload else None
            )
            return f"run:{run_id}" if run_id else m.subject
        return f"run:{inbox.target}"

    def _screen(self, m: Delivery) -> Screened | None:
        """``Refusals.screen``; ``None`` when even that failed (the bytes' fault: refused)."""
        try:
            return self.intake.refusals.screen(m)
        except Exception:
            log.exception("intake: cannot screen %r", m.subject[:200])
            return None

    async def _one(
        self,
        m: Delivery,
        after: asyncio.Task[None] | None,
        inflight: asyncio.Semaphore,
        screened: Screened | None,
        progress: asyncio.Event | None = None,
    ) -> None:
        try:
            if after is not None:
                await self._wait_turn(m, after)
            if screened is None:
                raise msgspec.DecodeError("the message could not be screened")
            await self.intake.handle(m, screened, progress)
        except (msgspec.MsgspecError, RecursionError, UnicodeError) as e:
            # The bytes' fault, whatever decoder met them first: refused at once, not retried.
            log.warning("intake: %r cannot be read: %s", m.subject[:200], type(e).__name__)
            try:
                await self.intake.refusals.refuse_malformed(m, e, screened)
            except Exception:
                log.exception("intake: cannot refuse %r; will retry", m.subject[:200])
                with contextlib.suppress(Exception):
                    await m.nak(delay=1.0)
        except SojournError as e:  # broker trouble: retry the message later
            log.warning("intake: %s; will retry %r", e, m.subject[:200])
            with contextlib.suppress(Exception):
                await m.nak(delay=1.0)
        except Exception as e:
            # A bug, not the message's fault: retried (up to Settings.max_deliveries, then
            # dead-lettered), with its traceback logged once, not on every delivery.
            if times_delivered(m) <= 1:
                log.exception("intake: unexpected error on %r; will retry", m.subject[:200])
            else:
                log.warning(
                    "intake: %r failed again (delivery %d): %s: %s",
                    m.subject[:200], times_delivered(m), type(e).__name__, e,
                )  # fmt: skip
            with contextlib.suppress(Exception):
                await m.nak(delay=1.0)
        finally:
            if progress is not None:
                progress.set()
            self.busy -= 1
            inflight.release()

    async def _wait_turn(self, m: Delivery, after: asyncio.Task[None]) -> None:
        """Wait for the message before ``m`` about the same run, keeping ``m`` alive meanwhile:
        a run's messages are handled one at a time, and a long line of them (a burst of
        signals, or of malformed messages each refused in turn) must not outlast the ack wait
        of those at its end, which would be redelivered while they wait."""
        keep_alive = max(0.5, self.settings.lease_ttl / 3)
        while not after.done():
            await asyncio.wait({after}, timeout=keep_alive)
            if not after.done():
                with contextlib.suppress(Exception):
                    await m.in_progress()


async def _first_writes(starting: list[asyncio.Event]) -> None:
    """Wait until each start just handed out has its new run's first append on its way to the
    broker (or is done), at most ``FIRST_WRITE_WAIT``: the next pull request then goes out with
    those appends or after them, not before them, so a lone start's first append does not
    wait for the request's write (0.1-0.2 ms of a 1-step run on a small machine)."""
    pending = [e for e in starting if not e.is_set()]
    if not pending:
        return
    waits = [asyncio.ensure_future(e.wait()) for e in pending]
    try:
        await asyncio.wait(waits, timeout=FIRST_WRITE_WAIT)
    finally:
        for w in waits:
            w.cancel()


def _forget(tails: dict[str, asyncio.Task[None]], key: str, task: asyncio.Task[None]) -> None:
    if tails.get(key) is task:
        del tails[key]


STARTS = frozenset({"start", "spawn"})


def _waited(lane: Lane, msg: Delivery) -> None:
    """How long the start waited on its lane (``sojourn_lane_wait_seconds``)."""
    with contextlib.suppress(Exception):  # metadata a hostile message cannot have: not counted
        metrics.lane_waited(lane.priority, "start", msg.stored_at)
