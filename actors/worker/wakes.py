"""Taking wakes: which runs a worker starts activations of, from its wake consumers and its
in-process timers.

A wake names a run with work to do; a worker takes it when it has a free slot, unless the run
executes here already (then it is woken again as it rests) or another live worker's heartbeat
lists it (then the wake is handed back, to be looked at again once that worker may have let
go). A wake delivered ``max_deliveries`` times, or one naming no valid run, is dead-lettered.
An in-process timer that came due wakes its run the same way, without a wake message.
``resume_cause`` says why a run was due, for ``sojourn_resume_latency_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, LocalWake, NotADelivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.names import Names
from sojourn.broker.wake import publish_wake
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import HistoryError, InvalidName
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.priority import PRIORITIES, Priority
from sojourn.schemas.vocabulary import WaitingOn, wake_reason

from ..agents.agent import Agent
from ..core.state import RunState
from ..ops import metrics
from .dead_letters import drop_bad_wake, drop_wake
from .fairness import FairWindow
from .gate import SlotGate
from .heartbeats import Heartbeats
from .lanes import Lane
from .starts import HANDBACK_MAX_DELAY, started_by
from .tenancy import count_redelivery, times_delivered
from .timers import InProcessTimers

__all__ = ["Spawn", "WakeLoops", "agent_of", "resume_cause"]

log = logging.getLogger("sojourn.worker")

WAKE_WINDOW = 1024
"""Wakes a lane's loop reads ahead of the slots it has free, to share them fairly between the
runs' fairness keys (``FairWindow``, decision 0049). Held wakes are this worker's until it
hands them out (other workers cannot take them), so the window is kept to a few slots' worth:
a busy worker hoards at most this many of a lane's wakes."""
WAKE_WINDOW_BYTES = 2**20
WAKE_SIZE = 4096
"""What a wake is taken to weigh when the window sizes a look-ahead (a wake's body is empty;
one that is not still counts at its size)."""

ENDED_KEPT = 10_000
"""Runs that ended in this worker, remembered (the latest, at most this many) so that a wake
for one is acked at once: a timer's broker copy that fired after its in-process timer had
ended the run, a hint sent twice. The end's side jobs were done here before it counted as
ended; an activation would only load the history to find the end and do them again."""

TIMER_TRIES = 8
"""Times a due in-process timer of a run another worker holds is looked at again (every two
beat intervals) before it is left to the broker's copy."""


class Spawn(Protocol):
    """The worker's ``_spawn``: start an activation of ``run_id`` in a slot the caller holds."""

    def __call__(
        self,
        run_id: str,
        msg: Delivery,
        history: list[Decision] | None,
        consumer: str,
        agent: str | None,
        backstops: frozenset[int] = ...,
    ) -> None: ...


class WakeLoops:
    """One worker's wake loops (one per wake consumer) and its timer loop.

    ``slots`` holds a permit per run that may still start here; ``active`` is the runs
    executing here, and ``rewake`` the ones of them to wake again as they rest.
    """

    def __init__(
        self,
        *,
        names: Names,
        settings: Settings,
        broker: Callable[[], Broker],
        heartbeats: Heartbeats,
        timers: InProcessTimers,
        stopping: asyncio.Event,
        slots: SlotGate,
        active: Mapping[str, object],
        rewake: set[str],
        free_slots: Callable[[], int],
        spawn: Spawn,
    ) -> None:
        self.names = names
        self.settings = settings
        self._broker = broker
        self.heartbeats = heartbeats
        self.timers = timers
        self._stopping = stopping
        self._slots = slots
        self._active = active
        self._rewake = rewake
        self._free_slots = free_slots
        self._spawn = spawn
        self.handed_back: Counter[str] = Counter()
        """Wakes handed back because another live worker holds the run, by why it was judged
        held: ``listed`` (its beat lists the run) or ``open_step`` (it may be running the
        run's open step)."""
        self.timers_fired = 0
        """Runs woken here by their in-process timers."""
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.ended_acked = 0
        """Wakes acked at once because their run had ended here (``ENDED_KEPT``)."""

    def ended(self, run_id: str) -> None:
        """The run ended here, its end's side jobs done: a later wake for it changes nothing."""
        self._ended[run_id] = None
        self._ended.move_to_end(run_id)
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    async def wake_again(
        self, run_id: str, agent: str | None, priority: Priority, fairness: Fairness | None
    ) -> None:
        """A wake arrived while the run was executing here: publish a fresh one now that it
        rests (a wake is a hint; a spare one changes nothing), on its lane."""
        try:
            await publish_wake(
                self._broker(),
                self.names,
                run_id,
                "rewake",
                agent=agent,
                priority=priority,
                fairness=fairness,
            )
        except Exception as e:  # the watchdog re-wakes a run whose wake was lost
            log.warning("run %s: could not wake it again: %s", run_id, e)

    async def wake_loop(self, lane: Lane) -> None:
        """Take wakes from one consumer (a lane of an agent's, or the unrouted one) while slots
        are free; a slot that frees goes to the most urgent lane waiting (``SlotGate``)."""
        consumer, priority = lane.consumer, lane.priority
        # Read ahead and handed out fairly between the runs' fairness keys (decision 0049).
        sub = FairWindow(
            lane.sub,
            window=WAKE_WINDOW,
            window_bytes=WAKE_WINDOW_BYTES,
            keep_alive=max(0.5, self.settings.lease_ttl / 3),
            max_message=WAKE_SIZE,
        )
        try:
            await self._take_wakes(sub, consumer, priority, lane.poll)
        finally:
            await sub.close()  # what it held comes back to any worker after ack_wait

    async def _take_wakes(
        self, sub: FairWindow, consumer: str, priority: Priority, poll: float
    ) -> None:
        while not self._stopping.is_set():
            try:
                await self._slots.acquire(priority)
                self._slots.release()
                free = max(1, min(256, self._free_slots()))
                msgs = await sub.fetch(batch=free, timeout=poll)
                for msg in msgs:
                    count_redelivery(msg, consumer)
                    with contextlib.suppress(Exception):  # sojourn_lane_wait_seconds
                        metrics.lane_waited(priority, "wake", msg.stored_at)
                    try:
                        routed, run_id = self.names.parse_wake(msg.subject)
                    except InvalidName as e:
                        await drop_bad_wake(self._broker(), self.names, msg, e)
                        continue
                    if times_delivered(msg) >= self.settings.max_deliveries:
                        b = self._broker()
                        await drop_wake(b, self.names, self.settings, msg, run_id)
                        continue
                    if run_id in self._ended:
                        self.ended_acked += 1
                        await msg.ack()
                        continue
                    if run_id in self._active:
                        # Busy here. Handed back (kept for a crash), with growing pauses so
                        # a long activation does not spin it; and woken afresh as it rests.
                        self._rewake.add(run_id)
                        await msg.nak(delay=min(5.0, 0.25 * times_delivered(msg)))
                        continue
                    holder = self.heartbeats.holder(run_id)
                    if holder is not None:
                        await self.hand_back(msg, run_id, holder, "listed")
                        continue
                    await self._slots.acquire(priority)
                    self._spawn(run_id, msg, None, consumer, routed)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("wake loop error; continuing")
                await asyncio.sleep(0.5)

    async def hand_back(self, msg: Delivery, run_id: str, holder: str, why: str) -> None:
        """Another live worker holds the run: look again once its beats may say it let go
        (two beat intervals at first, growing with the deliveries so that a long activation
        there costs little)."""
        self.handed_back[why] += 1
        metrics.HANDED_BACK.labels(why).inc()
        log.debug("run %s: held by %s (%s); wake handed back", run_id, holder, why)
        beat = self.settings.worker_beat_interval
        n = times_delivered(msg)
        await msg.nak(delay=max(2 * beat, min(HANDBACK_MAX_DELAY, 0.25 * n)))

    async def not_served(
        self,
        wake: Delivery,
        run_id: str,
        history: list[Decision],
        consumer: str,
        agents: Collection[str],
    ) -> bool:
        """Settle a wake of a run whose agent is not one of ``agents`` (served here); True
        when it was misrouted and handed back for a worker that serves it.

        Raises:
            HistoryError: the run's first message starts no run: no worker can execute it.
        """
        if not history:  # not created (yet)
            await wake.ack()
            return False
        started = started_by(history)
        if started is None:
            # Its first message starts nothing: no intake wrote it (on a deployment without
            # authentication anyone may publish on an event subject). No worker can execute
            # it; handed back, its wake would come back for hours.
            raise HistoryError(
                f"run {run_id}: its first event message ({history[0].seq}) is not a "
                "run.started.v1 naming an agent: the run cannot be executed",
                run_id=run_id,
                seq=history[0].seq,
            )
        if consumer in {self.names.agent_wake_consumer(a, p) for a in agents for p in PRIORITIES}:
            # Routed to an agent that is not the run's (only a stranger publishes such a wake):
            # no worker pulling this consumer serves the run. Woken where it is served, rather
            # than handed back here for hours.
            await publish_wake(self._broker(), self.names, run_id, "rewake", agent=started)
            await wake.ack()
            return False
        # Not ours: leave it for a worker that serves it.
        metrics.MISROUTED_WAKES.labels(consumer or "?").inc()
        await wake.nak(delay=min(HANDBACK_MAX_DELAY, float(times_delivered(wake))))
        return True

    async def timer_loop(self) -> None:
        """Wake the runs whose in-process timers came due, as slots free up, without a wake
        message. A run executing here is woken again as it rests; one another live worker
        holds is looked at again a little later, a few times, and then left to the broker's
        copy of its timer."""
        beat = self.settings.worker_beat_interval
        while not self._stopping.is_set():
            try:
                timer = await self.timers.due()
                run_id = timer.run_id
                if run_id in self._active:
                    self._rewake.add(run_id)
                    continue
                if self.heartbeats.holder(run_id) is not None:
                    if timer.tries < TIMER_TRIES:
                        self.timers.put_back(timer, 2 * beat)
                    continue
                await self._slots.acquire()
                if self._stopping.is_set() or run_id in self._active:
                    self._slots.release()
                    if run_id in self._active:
                        self._rewake.add(run_id)
                    continue
                wake = LocalWake(
                    self.names.wake(run_id, timer.agent), {h.WAKE_REASON: wake_reason("timer")}
                )
                metrics.IN_PROCESS_TIMERS_FIRED.inc()
                self.timers_fired += 1
                backstops = frozenset({timer.position})
                kept = list(timer.history) if timer.history else None
                self._spawn(run_id, wake, kept, "timer", timer.agent, backstops)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer loop error; continuing")
                await asyncio.sleep(0.5)


def resume_cause(st: RunState, wake: Delivery, cause: str, now: float) -> tuple[str, float]:
    """Why the run was due, and how long ago (``now``: the runs' clock): a timer's deadline,
    a signal's arrival, or (for a plain wake or a new run) when its message was published."""
    if cause != "start" and st.status == "waiting":
        if st.deadline is not None and st.deadline <= now:
            return "timer", now - st.deadline
        on = (WaitingOn.parse(w) for w in st.waiting_on)
        wanted = {w.target for w in on if w.kind == "signal"}
        for sig in st.signals:
            if sig.name in wanted:
                return "signal", max(0.0, now - sig.at)
    try:
        published = wake.stored_at
    except NotADelivery:
        return cause, 0.0
    return cause, max(0.0, now - published)


def agent_of(
    agents: Mapping[str, Agent[Any, Any]], history: list[Decision]
) -> Agent[Any, Any] | None:
    """The agent of ``agents`` a run's history names in its first event (its ``RunStarted``)."""
    first = history[0].events[0] if history and history[0].events else None
    name = getattr(first, "agent", None)
    return agents.get(name) if isinstance(name, str) else None
