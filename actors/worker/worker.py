"""The worker host: takes triggers and wakes from JetStream and executes runs.

Durable pull consumers feed it: ``intake`` (the inbox: starts, cancels, signals), one
``wake-<agent>`` per agent it serves (the wakes of that agent's runs, so it never receives a wake
it would have to hand back) and ``workers`` (wakes that name no agent). For each wake of a run no
other live worker holds, it loads and folds the history and runs an ``Activation``, keeping the
wake's ack deadline alive; its heartbeat lists the run meanwhile, which is all it writes to hold
it. When a worker's heartbeats stop, the others wake its runs, which continue from their last
recorded event (docs/decisions/0018-claims-without-lease-writes.md).

``Worker`` starts and stops the loops and executes each activation; the loops are their own:
the inbox loop (``worker/inbox.py``, handing messages to the ``Intake``), the wake and timer
loops (``worker/wakes.py``), the heartbeats and the watch on the others' (``worker/heartbeats.py``)
and the schedules' fire loops (``Scheduler``).
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
from collections.abc import Iterable, Mapping
from typing import Any

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, ConnectOptions
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import DEFAULT_CACHE_BYTES, Decision, EventStore
from sojourn.broker.names import Names
from sojourn.broker.progress import ProgressStore
from sojourn.broker.registry import AgentRecord, AgentRegistry
from sojourn.broker.tasks import reap, settle_cancelled
from sojourn.broker.topology import (
    ensure_topology,
    retry_unsettled,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import HistoryError
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.health import BEAT_RUNS_MAX
from sojourn.schemas.limits import Limit
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.vocabulary import is_terminal

from ..agents.agent import Agent
from ..agents.callbacks import CallbackKeys
from ..core.membership import Membership
from ..history.snapshots import SNAPSHOT_EVENTS, as_snapshot
from ..history.snapshots import keep as keep_snapshot
from ..ops import metrics
from .activation import Activation
from .clock import Clock
from .collector import CollectorTuning
from .dead_letters import FailureCounts, activation_failed, give_up
from .faults import fault
from .gate import SlotGate
from .heartbeats import Heartbeats
from .inbox import InboxLoop
from .intake import Intake
from .interrupt import Interrupts
from .lanes import open_lanes
from .opening import Opening
from .scheduler import Scheduler
from .sticky import STICKY_RUNS, StickyRuns
from .tasks import close_resources
from .tenancy import Tenancy
from .timers import InProcessTimers
from .wakes import WakeLoops, agent_of, resume_cause

__all__ = ["Worker"]

log = logging.getLogger("sojourn.worker")

FAILURES_KEPT = 10_000
"""Runs whose recent activation failures a worker remembers (the oldest are forgotten: a run
another worker finished, or that never came back here, must not stay in memory forever)."""


HISTORY_CACHE_MIN = 16
"""Histories shorter than this are read again on every wake (a few messages: < 1 ms)."""

HELD_TRIGGERS_MAX = 64
"""Inbox messages a worker keeps unacknowledged while it runs the runs they created. Beyond
it a new run is acked and woken instead (one wake more): the intake consumer's unacked
messages stay bounded, so starts, signals and cancels keep flowing however many runs execute
and however long their steps take."""


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
        clock: the runs' clock (``worker/clock.py``; default the real one). Under a virtual
            one (a test environment's) no wait timer is kept in process: each is the broker's.
        tune_gc: while the worker runs, Python's garbage collector makes young collections
            less often (``worker/collector.py``); ``False`` leaves the collector alone.

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
        clock: Clock | None = None,
        limits: Mapping[str, Limit] | None = None,
        tune_gc: bool = True,
    ) -> None:
        self.clock = clock or Clock()
        self._collector = CollectorTuning(tune_gc)
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
        self._limits = limits
        self.folds = 0
        """Activations built from a (loaded, folded) history, as opposed to kept ones
        resumed (``sticky.resumed``)."""
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._url = nats
        self._broker = broker
        self._owns_broker = broker is None
        self._tasks: list[asyncio.Task[None]] = []
        self._active: dict[str, asyncio.Task[None]] = {}
        self._slots = SlotGate(concurrency)
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        self._activation_ids = itertools.count(1)
        self.activations_completed = 0
        self.started_at = time.time()
        self._failures = FailureCounts(FAILURES_KEPT)
        self._rewake: set[str] = set()
        self._openings: dict[str, Opening] = {}
        """Runs opened in memory executing here, until their first append (``opening.py``)."""
        self._holding: set[str] = set()
        """Runs executing here whose creating inbox message is held (``HELD_TRIGGERS_MAX``)."""
        self._run_agents: dict[str, str] = {}
        """The agent of each run executing here, once known (routes a wake published again)."""
        self._run_lanes: dict[str, tuple[Priority, Fairness | None]] = {}
        """Each executing run's priority and fairness key, once known (its wakes' lane, key)."""
        self.membership = Membership(self.settings.worker_dead_after)
        """Which workers are alive, and which runs they hold, from their heartbeats."""
        self._since: dict[str, float] = {}
        """When each activation executing here began (wall clock), as the beats list it."""
        self.heartbeats = Heartbeats(
            worker_id=self.worker_id,
            agents=self.agents,
            concurrency=concurrency,
            started_at=self.started_at,
            names=self.names,
            settings=self.settings,
            membership=self.membership,
            broker=self._broker_or_fail,
            active=self._active,
            run_agents=self._run_agents,
            run_lanes=self._run_lanes,
            since=self._since,
        )
        """This worker's heartbeats (listing its runs) and its reading of the others'."""
        backstop = 0.0 if self.clock.virtual else self.settings.timer_backstop
        self.timers = InProcessTimers(backstop, clock=self.clock)
        """Timers of runs parked here, kept in process (``worker/timers.py``)."""
        self.wakes = WakeLoops(
            names=self.names,
            settings=self.settings,
            broker=self._broker_or_fail,
            heartbeats=self.heartbeats,
            timers=self.timers,
            stopping=self._stopping,
            slots=self._slots,
            active=self._active,
            rewake=self._rewake,
            free_slots=self._free_slots,
            spawn=self._spawn,
        )
        """Takes wakes and due in-process timers into slots (or hands them back)."""
        self.handed_back = self.wakes.handed_back
        """Wakes handed back because another live worker holds the run (``WakeLoops``)."""
        self.misrouted = 0
        """Wakes taken for runs of agents this worker does not serve (and handed back)."""
        self._background: set[asyncio.Task[None]] = set()
        self.interrupts = Interrupts(self.names)
        """The runs executing here, for the intake's interrupt notices (a cancel)."""
        self.callback_keys = callback_keys if callback_keys is not None else CallbackKeys.from_env()
        """Signs the ``ctx.callback`` tokens of the runs executing here."""

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Worker:
        """Connect (unless given a broker), declare the agents and start serving. A start that
        fails part way (or is cancelled) stops what it began and closes the connection it
        opened; a KeyboardInterrupt goes by at once (the process is on its way out)."""
        try:
            return await self._start()
        except (Exception, asyncio.CancelledError):
            await self._unstart()
            raise

    async def _unstart(self) -> None:  # its tasks are started last, after every await
        if "intake" in vars(self):  # made by this start: it may follow records
            await self.intake.stop()
        await self.interrupts.close()
        await self.heartbeats.close()
        if self._owns_broker and self._broker is not None:
            broker, self._broker = self._broker, None
            await broker.close()

    async def _start(self) -> Worker:
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
            opens=self._runs_new_now,
            clock=self.clock,
            limits=self._limits,
            served_elsewhere=self.heartbeats.served_elsewhere,
        )
        self.scheduler = Scheduler(
            broker=b,
            names=self.names,
            settings=self.settings,
            starts=self.intake.starts,
            registry=self.registry,
            agents=self.agents,
            run_new=self._run_new,
            held=self._held,
        )
        self.intake.schedules = self.scheduler
        lanes = await open_lanes(b, self.names, self.settings, self.agents)
        await self.interrupts.subscribe(b)
        await self.intake.start()
        await retry_unsettled(functools.partial(self.heartbeats.start, self.store))
        await retry_unsettled(self.heartbeats.beat)
        await retry_unsettled(self.heartbeats.look)
        self._tasks = [
            *(
                asyncio.create_task(
                    InboxLoop(self.intake, self.settings).run(lane, self._stopping),
                    name=f"sojourn-{lane.consumer}",
                )
                for lane in lanes.intake
            ),
            *(
                asyncio.create_task(self.wakes.wake_loop(lane), name=f"sojourn-{lane.consumer}")
                for lane in lanes.wakes
            ),
            *(
                asyncio.create_task(
                    self.scheduler.fire_loop(sub, agent, self._stopping),
                    name=f"sojourn-fires-{agent}",
                )
                for agent, sub in lanes.fires.items()
            ),
            asyncio.create_task(self.heartbeats.beat_loop(), name="sojourn-heartbeat"),
            asyncio.create_task(self.wakes.timer_loop(), name="sojourn-timers"),
            asyncio.create_task(self.heartbeats.watch(self._stopping), name="sojourn-membership"),
        ]
        metrics.track_worker(self)
        self._collector.hold()
        log.info("worker %s serving %s on %s", self.worker_id, sorted(self.agents), b.url)
        return self

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking work, let activations finish for ``grace`` seconds, then cancel the rest."""
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
        await settle_cancelled(taking, grace)
        active = list(self._active.values())
        if active:
            _, still = await asyncio.wait(active, timeout=grace)
            for t in still:
                t.cancel()
            await settle_cancelled(still, grace)
        await self.sticky.close(grace)  # any that parked while the worker was stopping
        self.heartbeats.beating = False
        await self.interrupts.close()
        await self.intake.stop()
        await close_resources(grace)  # the runs' MCP sessions (tasks.on_stop)
        for t in beating:
            t.cancel()
        await settle_cancelled(beating, grace)
        metrics.track_worker(self, on=False)
        self._collector.release()
        if self._broker is not None and self._broker.connected:
            # A graceful stop: not "down". Not sent while the server is gone (it would wait for
            # its ack timeout), and bounded when it does not answer: a stop ends within seconds.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.heartbeats.beat(stopped=True)
        await self.heartbeats.close()
        if self._owns_broker and self._broker is not None:
            await self._broker.close()
        self._closed.set()

    def kill(self) -> None:
        """Die now, as a SIGKILL would (a test's crash, ``SojournEnv.explore_crashes``): the
        connection cut with nothing more sent, every task cancelled, nothing settled."""
        if self._broker is not None:
            self._broker.sever()
        self._stopping.set()
        self.timers.close()
        self.sticky.kill()
        if "intake" in vars(self):
            self.intake.kill()
        reap([*self._tasks, *self._active.values(), *self._background])
        self._collector.release()
        self._closed.set()

    @property
    def timers_fired(self) -> int:
        """Runs woken here by their in-process timers."""
        return self.wakes.timers_fired

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> Worker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- the runs executing here ------------------------------------------------------------

    def _runs_new_now(self, run_id: str) -> bool:
        """Whether a run created now would execute here at once (``_run_new``)."""
        return not (
            self._stopping.is_set()
            or run_id in self._active
            or self._free_slots() <= 0
            or len(self._holding) >= HELD_TRIGGERS_MAX
        )

    async def _run_new(
        self, run_id: str, history: list[Decision], msg: Delivery, opening: Opening | None = None
    ) -> bool:
        """Run a run this worker's intake just created, at once, without a wake round trip;
        with ``opening``, a run opened in memory, which its first append stores.

        The inbox message stays unacknowledged (kept alive like a wake) until the run rests;
        if this worker dies first, its redelivery makes the intake wake the run. When this
        worker already holds ``HELD_TRIGGERS_MAX`` of them, it declines: the intake acks the
        message and wakes the run (an opened run is stored first)."""
        if not self._runs_new_now(run_id):
            return False
        self._holding.add(run_id)
        await self._slots.acquire(opening.started.priority if opening else PRIORITY_DEFAULT)
        if opening is not None:
            self._openings[run_id] = opening
        consumer, agent = self.names.intake_consumer, agent_of(self.agents, history)
        self._spawn(run_id, msg, history, consumer, agent)
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

    def _held(self, run_id: str) -> bool:
        """Whether ``run_id`` executes here or a live other worker's last beat lists it."""
        if run_id in self._active:
            return True
        return self.heartbeats.holder(run_id) is not None

    def _free_slots(self) -> int:
        return self.concurrency - len(self._active)

    @property
    def executing(self) -> int:
        """Runs executing here now (a kept, resting one is not)."""
        return len(self._active)

    def _done(self, run_id: str, _task: object = None) -> None:
        opening = self._openings.pop(run_id, None)
        if opening is not None:  # ended before its first append: nothing was stored
            opening.settle("abandoned")
        self._active.pop(run_id, None)
        self._since.pop(run_id, None)
        self._holding.discard(run_id)
        agent = self._run_agents.pop(run_id, None)
        lane = self._run_lanes.pop(run_id, (PRIORITY_DEFAULT, None))
        self._slots.release()
        if run_id in self._rewake and not self._stopping.is_set():
            self._rewake.discard(run_id)
            task = asyncio.create_task(self.wakes.wake_again(run_id, agent, *lane))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

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
            self._run_lanes[run_id] = (act.state.priority, act.state.fairness)
            cause, late = resume_cause(act.state, wake, cause, self.clock.now())
            metrics.RESUME_LATENCY.labels(agent_name, cause).observe(late)
            with self.interrupts.track(run_id, act):
                outcome = await act.run()
            self._keep(run_id, act)
            fault("before_ack")
            log.debug("run %s: %s", run_id, outcome)
            self.activations_completed += 1
            self._failures.clear(run_id)
            metrics.ACTIVATIONS.labels(agent_name, outcome).inc()
            if is_terminal(outcome):
                self.store.forget(run_id)
                self.wakes.ended(run_id)
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
                b = self._broker_or_fail()
                await give_up(
                    b, self.names, run_id, "poison", e.message, e.seq or 0, permanent=True
                )
                await wake.ack()
        except Exception as e:
            opening = self._openings.get(run_id)
            await activation_failed(
                e,
                self._broker_or_fail(),
                self.names,
                wake,
                run_id=run_id,
                stored=opening is None or opening.settled.done(),
                failures=self._failures,
                limit=self.settings.max_activation_failures,
                agent=agent_name,
                last_seq=act.last_seq if act is not None else 0,
            )

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
        opening = self._openings.get(run_id)
        if history is None or backstops:
            t0 = time.perf_counter()
            if history:  # kept by the timer: read only what came after
                history = history + await self.store.load(run_id, after_seq=history[-1].seq)
            else:
                history = await self.store.history(run_id)
                snapshot = as_snapshot(self.store.snapshot(run_id))
            loaded: float | None = time.perf_counter() - t0
            holder = await self.heartbeats.held_step(run_id, history)
            if holder is not None:
                await self.wakes.hand_back(wake, run_id, holder, "open_step")
                return None
        else:
            loaded = None
        agent = agent_of(self.agents, history)
        if agent is None:
            if await self.wakes.not_served(wake, run_id, history, consumer, self.agents):
                self.misrouted += 1
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
            opening=opening,
            clock=self.clock,
            holds=self.intake.holds,
            limits=self.intake.limits,
        )
        self.folds += 1
        if opening is None:  # an opened run's history is not stored yet
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

    def _broker_or_fail(self) -> Broker:
        assert self._broker is not None
        return self._broker
