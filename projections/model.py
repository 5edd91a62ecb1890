"""The run model: every live run's summary, its owner's heartbeat, and the workers, kept
current by following the deployment's streams.

This is the projection the watchdog judges liveness from. It reads four streams in order with
``StreamFollower`` (no server-side state to recover after a restart): run events (folded into
``RunSummary``), worker heartbeats (each lists the runs its worker holds), the progress steps
report (``ctx.heartbeat``) and wedge records. Ended runs are dropped as they end, so memory
follows the number of live runs, not the length of the stream. Until it has caught up it does
not judge anything (a half-read history would look stale).

At start-up it reads the events stream from the beginning, unless it restores a snapshot first
(``read_snapshot``, ``restore``): the live runs' summaries, the ended count, the baselines and
the agents as they were at some events-stream sequence, written by the projector leader to the
object store (``<PREFIX>_SNAPSHOTS``, object ``model``; ``write_snapshot``). Then it reads from
the sequence after it. Restoring a snapshot taken at a cut and folding the rest gives what
folding everything gives (tests/projections/test_snapshot.py). A snapshot that is missing,
damaged, in a newer format, beyond the stream's end or of another incarnation of the stream is
logged and ignored: the model folds from sequence 1, as without one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.follow import StreamFollower
from sojourn.broker.names import Names
from sojourn.broker.objects import ObjectStore
from sojourn.schemas.codec import (
    decode_events,
    decode_lease_holder,
    decode_wedge_record,
    decode_worker_beat,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import RunCompleted, RunEvent, RunStarted, StepStarted
from sojourn.schemas.health import LIVENESS_STATES, Liveness, WedgeRecord, WorkerBeat
from sojourn.schemas.snapshot import (
    SNAPSHOT_FORMAT,
    HistoryBaselineState,
    ModelSnapshot,
    RateBaselineState,
    decode_snapshot,
    encode_snapshot,
)
from sojourn.schemas.wire import LeaseHolder

from .anomaly import HistoryBaseline, RateBaseline
from .liveness import Listed, Thresholds, claim, classify, holders
from .queues import depths
from .summary import RunSummary, close_decision, summarize

__all__ = [
    "MAX_SNAPSHOT",
    "SNAPSHOT_OBJECT",
    "OnDecision",
    "RunModel",
    "gauge_families",
    "read_snapshot",
    "snapshot_store",
    "write_snapshot",
]

log = logging.getLogger("sojourn.projections")

SILENT_FOR = 3600.0
"""A worker silent longer than this (without a graceful stop) is forgotten, not "down"."""
_MAX_AGENTS = 500

SNAPSHOT_OBJECT = "model"
"""The run model's snapshot: its object's name in the bucket ``<PREFIX>_SNAPSHOTS``."""
MAX_SNAPSHOT = 2 * 1024 * 1024 * 1024
"""The largest snapshot read back, in bytes (2 GiB, some millions of live runs): a description
claiming more is refused before any chunk is read."""


OnDecision = Callable[[int, RunSummary, tuple[RunEvent, ...]], None]
"""Called with ``(seq, summary_after, events)`` for every decision the model applies, an
ended run's last one included (its final summary, handed over before the model drops it)."""


class RunModel:
    """Follows a deployment's streams; ``refresh()`` reads what is new, ``assess()`` judges.

    ``on_decision`` (``OnDecision``), when set, sees every decision applied: the projector
    makes its views from it. ``applied_time`` is the stored time of the last one.
    """

    def __init__(self, broker: Broker, names: Names, settings: Settings) -> None:
        self.broker = broker
        self.names = names
        self.settings = settings
        self.limits = Thresholds(
            stall_after=settings.stall_threshold, overdue_after=settings.overdue_after
        )
        self.runs: dict[str, RunSummary] = {}
        self.leases: dict[str, LeaseHolder] = {}
        self.workers: dict[str, WorkerBeat] = {}
        self._holders: dict[str, Listed] | None = None
        """Which worker's beat lists each run (rebuilt after a beat changes)."""
        self.wedges: dict[str, WedgeRecord] = {}
        self.tool_calls: dict[str, RateBaseline] = {}
        self.history: dict[str, HistoryBaseline] = {}
        self.agents: set[str] = set()
        self.ended = 0
        self.caught_up = False
        self.assessed: dict[str, Liveness] = {}
        self.assessed_at = 0.0
        self.on_decision: OnDecision | None = None
        self.applied_time = 0.0
        self.decisions_read = 0
        """Event messages read from the stream by this model (not those a snapshot holds)."""
        self.restored_from = 0
        """The position of the snapshot this model started from (0: it folded from 1)."""
        self._events = StreamFollower(broker, names.events_stream, names.events_all, page=1000)
        self._leases = StreamFollower(broker, names.leases_stream, names.leases_all)
        self._workers = StreamFollower(broker, names.health_stream, names.workers_all)
        self._wedges = StreamFollower(broker, names.health_stream, f"{names.prefix}.wedge.*")
        self._agents = StreamFollower(broker, names.agents_stream, f"{names.prefix}.agent.*")

    # --- reading -----------------------------------------------------------------------------

    async def refresh(self, max_pages: int = 200) -> bool:
        """Read what is new on every stream (at most ``max_pages`` pages of events per call, so
        a long catch-up still lets the caller act in between); return whether caught up."""
        for m in await self._drain(self._leases, 50):
            self._on_lease(m)
        for m in await self._drain(self._workers, 10):
            self._on_beat(m)
        for m in await self._drain(self._wedges, 10):
            self._on_wedge(m)
        for m in await self._drain(self._agents, 2):  # served agents get zeros on dashboards
            self._add_agent(self._run_of(m))
        pages = 0
        while pages < max_pages:
            msgs = await self._events.next_page()
            if not msgs:
                break
            pages += 1
            self.decisions_read += len(msgs)
            for m in msgs:
                self._on_decision(m)
            if self._events.pending == 0:
                break
        done = self._events.pending == 0
        self.caught_up = self.caught_up or done
        return done

    @staticmethod
    async def _drain(follower: StreamFollower, max_pages: int) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        for _ in range(max_pages):
            msgs = await follower.next_page()
            out.extend(msgs)
            if not msgs or follower.pending == 0:
                break
        return out

    def _run_of(self, m: StoredMessage, index: int = 1) -> str:
        return self.names.subject_token(m.subject, index)

    def _on_decision(self, m: StoredMessage) -> None:
        run_id = self._run_of(m)
        seq = m.seq
        s = self.runs.get(run_id)
        try:
            events = decode_events(m.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            self.wedges[run_id] = WedgeRecord(
                run_id=run_id,
                code="poison",
                reason=f"event message {seq} cannot be decoded: {error}",
                seq=seq,
                permanent=True,
                at=time.time(),
            )
            events = []
        if s is None:
            if events and not isinstance(events[0], RunStarted):
                # The run ended before (and was dropped) or its start was never stored: a late
                # event (a cancel after the end) must not bring it back as a live run.
                return
            s = RunSummary(run_id=run_id)
        was_terminal = s.terminal
        for e in events:
            s = summarize(s, e)
            if isinstance(e, StepStarted) and s.agent:
                self._tool_calls(s.agent).add(e.at)
        s = close_decision(s, seq, len(m.data))
        if s.agent:
            self._add_agent(s.agent)
        self.applied_time = m.time
        if self.on_decision is not None:
            self.on_decision(seq, s, tuple(events))
        if s.terminal:
            if not was_terminal:
                self.ended += 1
                if any(isinstance(e, RunCompleted) for e in events):
                    self.history.setdefault(s.agent, HistoryBaseline()).add(s.events)
            self.runs.pop(run_id, None)
            self.leases.pop(run_id, None)
            self.wedges.pop(run_id, None)
            return
        self.runs[run_id] = s

    def _add_agent(self, agent: str) -> None:
        if agent not in self.agents and len(self.agents) < _MAX_AGENTS:
            self.agents.add(agent)

    def _tool_calls(self, agent: str) -> RateBaseline:
        rb = self.tool_calls.get(agent)
        if rb is None:
            rb = self.tool_calls[agent] = RateBaseline()
        return rb

    def _on_lease(self, m: StoredMessage) -> None:
        run_id = self._run_of(m)
        try:
            self.leases[run_id] = decode_lease_holder(m.data)
        except msgspec.MsgspecError:
            self.leases.pop(run_id, None)

    def _on_beat(self, m: StoredMessage) -> None:
        try:
            beat = decode_worker_beat(m.data)
        except msgspec.MsgspecError:
            return
        self.workers[beat.worker_id] = beat
        self._holders = None

    def _on_wedge(self, m: StoredMessage) -> None:
        try:
            rec = decode_wedge_record(m.data)
        except msgspec.MsgspecError:
            return
        self.wedges[rec.run_id] = rec

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(
        self, *, taken_at: float = 0.0, stream_created: str = ""
    ) -> ModelSnapshot[RunSummary]:
        """The model as it is now, at ``position`` (pure: no I/O; the summaries are immutable
        and shared, the baselines copied)."""
        return ModelSnapshot(
            format=SNAPSHOT_FORMAT,
            position=self.position,
            applied_time=self.applied_time,
            taken_at=taken_at,
            runs=tuple(self.runs.values()),
            ended=self.ended,
            tool_calls={
                agent: RateBaselineState(
                    minutes=tuple(sorted(rb.minutes.items())), first_at=rb.first_at
                )
                for agent, rb in self.tool_calls.items()
            },
            history={
                agent: HistoryBaselineState(mean=hb.mean, runs=hb.runs)
                for agent, hb in self.history.items()
            },
            agents=tuple(sorted(self.agents)),
            wedges=tuple(w for r, w in self.wedges.items() if r in self.runs),
            stream_created=stream_created,
        )

    def restore(self, snap: ModelSnapshot[RunSummary]) -> None:
        """Start from ``snap``: its state, and the events stream read from ``position + 1``.

        Raises:
            ValueError: this model has read events already (a snapshot replaces a start, not a
                fold in progress).
        """
        if self.position or self.runs or self.ended:
            raise ValueError("a snapshot is restored into a model that has read no events")
        interned: dict[str, str] = {}
        runs: dict[str, RunSummary] = {}
        for s in snap.runs:
            if not s.run_id or s.terminal:
                continue  # not something the fold keeps: a damaged or foreign document
            agent = interned.setdefault(s.agent, sys.intern(s.agent))
            if agent is not s.agent:  # one copy per agent name, as ``summarize`` keeps it
                s = msgspec.structs.replace(s, agent=agent)
            runs[s.run_id] = s
        self.runs = runs
        self.ended = snap.ended
        self.tool_calls = {
            agent: RateBaseline(minutes=dict(st.minutes), first_at=st.first_at)
            for agent, st in snap.tool_calls.items()
        }
        self.history = {
            agent: HistoryBaseline(mean=st.mean, runs=st.runs) for agent, st in snap.history.items()
        }
        self.agents = set()
        for agent in snap.agents:
            self._add_agent(agent)
        self.wedges.update({w.run_id: w for w in snap.wedges if w.run_id in runs})
        self.applied_time = snap.applied_time
        self.restored_from = snap.position
        self._events = StreamFollower(
            self.broker,
            self.names.events_stream,
            self.names.events_all,
            from_seq=snap.position + 1,
            page=self._events.page,
        )

    # --- judging -----------------------------------------------------------------------------

    def assess(self, now: float | None = None) -> dict[str, Liveness]:
        """The liveness of every live run (empty until the model has caught up once)."""
        now = time.time() if now is None else now
        if not self.caught_up:
            return {}
        out = {}
        for run_id, s in self.runs.items():
            lease, beat = self.owner(run_id)
            out[run_id] = classify(s, lease, now, self.limits, self.wedges.get(run_id), beat)
        self.assessed, self.assessed_at = out, now
        self._prune(now)
        return out

    def owner(self, run_id: str) -> tuple[LeaseHolder | None, WorkerBeat | None]:
        """Who holds a run (``claim``: the worker whose beat lists it, with its activation's
        reported progress) and that worker's last beat: what ``classify`` judges."""
        if self._holders is None:
            self._holders = holders(self.workers.values())
        listed = self._holders.get(run_id)
        return claim(listed, self.leases.get(run_id)), listed[0] if listed else None

    def _prune(self, now: float) -> None:
        for run_id in [r for r, lh in self.leases.items() if r not in self.runs]:
            lh = self.leases[run_id]
            if now - (lh.heartbeat_at or lh.acquired_at) > 10 * self.limits.stall_after + 60:
                del self.leases[run_id]
        for wid in [w for w, b in self.workers.items() if now - b.at > SILENT_FOR]:
            del self.workers[wid]
        for rb in self.tool_calls.values():
            rb.prune(now)

    def worker_states(self, now: float) -> dict[str, str]:
        """``live`` or ``silent`` for every worker heard from in the last hour and not stopped."""
        out = {}
        for wid, b in self.workers.items():
            if b.stopped:
                continue
            out[wid] = "live" if now - b.at <= self.limits.stall_after else "silent"
        return out

    @property
    def position(self) -> int:
        """The events-stream sequence of the last decision read (0: none yet)."""
        return self._events.last_seq

    @property
    def lag_events(self) -> int:
        return self._events.pending

    def lag_seconds(self, now: float) -> float:
        if self._events.pending == 0:
            return 0.0
        return max(0.0, now - self._events.last_time) if self._events.last_time else 0.0

    def gauges(self) -> list[Metric]:
        return gauge_families(self)


def snapshot_store(broker: Broker, names: Names) -> ObjectStore:
    """The bucket of the run model's snapshots (``<PREFIX>_SNAPSHOTS``)."""
    return ObjectStore(
        broker,
        names.snapshots_bucket,
        max_bytes=MAX_SNAPSHOT,
        description="a sojourn run model's snapshot (sojourn.projections.model)",
    )


async def events_stream_state(broker: Broker, names: Names) -> tuple[int, str]:
    """The events stream's last sequence and creation time (JetStream's ``created``)."""
    info = await broker.api(f"$JS.API.STREAM.INFO.{names.events_stream}")
    state = info.get("state", {})
    return int(state.get("last_seq", 0) or 0), str(info.get("created", ""))


async def read_snapshot(broker: Broker, names: Names) -> ModelSnapshot[RunSummary] | None:
    """The stored snapshot of the run model, if there is one a model may start from: readable
    (bounded, digest verified, decodable, a format this code reads) and of this stream, at a
    position not beyond its last sequence. Anything else is logged and ``None`` (fold from 1).
    """
    try:
        data = await snapshot_store(broker, names).get(SNAPSHOT_OBJECT)
        if data is None:
            return None
        snap = decode_snapshot(data, RunSummary)
        last, created = await events_stream_state(broker, names)
    except (SojournError, TimeoutError) as e:  # unreadable, refused, or no answer
        log.warning("run model: the snapshot is not used (%s); folding from sequence 1", e)
        return None
    if snap.position > last:
        log.warning(
            "run model: the snapshot is at sequence %d, beyond the events stream's last (%d); "
            "folding from sequence 1",
            snap.position,
            last,
        )
        return None
    if snap.stream_created and created and snap.stream_created != created:
        log.warning(
            "run model: the snapshot is of an earlier events stream (created %s, this one %s); "
            "folding from sequence 1",
            snap.stream_created,
            created,
        )
        return None
    return snap


async def write_snapshot(
    broker: Broker, names: Names, snap: ModelSnapshot[RunSummary], *, replicas: int = 1
) -> int:
    """Store ``snap`` as the run model's snapshot (replacing the one before, whose chunks are
    purged); its size in bytes. The bucket is created on demand, like retention's.

    Raises:
        JetStreamError / PermissionDenied / BrokerUnavailable: it was not stored.
    """
    data = encode_snapshot(snap)
    store = snapshot_store(broker, names)
    await store.ensure(replicas)
    await store.put(SNAPSHOT_OBJECT, data)
    return len(data)


def gauge_families(model: RunModel | None) -> list[Metric]:
    """The watchdog's gauges, computed from the model's last assessment."""
    runs = GaugeMetricFamily(
        "sojourn_runs", "Runs that have not ended, by liveness.", labels=["agent", "liveness"]
    )
    suspended = GaugeMetricFamily(
        "sojourn_runs_suspended", "Suspended runs by reason.", labels=["agent", "reason"]
    )
    workers = GaugeMetricFamily(
        "sojourn_workers",
        "Workers by heartbeat: live, or silent (stopped heartbeating without a graceful stop "
        "within the last hour).",
        labels=["state"],
    )
    timers = GaugeMetricFamily(
        "sojourn_pending_timers", "Runs waiting with a deadline (a broker timer set)."
    )
    lag = GaugeMetricFamily(
        "sojourn_projection_lag_events", "Run events the watchdog's run model has not read yet."
    )
    lag_s = GaugeMetricFamily(
        "sojourn_projection_lag_seconds",
        "Age of the newest run event the model has read, while it is behind (0 when caught up).",
    )
    scan = GaugeMetricFamily(
        "sojourn_watchdog_last_scan_timestamp_seconds",
        "When the watchdog last judged every run (unix time).",
    )
    rate = GaugeMetricFamily(
        "sojourn_tool_call_rate",
        "Tool calls (step attempts) per second over the last 5 minutes.",
        labels=["agent"],
    )
    rate_base = GaugeMetricFamily(
        "sojourn_tool_call_baseline",
        "Tool calls per second over the preceding day (excluding the last hour).",
        labels=["agent"],
    )
    hist_max = GaugeMetricFamily(
        "sojourn_history_events_max", "The longest history among live runs.", labels=["agent"]
    )
    hist_base = GaugeMetricFamily(
        "sojourn_history_events_baseline",
        "The typical history length of completed runs (exponentially weighted).",
        labels=["agent"],
    )
    ratio = GaugeMetricFamily(
        "sojourn_anomaly_ratio",
        "A signal against its baseline (tool_calls: rate; history_growth: longest live "
        "history); absent until the baseline is known.",
        labels=["agent", "signal"],
    )
    idle = GaugeMetricFamily(
        "sojourn_idle_polls_per_run",
        "Mean idle polls (ctx.poll checks that found nothing) per live run.",
        labels=["agent"],
    )
    queued = GaugeMetricFamily(
        "sojourn_concurrency_queued_runs",
        "Runs queued on a concurrency key (decision 0048), all keys of the agent.",
        labels=["agent"],
    )
    deepest = GaugeMetricFamily(
        "sojourn_concurrency_queue_depth",
        "Runs queued on the agent's deepest concurrency key (keys are never labels).",
        labels=["agent"],
    )
    families: list[Metric] = [
        runs, suspended, workers, timers, lag, lag_s, scan,
        rate, rate_base, hist_max, hist_base, ratio, idle, queued, deepest,
    ]  # fmt: skip
    if model is None:
        return families
    now = model.assessed_at or time.time()
    counts = {(a, st): 0 for a in model.agents for st in LIVENESS_STATES if st != "ended"}
    reasons: dict[tuple[str, str], int] = {}
    for liv in model.assessed.values():
        agent = liv.agent if liv.agent in model.agents else "other"
        if liv.state != "ended":
            counts[agent, liv.state] = counts.get((agent, liv.state), 0) + 1
    longest: dict[str, int] = {}
    polls: dict[str, list[int]] = {}
    pending_timers = 0
    for s in model.runs.values():
        agent = s.agent if s.agent in model.agents else "other"
        if s.status == "suspended":
            key = (agent, s.suspended_reason or "suspended")
            reasons[key] = reasons.get(key, 0) + 1
        longest[agent] = max(longest.get(agent, 0), s.events)
        polls.setdefault(agent, []).append(s.idle_polls)
        pending_timers += s.deadline is not None and s.status in ("waiting", "suspended")
    for (agent, st), n in sorted(counts.items()):
        runs.add_metric([agent, st], n)
    for (agent, reason), n in sorted(reasons.items()):
        suspended.add_metric([agent, reason], n)
    states = model.worker_states(now)
    for worker_state in ("live", "silent"):
        workers.add_metric([worker_state], sum(1 for v in states.values() if v == worker_state))
    timers.add_metric([], pending_timers)
    lag.add_metric([], model.lag_events)
    lag_s.add_metric([], model.lag_seconds(now))
    if model.assessed_at:
        scan.add_metric([], model.assessed_at)
    for agent in sorted(model.agents):
        rb = model.tool_calls.get(agent)
        if rb is not None:
            rate.add_metric([agent], rb.rate(now))
            base = rb.baseline(now)
            if base is not None:
                rate_base.add_metric([agent], base)
            r = rb.ratio(now)
            if r is not None:
                ratio.add_metric([agent, "tool_calls"], r)
        hist_max.add_metric([agent], longest.get(agent, 0))
        hb = model.history.get(agent)
        if hb is not None and hb.value is not None:
            hist_base.add_metric([agent], hb.value)
            r = hb.ratio(longest.get(agent, 0))
            if r is not None:
                ratio.add_metric([agent, "history_growth"], r)
        ps = polls.get(agent)
        idle.add_metric([agent], sum(ps) / len(ps) if ps else 0.0)
    waiting = depths(model.runs.values())
    for agent in sorted(model.agents):
        total, most = waiting.get(agent, (0, 0))
        queued.add_metric([agent], total)
        deepest.add_metric([agent], most)
    return families
