"""The worker host: takes triggers and wakes from JetStream and executes runs.

Durable pull consumers feed it: ``intake`` (the inbox: starts, cancels, signals), one
``wake-<agent>`` per agent it serves (the wakes of that agent's runs, so it never receives a wake
it would have to hand back) and ``workers`` (wakes that name no agent). For each wake of a run no
other live worker holds, it loads and folds the history and runs an ``Activation``, keeping the
wake's ack deadline alive; its heartbeat lists the run meanwhile, which is all it writes to hold
it. When a worker's heartbeats stop, the others wake its runs, which continue from their last
recorded event (docs/decisions/0018-claims-without-lease-writes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, ConnectOptions, PullConsumer
from sojourn.broker.delivery import Delivery, LocalWake, NotADelivery
from sojourn.broker.eventstore import DEFAULT_CACHE_BYTES, Decision, EventStore
from sojourn.broker.follow import read_all
from sojourn.broker.names import InboxSubject, Names
from sojourn.broker.progress import ProgressStore
from sojourn.broker.registry import AgentRecord, AgentRegistry
from sojourn.broker.topology import (
    agent_wake_consumer_config,
    check,
    ensure_topology,
    fire_consumer_config,
    retry_unsettled,
)
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_worker_beat, encode, peek_run_id
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import HistoryError, InvalidName, SojournError
from sojourn.schemas.events import RunStarted
from sojourn.schemas.health import BEAT_RUNS_MAX, ActiveRun, WedgeRecord, WorkerBeat, vouches
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import DeadLetter

from ..agents.agent import Agent
from ..agents.callbacks import CallbackKeys
from ..core.membership import Membership
from ..history.snapshots import SNAPSHOT_EVENTS, as_snapshot
from ..history.snapshots import keep as keep_snapshot
from ..ops import metrics
from .activation import Activation
from .faults import fault, pause
from .intake import HANDBACK_MAX_DELAY, Intake, Screened, dead_letter
from .interrupt import Interrupts
from .scheduler import Scheduler
from .sticky import STICKY_RUNS, StickyRuns
from .tenancy import Tenancy, held_step, times_delivered
from .timers import InProcessTimers

__all__ = ["Worker"]

log = logging.getLogger("sojourn.worker")

FAILURES_KEPT = 10_000
"""Runs whose recent activation failures a worker remembers (the oldest are forgotten: a run
another worker finished, or that never came back here, must not stay in memory forever)."""

TIMER_TRIES = 8
"""Times a due in-process timer of a run another worker holds is looked at again (every two
beat intervals) before it is left to the broker's copy."""

HISTORY_CACHE_MIN = 16
"""Histories shorter than this are read again on every wake (a few messages: < 1 ms)."""

HELD_TRIGGERS_MAX = 64
"""Inbox messages a worker keeps unacknowledged while it runs the runs they created. Beyond
it a new run is acked and woken instead (one wake more): the intake consumer's unacked
messages stay bounded, so starts, signals and cancels keep flowing however many runs execute
and however long their steps take."""

BEAT_TTL = "24h"
"""How long the broker keeps a worker's last heartbeat (the watchdog forgets it after 1 h)."""


class Worker:
    """Serves a set of agents.

    Args:
        agents: the agents this worker executes (explicit registration; no globals).
        nats: server URL (default ``$SOJOURN_NATS_URL`` or ``nats://127.0.0.1:4222``), or
            ``ConnectOptions`` (credentials, TLS).
        settings: deployment settings; every worker and client of a deployment uses the same.
        concurrency: how many runs this worker executes at once (at most
            ``BEAT_RUNS_MAX``, 4,096: its heartbeat lists them all).
        worker_id: stable name for logs and heartbeats (default ``host-pid-random``).
        history_cache: decisions of recently used run histories kept in memory (all runs
            together, histories of at least ``HISTORY_CACHE_MIN`` decisions only), so that
            waking a long-lived run reads only what was appended since; 0 disables.
        history_cache_bytes: the same cache's bound in stored bytes (default 64 MiB), so a
            few runs with large outputs cannot make it hold gigabytes.
        sticky_runs: parked runs whose activation this worker keeps resting in its wait
            (default 2,000; 0 disables), so that their next wake here goes on from there
            without loading, folding or replaying their history (docs/decisions/
            0021-sticky-activations-and-fold-snapshots.md). The least recently parked are
            discarded first; a kept run holds no slot and is not listed as held.
        callback_keys: the keyring that signs ``ctx.callback`` tokens (default: the key file
            ``$SOJOURN_CALLBACK_KEYS`` names, read here, so a bad file fails the worker at
            construction; none when it is unset: ``ctx.callback`` then raises
            ``CallbackKeysMissing``). The HTTP gateway verifies with the same keys.

    Example:
        >>> async def main():                                   # doctest: +SKIP
        ...     async with Worker([greeter]) as w:
        ...         await w.wait_closed()
    """

    def __init__(
        self,
        agents: Iterable[Agent[Any, Any]],
        *,
        nats: str | ConnectOptions | None = None,
        broker: Broker | None = None,
        settings: Settings | None = None,
        concurrency: int = 256,
        worker_id: str | None = None,
        flush_delay: float = 0.02,
        history_cache: int = 10_000,
        history_cache_bytes: int = DEFAULT_CACHE_BYTES,
        sticky_runs: int = STICKY_RUNS,
        callback_keys: CallbackKeys | None = None,
    ) -> None:
        self.agents: dict[str, Agent[Any, Any]] = {}
        for a in agents:
            if a.name in self.agents and self.agents[a.name] is not a:
                raise ValueError(f"two different agents are named '{a.name}'")
            self.agents[a.name] = a
        if not self.agents:
            raise ValueError("a Worker needs at least one agent")
        self.settings = settings or Settings()
        self.names = Names(self.settings.prefix)
        if not 0 < concurrency <= BEAT_RUNS_MAX:
            # A heartbeat lists every run its worker executes: what it does not list, the
            # worker does not hold (other workers rely on that).
            raise ValueError(
                f"concurrency must be between 1 and {BEAT_RUNS_MAX}, not {concurrency}"
            )
        self.concurrency = concurrency
        self.flush_delay = flush_delay
        self.history_cache = history_cache
        self.history_cache_bytes = history_cache_bytes
        self.sticky: StickyRuns[Activation] = StickyRuns(sticky_runs)
        """Activations of parked runs kept resting in their waits (``worker/sticky.py``)."""
        self.folds = 0
        """Activations built from a (loaded, folded) history, as opposed to kept ones
        resumed (``sticky.resumed``)."""
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._url = nats
        self._broker = broker
        self._owns_broker = broker is None
        self._tasks: list[asyncio.Task[None]] = []
        self._active: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        self._activation_ids = itertools.count(1)
        self.activations_completed = 0
        self.started_at = time.time()
        self._failures = FailureCounts(FAILURES_KEPT)
        self._rewake: set[str] = set()
        self._holding: set[str] = set()
        """Runs executing here whose creating inbox message this worker holds (settled when
        the run rests; at most ``HELD_TRIGGERS_MAX``)."""
        self._run_agents: dict[str, str] = {}
        """The agent of each run executing here, once its history is loaded (to route the
        wake published again when a run rests)."""
        self.membership = Membership(self.settings.worker_dead_after)
        """Which workers are alive, and which runs they hold, from their heartbeats."""
        self._looked_at = 0.0
        self._beaten_at = 0.0
        """When this worker's own last heartbeat was stored (monotonic)."""
        self._since: dict[str, float] = {}
        """When each activation executing here began (wall clock), as the beats list it."""
        self.timers_fired = 0
        """Runs woken here by their in-process timers."""
        self._beating = True
        """Heartbeats go on until the last activation of a stopping worker has ended."""
        self.timers = InProcessTimers(self.settings.timer_backstop)
        """Timers of the runs this worker parked, kept in process (the broker's copies fire
        ``timer_backstop`` later, should this worker be gone)."""
        self.handed_back: Counter[str] = Counter()
        """Wakes handed back because another live worker holds the run, by why it was judged
        held: ``listed`` (its beat lists the run) or ``open_step`` (it may be running the
        run's open step)."""
        self.misrouted = 0
        """Wakes taken for runs of agents this worker does not serve (and handed back)."""
        self._background: set[asyncio.Task[None]] = set()
        self.interrupts = Interrupts(self.names)
        """The runs executing here, for the intake's interrupt notices (a cancel)."""
        self.callback_keys = callback_keys if callback_keys is not None else CallbackKeys.from_env()
        """Signs the ``ctx.callback`` tokens of the runs executing here."""

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Worker:
        if self._broker is None:
            self._broker = await Broker.connect(self._url, name=f"sojourn-worker {self.worker_id}")
        b = self._broker
        await ensure_topology(b, self.names, self.settings)
        self.store = EventStore(
            b,
            self.names,
            self.settings,
            cache_decisions=self.history_cache,
            cache_bytes=self.history_cache_bytes,
            cache_min=HISTORY_CACHE_MIN,
            snapshot_weight=SNAPSHOT_EVENTS if self.history_cache > 0 else 0,
        )
        self.reports = ProgressStore(b, self.names, worker=self.worker_id)
        self.registry = AgentRegistry(b, self.names)
        for a in self.agents.values():
            record = AgentRecord(name=a.name, input_schema=a.input_schema(), code_version=a.version)
            await retry_unsettled(functools.partial(self.registry.register, record))
        self.intake = Intake(
            broker=b,
            store=self.store,
            names=self.names,
            settings=self.settings,
            registry=self.registry,
            agents=self.agents,
            writer=f"intake:{self.worker_id}",
            on_created=self._run_new,
        )
        self.scheduler = Scheduler(
            broker=b,
            names=self.names,
            settings=self.settings,
            intake=self.intake,
            registry=self.registry,
            agents=self.agents,
            run_new=self._run_new,
            held=self._held,
        )
        self.intake.schedules = self.scheduler
        intake_sub = await b.pull(self.names.inbox_stream, self.names.intake_consumer)
        wake_subs = {
            self.names.wake_consumer: await b.pull(self.names.wake_stream, self.names.wake_consumer)
        }
        pause("agent_consumers")
        for name in sorted(self.agents):
            config = agent_wake_consumer_config(self.names, self.settings, name)
            ensure = functools.partial(b.ensure_consumer, self.names.wake_stream, config)
            check(self.names, [await retry_unsettled(ensure)])
            consumer = config["durable_name"]
            wake_subs[consumer] = await b.pull(self.names.wake_stream, consumer)
        fire_subs: dict[str, PullConsumer] = {}
        for name in sorted(self.agents):
            config = fire_consumer_config(self.names, self.settings, name)
            ensure = functools.partial(b.ensure_consumer, self.names.schedules_stream, config)
            check(self.names, [await retry_unsettled(ensure)])
            fire_subs[name] = await b.pull(self.names.schedules_stream, config["durable_name"])
        await self.interrupts.subscribe(b)
        await retry_unsettled(self._beat)
        await retry_unsettled(self._look_at_workers)
        self._tasks = [
            asyncio.create_task(self._intake_loop(intake_sub), name="sojourn-intake"),
            *(
                asyncio.create_task(self._wake_loop(sub, consumer), name=f"sojourn-{consumer}")
                for consumer, sub in wake_subs.items()
            ),
            *(
                asyncio.create_task(
                    self.scheduler.fire_loop(sub, agent, self._stopping),
                    name=f"sojourn-fires-{agent}",
                )
                for agent, sub in fire_subs.items()
            ),
            asyncio.create_task(self._heartbeat_loop(), name="sojourn-heartbeat"),
            asyncio.create_task(self._timer_loop(), name="sojourn-timers"),
            asyncio.create_task(self._membership_loop(), name="sojourn-membership"),
        ]
        metrics.track_worker(self)
        log.info("worker %s serving %s on %s", self.worker_id, sorted(self.agents), b.url)
        return self

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking work, let running activations finish for ``grace`` seconds, then cancel
        the rest (their runs are resumed elsewhere from their last recorded event)."""
        if self._stopping.is_set():
            await self._closed.wait()
            return
        self._stopping.set()
        self.timers.close()  # the broker's copies fire instead
        await self.sticky.close(grace)  # their next wakes activate them anywhere
        # Beats go on while the activations finish: without them, the others would count
        # this worker dead and run its runs while they still execute here.
        beating = [t for t in self._tasks if t.get_name() == "sojourn-heartbeat"]
        taking = [t for t in self._tasks if t not in beating]
        for t in taking:
            t.cancel()
        await _settle(taking, grace)
        active = list(self._active.values())
        if active:
            _, still = await asyncio.wait(active, timeout=grace)
            for t in still:
                t.cancel()
            await _settle(still, grace)
        await self.sticky.close(grace)  # any that parked while the worker was stopping
        self._beating = False
        await self.interrupts.close()
        for t in beating:
            t.cancel()
        await _settle(beating, grace)
        metrics.track_worker(self, on=False)
        if self._broker is not None and self._broker.connected:
            # A graceful stop: not "down". Not sent while the server is gone (it would wait
            # for its ack timeout), and bounded when a server does not answer: a stop must end
            # within a couple of seconds whatever the server's state.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._beat(stopped=True)
        if self._owns_broker and self._broker is not None:
            await self._broker.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> Worker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- heartbeats --------------------------------------------------------------------------

    async def _beat(self, stopped: bool = False) -> None:
        runs = tuple(
            ActiveRun(run_id, self._run_agents.get(run_id, ""), self._since.get(run_id, 0.0))
            for run_id in itertools.islice(self._active, BEAT_RUNS_MAX)
        )
        beat = WorkerBeat(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            agents=tuple(sorted(self.agents)),
            active=len(self._active),
            capacity=self.concurrency,
            started_at=self.started_at,
            at=time.time(),
            interval=self.settings.worker_beat_interval,
            stopped=stopped,
            runs=() if stopped else runs,
        )
        await self._broker_or_fail().publish(
            self.names.worker(self.worker_id), encode(beat), {h.TTL: BEAT_TTL}
        )
        self._beaten_at = time.monotonic()

    async def _heartbeat_loop(self) -> None:
        """The worker's heartbeat: one write per interval, listing the runs it executes; while
        it goes on, no other worker executes them (however long they take)."""
        while self._beating:
            await asyncio.sleep(self.settings.worker_beat_interval)
            try:
                await self._beat()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("heartbeat failed: %s", e)

    async def _look_at_workers(self) -> None:
        """Read every worker's heartbeat and judge who is alive (``Membership``)."""
        b = self._broker_or_fail()
        beats: list[tuple[int, WorkerBeat]] = []
        for m in await read_all(b, self.names.health_stream, self.names.workers_all):
            with contextlib.suppress(msgspec.MsgspecError, InvalidName):  # any other shape
                beats.append((m.seq, _checked_beat(decode_worker_beat(m.data))))
        now = time.monotonic()
        blind = self.settings.worker_dead_after / 2
        if (self._looked_at and now - self._looked_at > blind) or now - self._beaten_at > blind:
            # Blind for a while (this connection, or the broker, was down: no worker could
            # heartbeat either), or this worker cannot heartbeat itself (on a cluster, the
            # health stream may be electing a leader while its replicas still answer reads):
            # the others' silence is not their fault.
            self.membership.resume(now)
        self._looked_at = now
        for dead in self.membership.observe(beats, now, time.time()):
            if dead.worker_id != self.worker_id:
                await self._take_over(dead)

    async def _membership_loop(self) -> None:
        """Watch the other workers; when one dies, wake its runs at once (``_take_over``)."""
        while not self._stopping.is_set():
            await asyncio.sleep(self.settings.worker_beat_interval)
            try:
                await self._look_at_workers()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("reading worker heartbeats failed: %s", e)

    async def _take_over(self, dead: WorkerBeat) -> None:
        """A worker died (its beats stopped): wake the runs it was executing, of the agents
        served here, so they resume now rather than when their wakes' ack deadline passes.
        Every surviving worker does it; the wakes' Msg-Id makes them one."""
        mine = [r for r in dead.runs if r.agent in self.agents]
        if not mine:
            return
        log.warning(
            "worker %s is silent (no heartbeat for %.1fs): waking %d of its runs",
            dead.worker_id, self.settings.worker_dead_after, len(mine),
        )  # fmt: skip
        b = self._broker_or_fail()
        incarnation = f"{dead.worker_id}:{dead.started_at:.6f}"
        for r in mine:
            await b.publish(
                self.names.wake(r.run_id, r.agent),
                b"",
                {h.WAKE_REASON: "takeover", h.MSG_ID: f"takeover:{incarnation}:{r.run_id}"},
            )
        metrics.TAKEOVERS.inc(len(mine))

    def _held(self, run_id: str) -> bool:
        """Whether ``run_id`` executes here or a live other worker's last beat lists it."""
        if run_id in self._active:
            return True
        return self.membership.holder(run_id, besides=self.worker_id) is not None

    # --- loops -------------------------------------------------------------------------------

    async def _intake_loop(self, sub: PullConsumer) -> None:
        """Fetch inbox messages and handle them concurrently; messages about the same run
        (same subject) are handled in arrival order."""
        inflight = asyncio.Semaphore(64)
        tails: dict[str, asyncio.Task[None]] = {}
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(batch=64, timeout=1.0)
                for msg in msgs:
                    _count_redelivery(msg, "intake")
                    await inflight.acquire()
                    screened = self._screen(msg)
                    if screened is None or screened.rejected is not None:
                        # Refused by its bytes alone: at once, never behind the messages about
                        # the same run (it changes nothing about it).
                        key, prev = f"refused:{id(msg)}", None
                    else:
                        key = self._order_key(msg, screened.inbox)
                        prev = tails.get(key)
                    task = asyncio.create_task(self._intake_one(msg, prev, inflight, screened))
                    tails[key] = task
                    task.add_done_callback(functools.partial(_forget, tails, key))
            except asyncio.CancelledError:
                for t in list(tails.values()):
                    t.cancel()
                raise
            except Exception:
                log.exception("intake loop error; continuing")
                await asyncio.sleep(0.5)

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
        """``Intake.screen``; ``None`` when even that failed (the bytes' fault: refused)."""
        try:
            return self.intake.screen(m)
        except Exception:
            log.exception("intake: cannot screen %r", m.subject[:200])
            return None

    async def _intake_one(
        self,
        m: Delivery,
        after: asyncio.Task[None] | None,
        inflight: asyncio.Semaphore,
        screened: Screened | None,
    ) -> None:
        try:
            if after is not None:
                await self._wait_turn(m, after)
            if screened is None:
                raise msgspec.DecodeError("the message could not be screened")
            await self.intake.handle(m, screened)
        except (msgspec.MsgspecError, RecursionError, UnicodeError) as e:
            # The bytes' fault, whatever decoder met them first: refused at once, not retried.
            log.warning("intake: %r cannot be read: %s", m.subject[:200], type(e).__name__)
            try:
                await self.intake.refuse_malformed(m, e, screened)
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

    async def _run_new(self, run_id: str, history: list[Decision], msg: Delivery) -> bool:
        """Run a run this worker's intake just created, at once, without a wake round trip.

        The inbox message stays unacknowledged (kept alive like a wake) until the run rests;
        if this worker dies first, its redelivery makes the intake wake the run. When this
        worker already holds ``HELD_TRIGGERS_MAX`` of them, it declines: the intake acks the
        message and wakes the run.
        """
        if (
            self._stopping.is_set()
            or run_id in self._active
            or self._free_slots() <= 0
            or len(self._holding) >= HELD_TRIGGERS_MAX
        ):
            return False
        self._holding.add(run_id)
        await self._slots.acquire()
        self._spawn(run_id, msg, history, self.names.intake_consumer, self._agent_of(history))
        return True

    def _spawn(
        self,
        run_id: str,
        msg: Delivery,
        history: list[Decision] | None,
        consumer: str,
        agent: Agent[Any, Any] | str | None,
        backstops: frozenset[int] = frozenset(),
    ) -> None:
        """Start an activation; the caller holds a slot, released when it ends. The run is in
        the next heartbeat from now on (with ``agent`` if known: what a survivor's wake needs
        should this worker die), so its lease, once taken, is vouched for."""
        self._since[run_id] = time.time()
        self.timers.drop(run_id)  # the activation keeps what it still needs as it parks
        task = asyncio.create_task(
            self._activate(run_id, msg, history, consumer, backstops), name=f"run {run_id}"
        )
        if agent is not None:
            self._run_agents[run_id] = agent if isinstance(agent, str) else agent.name
        self._active[run_id] = task
        task.add_done_callback(functools.partial(self._done, run_id))

    async def _wake_loop(self, sub: PullConsumer, consumer: str) -> None:
        """Take wakes from one consumer (an agent's, or the unrouted one) while slots are free."""
        while not self._stopping.is_set():
            try:
                await self._slots.acquire()
                self._slots.release()
                free = max(1, min(256, self._free_slots()))
                msgs = await sub.fetch(batch=free, timeout=1.0)
                for msg in msgs:
                    _count_redelivery(msg, consumer)
                    try:
                        routed, run_id = self.names.parse_wake(msg.subject)
                    except InvalidName as e:
                        await self._drop_bad_wake(msg, e)
                        continue
                    if times_delivered(msg) >= self.settings.max_deliveries:
                        await self._drop_wake(msg, run_id)
                        continue
                    if run_id in self._active:
                        # Busy here. Handed back (kept for a crash), with growing pauses so
                        # a long activation does not spin it; and woken afresh as it rests.
                        self._rewake.add(run_id)
                        await msg.nak(delay=min(5.0, 0.25 * times_delivered(msg)))
                        continue
                    holder = self.membership.holder(run_id, besides=self.worker_id)
                    if holder is not None:
                        await self._hand_back(msg, run_id, holder, "listed")
                        continue
                    await self._slots.acquire()
                    self._spawn(run_id, msg, None, consumer, routed)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("wake loop error; continuing")
                await asyncio.sleep(0.5)

    async def _hand_back(self, msg: Delivery, run_id: str, holder: str, why: str) -> None:
        """Another live worker holds the run: look again once its beats may say it let go
        (two beat intervals at first, growing with the deliveries so that a long activation
        there costs little)."""
        self.handed_back[why] += 1
        metrics.HANDED_BACK.labels(why).inc()
        log.debug("run %s: held by %s (%s); wake handed back", run_id, holder, why)
        beat = self.settings.worker_beat_interval
        n = times_delivered(msg)
        await msg.nak(delay=max(2 * beat, min(HANDBACK_MAX_DELAY, 0.25 * n)))

    async def _held_step(self, run_id: str, history: list[Decision]) -> str | None:
        """The worker that may still be executing the run's open step (one started and never
        ended, by an activation of another worker that is alive and whose beats list the run or
        predate the step), if any. Settling such a step as in doubt would run it twice."""
        held = held_step(history)
        if held is None:
            return None
        worker, since = held
        if worker == self.worker_id or not worker:
            return None
        judged = self.membership.may_hold(worker, run_id, since)
        if judged is None:  # a worker this one has not seen yet: ask the broker
            try:
                m = await self._broker_or_fail().direct_get_last(
                    self.names.health_stream, self.names.worker(worker)
                )
            except InvalidName:
                return None
            beat = None
            if m is not None:
                with contextlib.suppress(msgspec.DecodeError):
                    beat = decode_worker_beat(m.data)
            fresh = beat is not None and time.time() - beat.at < self.settings.worker_dead_after
            judged = fresh and vouches(beat, run_id, since)
        return worker if judged else None

    async def _timer_loop(self) -> None:
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
                if self.membership.holder(run_id, besides=self.worker_id) is not None:
                    if timer.tries < TIMER_TRIES:
                        self.timers.put_back(timer, 2 * beat)
                    continue
                await self._slots.acquire()
                if self._stopping.is_set() or run_id in self._active:
                    self._slots.release()
                    if run_id in self._active:
                        self._rewake.add(run_id)
                    continue
                wake = LocalWake(self.names.wake(run_id, timer.agent), {h.WAKE_REASON: "timer"})
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

    def _free_slots(self) -> int:
        return self.concurrency - len(self._active)

    def _done(self, run_id: str, _task: object = None) -> None:
        self._active.pop(run_id, None)
        self._since.pop(run_id, None)
        self._holding.discard(run_id)
        agent = self._run_agents.pop(run_id, None)
        self._slots.release()
        if run_id in self._rewake and not self._stopping.is_set():
            self._rewake.discard(run_id)
            task = asyncio.create_task(self._wake_again(run_id, agent))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _wake_again(self, run_id: str, agent: str | None) -> None:
        """A wake arrived while the run was executing here: publish a fresh one now that it
        rests (a wake is a hint; a spare one changes nothing)."""
        try:
            await publish_wake(self._broker_or_fail(), self.names, run_id, "rewake", agent=agent)
        except Exception as e:  # the watchdog re-wakes a run whose wake was lost
            log.warning("run %s: could not wake it again: %s", run_id, e)

    async def _drop_wake(self, msg: Delivery, run_id: str) -> None:
        """A wake delivered ``max_deliveries`` times is given up (dead-lettered, not retried
        forever); a run left waiting for it is flagged and re-woken by the watchdog."""
        reason = (
            f"wake for run {run_id} delivered {times_delivered(msg)} times without being settled "
            f"(Settings.max_deliveries = {self.settings.max_deliveries})"
        )
        log.error("%s; dead-lettered", reason)
        b = self._broker_or_fail()
        record = dead_letter(
            msg, "other", "max_deliveries", reason, limit=b.max_payload or (1024 * 1024)
        )
        await b.publish(self.names.dlq("other"), encode(record))
        metrics.DEAD_LETTERS.labels("max_deliveries").inc()
        await msg.ack()

    async def _drop_bad_wake(self, msg: Delivery, error: InvalidName) -> None:
        """A message on a wake subject that names no valid run (only a deployment without
        authentication lets anyone publish there): dead-lettered, never executed."""
        log.error("dropped a wake on %r: %s", msg.subject[:200], error)
        b = self._broker_or_fail()
        record = dead_letter(
            msg, "other", "invalid_run_id", str(error), limit=b.max_payload or (1024 * 1024)
        )
        await b.publish(self.names.dlq("other"), encode(record))
        metrics.DEAD_LETTERS.labels("invalid_run_id").inc()
        await msg.ack()

    # --- one activation ----------------------------------------------------------------------

    async def _activate(
        self,
        run_id: str,
        wake: Delivery,
        history: list[Decision] | None = None,
        consumer: str = "",
        backstops: frozenset[int] = frozenset(),
    ) -> None:
        """Execute ``run_id`` until it rests. ``wake`` is the message that asked for it (a wake,
        or the trigger that created the run, whose ``history`` is then given); it is settled
        when we are done.

        The tenancy keeps the wake alive while the run executes and records what its steps
        report; the run is held by this worker's heartbeats meanwhile (it is in ``_active``).
        """
        writer = f"{self.worker_id}.{next(self._activation_ids)}"
        since = self._since.get(run_id) or time.time()
        async with Tenancy(
            self.reports, run_id, writer, wake, period=self.settings.heartbeat_every, since=since
        ) as tenancy:
            await self._execute(tenancy, history, consumer, backstops)

    async def _execute(
        self,
        tenancy: Tenancy,
        history: list[Decision] | None,
        consumer: str = "",
        backstops: frozenset[int] = frozenset(),
    ) -> None:
        """Load (unless the run is new), run the activation and settle the wake: acked when the
        run rests, handed back on trouble, given up on a poison.

        ``history`` is the whole history of a run the intake just created, or what an
        in-process timer kept of it (``backstops`` set): then only what came after is read.
        """
        run_id, wake = tenancy.run_id, tenancy.delivery
        agent_name = "unknown"
        new = history is not None and not backstops
        cause = "start" if new else "wake"
        act: Activation | None = None
        try:
            if history is None and wake.header(h.SCHEDULER):
                fault("timer_wake")
            act = None if new else await self._resume_kept(tenancy, backstops)
            if act is None:
                act = await self._prepare(tenancy, history, consumer, backstops)
                if act is None:
                    return
            agent_name = act.metric_agent
            self._run_agents[run_id] = act.agent.name
            cause, late = _resume_cause(act, wake, cause)
            metrics.RESUME_LATENCY.labels(agent_name, cause).observe(late)
            with self.interrupts.track(run_id, act):
                outcome = await act.run()
            self._keep(run_id, act)
            fault("before_ack")
            log.debug("run %s: %s", run_id, outcome)
            self.activations_completed += 1
            self._failures.clear(run_id)
            metrics.ACTIVATIONS.labels(agent_name, outcome).inc()
            if outcome in ("completed", "failed", "cancelled"):
                self.store.forget(run_id)
                if act.state.schedule is not None and act.state.continued_as is None:
                    metrics.schedule_run_ended(act.state.schedule, outcome)
                    self.scheduler.run_ended(run_id)
            if outcome == "fenced" or act.fenced:
                # Another worker owns the run now, through a redelivery of this very message.
                # JetStream takes an ack from any delivery, so acking ours would settle the
                # new owner's too: if it then died, nothing would ever wake the run again.
                return
            await wake.ack()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await wake.nak()
            raise
        except HistoryError as e:
            # A poison message: retrying cannot help. Keep a record and stop waking the run.
            log.error("run %s: %s", run_id, e)
            metrics.ACTIVATIONS.labels(agent_name, "wedged").inc()
            with contextlib.suppress(Exception):
                await self._give_up(run_id, "poison", e.message, e.seq or 0, permanent=True)
                await wake.ack()
        except Exception as e:
            failures = self._failures.add(run_id)
            if failures >= self.settings.max_activation_failures:
                log.error(
                    "run %s: activation failed %d times in a row (%s: %s); giving up: the "
                    "run is wedged until its history changes",
                    run_id, failures, type(e).__name__, e,
                )  # fmt: skip
                metrics.ACTIVATIONS.labels(agent_name, "wedged").inc()
                self._failures.clear(run_id)
                with contextlib.suppress(Exception):
                    seq = act.last_seq if act is not None else 0
                    text = f"{failures} activations failed, the last with {type(e).__name__}: {e}"
                    await self._give_up(run_id, "max_deliveries", text, seq)
                    await wake.ack()
                return
            log.warning(
                "run %s: activation error %s: %s; retrying later", run_id, type(e).__name__, e
            )
            metrics.ACTIVATIONS.labels(agent_name, "error").inc()
            with contextlib.suppress(Exception):
                await wake.nak(delay=1.0)

    async def _prepare(
        self,
        tenancy: Tenancy,
        history: list[Decision] | None,
        consumer: str,
        backstops: frozenset[int],
    ) -> Activation | None:
        """The activation of a run from its history: loaded (unless the run is new) and
        folded from the history cache's snapshot of it. ``None``: the wake was settled or
        handed back (another worker may run the open step; not an agent served here)."""
        run_id, wake = tenancy.run_id, tenancy.delivery
        snapshot = None
        if history is None or backstops:
            t0 = time.perf_counter()
            if history:  # kept by the timer: read only what came after
                history = history + await self.store.load(run_id, after_seq=history[-1].seq)
            else:
                history = await self.store.history(run_id)
                snapshot = as_snapshot(self.store.snapshot(run_id))
            loaded: float | None = time.perf_counter() - t0
            holder = await self._held_step(run_id, history)
            if holder is not None:
                await self._hand_back(wake, run_id, holder, "open_step")
                return None
        else:
            loaded = None
        agent = self._agent_of(history)
        if agent is None:
            if not history:  # not created (yet)
                await wake.ack()
                return None
            started = _started_by(history)
            if started is None:
                # Its first message starts nothing: no intake wrote it (on a deployment
                # without authentication anyone may publish on an event subject). No worker
                # can execute it; handed back, its wake would come back for hours.
                raise HistoryError(
                    f"run {run_id}: its first event message ({history[0].seq}) is not a "
                    "run.started.v1 naming an agent: the run cannot be executed",
                    run_id=run_id,
                    seq=history[0].seq,
                )
            if consumer in {self.names.agent_wake_consumer(a) for a in self.agents}:
                # Routed to an agent that is not the run's (only a stranger publishes such a
                # wake): no worker pulling this consumer serves the run. Woken where it is
                # served, rather than handed back here for hours.
                await publish_wake(
                    self._broker_or_fail(), self.names, run_id, "rewake", agent=started
                )
                await wake.ack()
                return None
            # Not ours: leave it for a worker that serves it.
            self.misrouted += 1
            metrics.MISROUTED_WAKES.labels(consumer or "?").inc()
            await wake.nak(delay=min(HANDBACK_MAX_DELAY, float(times_delivered(wake))))
            return None
        agent_name = metrics.agent_label(agent.name)
        t0 = time.perf_counter()
        act = Activation(
            agent=agent,
            run_id=run_id,
            store=self.store,
            history=history,
            writer=tenancy.owner,
            flush_delay=self.flush_delay,
            progress=tenancy.progress,
            heartbeat=tenancy.heartbeat,
            keep_timer=functools.partial(self.timers.keep, run_id, agent.name),
            backstops=backstops,
            keep_run=self._may_keep if self.sticky.limit > 0 else None,
            snapshot=snapshot,
            callback_keys=self.callback_keys,
        )
        self.folds += 1
        keep_snapshot(self.store, run_id, act.snapshot)
        if loaded is not None:
            metrics.HISTORY_LOAD_SECONDS.labels(agent_name).observe(loaded)
            metrics.FOLD_SECONDS.labels(agent_name).observe(time.perf_counter() - t0)
        return act

    async def _resume_kept(self, tenancy: Tenancy, backstops: frozenset[int]) -> Activation | None:
        """The run's activation kept here resting in a wait (``worker/sticky.py``), resumed with
        what was appended since it parked, if that is only signals; ``None`` (and the kept
        copy discarded) otherwise: the run is activated from its history."""
        run_id = tenancy.run_id
        act = self.sticky.take(run_id)
        if act is None:
            return None
        try:
            newer = await self.store.load(run_id, after_seq=act.last_seq)
        except BaseException:
            self.sticky.discard(act, "error")
            raise
        if not act.resume_with(newer):
            self.sticky.discard(act, "changed")
            return None
        act.rebind(
            writer=tenancy.owner,
            progress=tenancy.progress,
            heartbeat=tenancy.heartbeat,
            backstops=backstops,
        )
        self.sticky.resumed_one()
        return act

    def _may_keep(self) -> bool:
        """Whether an activation that parks may rest in its wait to be kept here."""
        return self.sticky.enabled and not self._stopping.is_set()

    def _keep(self, run_id: str, act: Activation) -> None:
        """An activation ended its turn: keep it if its code rests in a wait (``keep``
        discards it instead when the worker stops or keeps none)."""
        if act.resting:
            self.sticky.keep(run_id, act)

    async def _give_up(
        self, run_id: str, code: str, reason: str, seq: int, *, permanent: bool = False
    ) -> None:
        """Stop retrying a run: mark it wedged (the watchdog reports it) and keep a
        dead-letter record for operators."""
        now = time.time()
        b = self._broker_or_fail()
        wedge = WedgeRecord(
            run_id=run_id, code=code, reason=reason, seq=seq, permanent=permanent, at=now
        )
        await b.publish(self.names.wedge(run_id), encode(wedge))
        record = DeadLetter(
            code=code,
            message=reason,
            subject=self.names.events(run_id),
            data=b"",
            rejected_at=now,
            inbox_seq=seq,
        )
        await b.publish(self.names.dlq("other"), encode(record))
        metrics.DEAD_LETTERS.labels(code).inc()

    def _broker_or_fail(self) -> Broker:
        assert self._broker is not None
        return self._broker

    def _agent_of(self, history: list[Decision]) -> Agent[Any, Any] | None:
        first = history[0].events[0] if history and history[0].events else None
        name = getattr(first, "agent", None)
        return self.agents.get(name) if isinstance(name, str) else None


async def _settle(tasks: Iterable[asyncio.Task[Any]], grace: float) -> None:
    """Wait for cancelled tasks to end, at most ``grace`` seconds: a cancel can be swallowed
    inside a library (``asyncio.wait_for`` in Python 3.11 may return a result that raced it),
    and a stop must not wait forever for such a task. One still running is logged and left."""
    pending = [t for t in tasks if not t.done()]
    if not pending:
        return
    _, still = await asyncio.wait(pending, timeout=grace)
    for t in still:
        log.warning("task %s did not end within %.0fs of being cancelled", t.get_name(), grace)
    for t in pending:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: not reported as never retrieved


class FailureCounts:
    """Consecutive failed activations per run, for at most ``limit`` runs: the runs failed
    longest ago are forgotten, so runs another worker finished, or that never came back here,
    do not stay in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: OrderedDict[str, int] = OrderedDict()

    def add(self, run_id: str) -> int:
        """Count one more failure of ``run_id``; return its count."""
        n = self._counts.pop(run_id, 0) + 1
        self._counts[run_id] = n  # most recent last
        while len(self._counts) > self.limit:
            self._counts.popitem(last=False)
        return n

    def clear(self, run_id: str) -> None:
        self._counts.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._counts)


def _count_redelivery(msg: Delivery, consumer: str) -> None:
    with contextlib.suppress(NotADelivery):
        if msg.num_delivered > 1:
            metrics.REDELIVERIES.labels(consumer).inc()


def _resume_cause(act: Activation, wake: Delivery, cause: str) -> tuple[str, float]:
    """Why the run was due, and how long ago: a timer's deadline, a signal's arrival, or
    (for a plain wake or a new run) when its message was published."""
    now = time.time()
    st = act.state
    if cause != "start" and st.status == "waiting":
        if st.deadline is not None and st.deadline <= now:
            return "timer", now - st.deadline
        wanted = {w.partition(":")[2] for w in st.waiting_on if w.startswith("signal:")}
        for sig in st.signals:
            if sig.name in wanted:
                return "signal", max(0.0, now - sig.at)
    try:
        published = wake.timestamp.timestamp()
    except NotADelivery:
        return cause, 0.0
    return cause, max(0.0, now - published)


def _checked_beat(beat: WorkerBeat) -> WorkerBeat:
    """``beat`` if every run it lists is named by tokens (what a worker writes): the runs of a
    worker that falls silent are woken by their subjects, and one that is no subject token
    (anyone may publish a beat on a deployment without authentication) would fail that wake,
    and with it the take-over of every other worker found silent in the same look.

    Raises:
        InvalidName: a run id, or an agent name other than ``""``, is not a token.
    """
    for r in beat.runs:
        validate_token(r.run_id, "run id")
        if r.agent:
            validate_token(r.agent, "agent")
    return beat


def _started_by(history: list[Decision]) -> str | None:
    """The agent a history's first event starts the run for; ``None`` when that event is not
    a ``RunStarted`` naming one (the intake writes nothing else first)."""
    first = history[0].events[0] if history and history[0].events else None
    if not isinstance(first, RunStarted):
        return None
    try:
        return validate_token(first.agent, "agent")
    except InvalidName:
        return None


def _forget(tails: dict[str, asyncio.Task[None]], key: str, task: asyncio.Task[None]) -> None:
    if tails.get(key) is task:
        del tails[key]
