"""Prometheus metrics of workers and watchdogs (docs/operations.md lists them all), served
with the health probes of ``ops/health.py`` on one port (``ops/exposition.py``).

Labels are bounded: agent names and step names come from code, and even those are capped
(``BoundedLabel``), because one agent that names its steps after its inputs must not take a
Prometheus server down. A run id is never a label: per-run detail lives in ``sojourn status``.

Counters and histograms are module-level (one set per process, shared by every worker in it);
gauges that describe live objects (workers, the watchdog's model) are computed at scrape time by
collectors that look at whatever is registered with them.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sojourn.schemas.events import Usage
from sojourn.schemas.schedules import FireOutcome
from sojourn.schemas.vocabulary import TerminalStatus

__all__ = [
    "ACTIVATIONS",
    "APPENDS",
    "ARCHIVED_RUNS",
    "ARCHIVE_ERRORS",
    "BUDGET_BREACHES",
    "CONCURRENCY_ADMITTED",
    "CONCURRENCY_QUEUED",
    "CONCURRENCY_QUEUE_WAIT",
    "CONCURRENCY_RELEASED",
    "DEAD_LETTERS",
    "DEBOUNCED_TRIGGERS",
    "DEBOUNCE_FIRES",
    "EVENTS_APPENDED",
    "FOLD_SECONDS",
    "GATEWAY_DEAD_LETTERS_DROPPED",
    "GATEWAY_REQUESTS",
    "HISTORY_LOAD_SECONDS",
    "IDLE_POLLS",
    "MISROUTED_WAKES",
    "REDELIVERIES",
    "RESUME_LATENCY",
    "SCHEDULE_FIRES",
    "SCHEDULE_LATENESS",
    "SCHEDULE_RUNS",
    "SPEND",
    "STARTS_ATTACHED",
    "STEPS",
    "STEPS_IN_DOUBT",
    "STEP_DURATION",
    "STEP_RETRIES",
    "TAKEOVERS",
    "TOOL_CALLS",
    "WATCHDOG_ACTIONS",
    "BoundedLabel",
    "Incrementable",
    "StepMetrics",
    "agent_label",
    "count_spend",
    "count_usage",
    "schedule_fired",
    "schedule_label",
    "schedule_run_ended",
    "step_label",
    "step_metrics",
    "track_projector",
    "track_watchdog",
    "track_worker",
]

_DURATIONS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_LATENESS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
_FAST = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class BoundedLabel:
    """Maps label values to themselves until ``limit`` distinct ones were seen, then to
    ``other``: a cardinality fuse."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self.limit:
                return "other"
            self._seen.add(value)
        return value


agent_label = BoundedLabel(500)
_step_labels: dict[str, BoundedLabel] = {}


schedule_label = BoundedLabel(1000)
"""Schedule names come from data, not code (whoever adds a schedule names it), so they are
capped too: 1,000 distinct names per process, the rest ``other``."""


def step_label(agent: str, step: str) -> str:
    """A step name as a label: at most 200 distinct ones per agent."""
    guard = _step_labels.get(agent)
    if guard is None:
        guard = _step_labels.setdefault(agent, BoundedLabel(200))
    return guard(step)


# --- workers ---------------------------------------------------------------------------------

STEPS = Counter(
    "sojourn_steps",
    "Step attempts that ended, by outcome: completed, failed (for good) or retry_scheduled.",
    ["agent", "step", "outcome"],
)
STEP_DURATION = Histogram(
    "sojourn_step_duration_seconds",
    "Wall time of step attempts (the step function itself).",
    ["agent", "step"],
    buckets=_DURATIONS,
)
STEP_RETRIES = Counter(
    "sojourn_step_retries", "Step attempts started after a failed attempt.", ["agent", "step"]
)
STEPS_IN_DOUBT = Counter(
    "sojourn_steps_in_doubt",
    "Steps found started with no recorded end (their worker died mid-step), settled by their "
    "in-doubt policy.",
    ["agent", "step"],
)
TOOL_CALLS = Counter(
    "sojourn_tool_calls",
    "Step attempts started (every step is a tool call): the anomaly signal for runaway loops.",
    ["agent"],
)


class Incrementable(Protocol):
    """A counter series (``Counter.labels(...)``), or anything that counts like one."""

    def inc(self, amount: float = 1) -> None: ...


class StepMetrics:
    """The labelled series one step name updates, looked up once: ``labels()`` takes a lock
    and hashes the label values, several times per step otherwise."""

    __slots__ = ("completed", "duration", "failed", "in_doubt", "retries", "retry_scheduled")

    def __init__(self, agent: str, step: str) -> None:
        self.duration = STEP_DURATION.labels(agent, step)
        self.completed = STEPS.labels(agent, step, "completed")
        self.failed = STEPS.labels(agent, step, "failed")
        self.retry_scheduled = STEPS.labels(agent, step, "retry_scheduled")
        self.retries = STEP_RETRIES.labels(agent, step)
        self.in_doubt = STEPS_IN_DOUBT.labels(agent, step)


_step_metrics: dict[tuple[str, str], StepMetrics] = {}
_STEP_METRICS_MAX = 10_000


def step_metrics(agent: str, step: str) -> StepMetrics:
    """The series of step ``step`` of agent label ``agent`` (its name capped by
    ``step_label``). The cache is keyed by the raw name and emptied past 10,000 entries, so
    code that invents step names cannot grow it without bound."""
    key = (agent, step)
    found = _step_metrics.get(key)
    if found is None:
        if len(_step_metrics) >= _STEP_METRICS_MAX:
            _step_metrics.clear()
        found = _step_metrics[key] = StepMetrics(agent, step_label(agent, step))
    return found


IDLE_POLLS = Counter(
    "sojourn_idle_polls",
    "ctx.poll checks that found the job not done yet (the idle-time cost of polling).",
    ["agent"],
)
RESUME_LATENCY = Histogram(
    "sojourn_resume_latency_seconds",
    "From when a run was due (timer deadline, signal arrival, wake, trigger) to when a worker "
    "started executing it.",
    ["agent", "cause"],
    buckets=_DURATIONS,
)
HISTORY_LOAD_SECONDS = Histogram(
    "sojourn_history_load_seconds",
    "Reading a run's history at the start of an activation.",
    ["agent"],
    buckets=_FAST,
)
FOLD_SECONDS = Histogram(
    "sojourn_fold_seconds",
    "Folding a run's history into its state at the start of an activation.",
    ["agent"],
    buckets=_FAST,
)
EVENTS_APPENDED = Counter("sojourn_events_appended", "Events appended to run histories.", ["agent"])
APPENDS = Counter(
    "sojourn_appends", "Fenced appends (one message per decision) to run histories.", ["agent"]
)
ACTIVATIONS = Counter(
    "sojourn_activations",
    "Activations that ended, by outcome (completed, failed, cancelled, suspended, waiting, "
    "fenced, noop, error, wedged).",
    ["agent", "outcome"],
)
REDELIVERIES = Counter(
    "sojourn_consumer_redeliveries",
    "Messages a worker received that had been delivered before (a crash, a timeout, a nak).",
    ["consumer"],
)
MISROUTED_WAKES = Counter(
    "sojourn_misrouted_wakes",
    "Wakes a worker took for a run of an agent it does not serve, and handed back. Routed "
    "wakes reach only the workers serving their agent; this counts unrouted ones "
    "(published without the agent), by consumer.",
    ["consumer"],
)
ARCHIVED_RUNS = Counter(
    "sojourn_archived_runs",
    "Ended runs that left the hot streams (retention), by archive policy: object_store (a "
    "verified copy kept) or discard.",
    ["policy"],
)
ARCHIVE_ERRORS = Counter(
    "sojourn_archive_errors",
    "Runs retention could not move this pass (left hot, retried next pass), by stage: read, "
    "archive (write or verify the copy), remove (purge), view (mark the view archived).",
    ["stage"],
)
IN_PROCESS_TIMERS_FIRED = Counter(
    "sojourn_in_process_timers_fired",
    "Runs a worker woke at their deadline from its in-process timers (the broker's copy of "
    "each timer fires timer_backstop later, should the worker be gone).",
)
HANDED_BACK = Counter(
    "sojourn_wakes_handed_back",
    "Wakes a worker handed back because another live worker holds the run, by why: listed "
    "(its heartbeat lists the run) or open_step (it may be running the run's open step).",
    ["reason"],
)
TAKEOVERS = Counter(
    "sojourn_takeovers",
    "Runs of a worker found dead (its heartbeats stopped) that this worker woke to take over.",
)
DEAD_LETTERS = Counter(
    "sojourn_dead_letters",
    "Records written to the dead-letter stream, by code (rejected input, poison history, "
    "max_deliveries).",
    ["code"],
)
GATEWAY_REQUESTS = Counter(
    "sojourn_gateway_requests",
    "HTTP requests the gateway answered, by route (its path template) and status code.",
    ["route", "status"],
)
GATEWAY_DEAD_LETTERS_DROPPED = Counter(
    "sojourn_gateway_dead_letters_dropped",
    "Rejected callback and webhook requests not kept in the dead-letter stream: over the "
    "gateway's rate of records (a flood of bad requests must not push real records out).",
)
SPEND = Counter(
    "sojourn_spend",
    "What runs spent: model requests' usage (ctx.llm, current_step().charge) and ctx.spend, "
    "by unit (usd, tokens, input_tokens, output_tokens).",
    ["agent", "unit"],
)

STARTS_ATTACHED = Counter(
    "sojourn_starts_attached",
    "Singleton starts that attached to their key's live run instead of starting one "
    "(decision 0047).",
    ["agent"],
)
DEBOUNCED_TRIGGERS = Counter(
    "sojourn_debounced_triggers",
    "Debounced starts recorded in a burst (decision 0047).",
    ["agent"],
)
DEBOUNCE_FIRES = Counter(
    "sojourn_debounce_fires",
    "Debounce bursts that ended, by how: fired (its deadline passed) or full (its inputs "
    "reached the bound and it was closed at once).",
    ["agent", "how"],
)
# Concurrency keys (decision 0048). Keys are unbounded caller data: never a label. The queues'
# depths are the watchdog's gauges (``sojourn_concurrency_queued_runs``, ``_queue_depth``).
CONCURRENCY_QUEUED = Counter(
    "sojourn_concurrency_queued",
    "Starts queued because every slot of their concurrency key was taken (decision 0048).",
    ["agent"],
)
CONCURRENCY_ADMITTED = Counter(
    "sojourn_concurrency_admitted",
    "Runs that took a slot of their concurrency key, by how: start (at once) or queue (from "
    "the key's queue, when a slot freed).",
    ["agent", "how"],
)
CONCURRENCY_RELEASED = Counter(
    "sojourn_concurrency_released",
    "Slots of concurrency keys given back, by how: ended (the run's end), refused (its start "
    "was refused after it took the slot) or reaped (a holder found ended or never created).",
    ["agent", "how"],
)
CONCURRENCY_QUEUE_WAIT = Histogram(
    "sojourn_concurrency_queue_wait_seconds",
    "How long a run waited in its concurrency key's queue before it took a slot.",
    ["agent"],
    buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
LANE_WAIT = Histogram(
    "sojourn_lane_wait_seconds",
    "How long a start or a wake waited on its priority lane (decision 0049), from when the "
    "broker stored it to when a worker took it: by lane (the priority, 1 to 5) and kind "
    "(start: a start or spawn; wake: a wake or fired timer).",
    ["lane", "kind"],
    buckets=_LATENESS,
)


def lane_waited(priority: int, kind: str, stored: float) -> None:
    """``LANE_WAIT`` for a message stored at ``stored`` (Unix seconds) and taken now."""
    child = _LANE_WAIT_CHILDREN.get((priority, kind))
    if child is None:  # a few (lanes x kinds): each labelled once, not on every start
        child = _LANE_WAIT_CHILDREN[priority, kind] = LANE_WAIT.labels(str(priority), kind)
    child.observe(max(0.0, time.time() - stored))


_LANE_WAIT_CHILDREN: dict[tuple[int, str], Any] = {}


SPEND_WINDOW = 3600.0
"""Seconds of the rolling window of ``sojourn_spend_window``."""
_BUCKET = 60.0


class SpendWindow(Collector):
    """What each agent spent over the last ``SPEND_WINDOW`` seconds, per unit, in one-minute
    buckets: the steady-state spend an alert can compare with a limit without a ``rate()``
    over counters that reset when a worker restarts. Summed over workers it is the fleet's.
    """

    def __init__(self, window: float = SPEND_WINDOW) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], dict[int, float]] = {}

    def add(self, agent: str, unit: str, amount: float, now: float) -> None:
        if amount <= 0:
            return
        slot = int(now // _BUCKET)
        with self._lock:
            buckets = self._buckets.setdefault((agent, unit), {})
            buckets[slot] = buckets.get(slot, 0.0) + amount
            if len(buckets) > self.window / _BUCKET + 2:
                self._expire(buckets, slot)

    def _expire(self, buckets: dict[int, float], slot: int) -> None:
        oldest = slot - int(self.window // _BUCKET)
        for k in [k for k in buckets if k <= oldest]:
            del buckets[k]

    def totals(self, now: float) -> dict[tuple[str, str], float]:
        slot = int(now // _BUCKET)
        with self._lock:
            out = {}
            for key, buckets in self._buckets.items():
                self._expire(buckets, slot)
                out[key] = sum(buckets.values())
            return out

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "sojourn_spend_window",
            f"What runs of an agent spent in the last {SPEND_WINDOW:g} seconds, by unit "
            "(usd, tokens, input_tokens, output_tokens); this worker's share.",
            labels=["agent", "unit"],
        )
        for (agent, unit), total in self.totals(time.time()).items():
            g.add_metric([agent, unit], total)
        yield g


SPEND_RECENT = SpendWindow()


def count_spend(agent: str, unit: str, amount: float) -> None:
    """Count spending in ``sojourn_spend_total`` and the rolling ``sojourn_spend_window``."""
    SPEND.labels(agent, unit).inc(amount)
    SPEND_RECENT.add(agent, unit, amount, time.time())


def count_usage(agent: str, usage: Usage) -> None:
    """Count what a step attempt charged."""
    count_spend(agent, "usd", usage.usd)
    count_spend(agent, "tokens", usage.tokens)
    count_spend(agent, "input_tokens", usage.input_tokens)
    count_spend(agent, "output_tokens", usage.output_tokens)


_LIMIT_WAITS = (0.0, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
LIMIT_GRANTS = Counter(
    "sojourn_limit_grants",
    "Slots granted by a shared rate limit (decision 0046), by limit.",
    ["limit"],
)
LIMIT_WAIT = Histogram(
    "sojourn_limit_wait_seconds",
    "How long a request waits for its slot of a shared rate limit: from the grant to the "
    "slot's start, by limit.",
    ["limit"],
    buckets=_LIMIT_WAITS,
)
LIMIT_CONFLICTS = Counter(
    "sojourn_limit_conflicts",
    "Writes to a shared rate limit's record that lost a compare-and-set and were retried.",
    ["limit"],
)
LIMIT_BLOCKS = Counter(
    "sojourn_limit_blocks",
    "Blocks of a shared rate limit a provider's 429 imposed (every worker waits them out).",
    ["limit"],
)
LIMIT_WRITE_FAILURES = Counter(
    "sojourn_limit_write_failures",
    "Writes to a shared rate limit's record that failed for good (the tokens they charged are "
    "not counted), by limit.",
    ["limit"],
)


@dataclass(frozen=True, slots=True)
class LimitMetrics:
    """The series of one shared rate limit (limits are at most ``LIMITS_MAX``)."""

    grants: Any
    wait: Any
    conflicts: Any


def limit_metrics(name: str) -> LimitMetrics:
    return LimitMetrics(
        LIMIT_GRANTS.labels(name), LIMIT_WAIT.labels(name), LIMIT_CONFLICTS.labels(name)
    )


BUDGET_BREACHES = Counter(
    "sojourn_budget_breaches",
    "Runs suspended because they used up a limit of their budget, by limit (usd, tokens, "
    "input_tokens, output_tokens, steps, tool_calls, polls, wall_seconds).",
    ["agent", "limit"],
)

# --- schedules (counted by the workers that handle fires and end scheduled runs) ------------

SCHEDULE_FIRES = Counter(
    "sojourn_schedule_fires",
    "Fire times of schedules handled, by outcome: started (a run), skipped (overlap policy), "
    "missed (dropped by the catch-up policy), failed (no run could be started).",
    ["schedule", "outcome"],
)
SCHEDULE_LATENESS = Histogram(
    "sojourn_schedule_lateness_seconds",
    "From a fire's nominal time plus its jitter to when its run was created.",
    ["agent"],
    buckets=_LATENESS,
)
SCHEDULE_RUNS = Counter(
    "sojourn_schedule_runs",
    "Runs started by a schedule that ended, by status (completed, failed, cancelled).",
    ["schedule", "status"],
)


def schedule_fired(schedule: str, agent: str, outcome: FireOutcome, lateness: float | None) -> None:
    """Count one fire time of ``schedule`` (an agent of ``agent``) and what became of it.

    ``lateness`` (seconds from the nominal fire time plus its jitter to the run's creation) is
    observed only for a ``started`` fire: the other outcomes start no run, so they have no
    start to be late. A negative one (clocks of two hosts a little apart) counts as 0, so the
    histogram's sum stays a sum of delays.
    """
    SCHEDULE_FIRES.labels(schedule_label(schedule), outcome).inc()
    if outcome == "started" and lateness is not None:
        SCHEDULE_LATENESS.labels(agent_label(agent)).observe(max(0.0, lateness))


def schedule_run_ended(schedule: str, status: TerminalStatus) -> None:
    """Count the end of a run that ``schedule`` started (``SojournScheduleFailing`` compares
    the failed ones with the completed ones)."""
    SCHEDULE_RUNS.labels(schedule_label(schedule), status).inc()


# --- watchdogs -------------------------------------------------------------------------------

WATCHDOG_ACTIONS = Counter(
    "sojourn_watchdog_actions",
    "Actions watchdogs took (a re-wake of a stalled, orphaned or overdue run), counted once "
    "across all watchdogs of a deployment.",
    ["action", "liveness"],
)


class _Gauges(Protocol):
    def gauges(self) -> Iterable[Metric]: ...


class _LiveCollector(Collector):
    """Gauges computed at scrape time from the live objects registered with it."""

    def __init__(self, families: Callable[[list[Any]], Iterable[Metric]]) -> None:
        self._objects: weakref.WeakSet[Any] = weakref.WeakSet()
        self._families = families

    def add(self, obj: Any) -> None:
        self._objects.add(obj)

    def discard(self, obj: Any) -> None:
        self._objects.discard(obj)

    def collect(self) -> Iterator[Metric]:
        yield from self._families(list(self._objects))

    def describe(self) -> Iterator[Metric]:
        yield from self._families([])


def _worker_families(workers: list[Any]) -> Iterable[Metric]:
    active = GaugeMetricFamily(
        "sojourn_worker_active_runs", "Activations executing in this process now."
    )
    active.add_metric([], float(sum(len(w._active) for w in workers)))
    capacity = GaugeMetricFamily(
        "sojourn_worker_capacity", "Activations this process may execute at once."
    )
    capacity.add_metric([], float(sum(w.concurrency for w in workers)))
    timers = GaugeMetricFamily(
        "sojourn_in_process_timers",
        "Timers this process keeps (of runs it parked with a deadline in the next minutes).",
    )
    timers.add_metric([], float(sum(len(w.timers) for w in workers)))
    commits = [w.store.commits for w in workers]  # tracked once started: a store each
    batches = CounterMetricFamily(
        "sojourn_append_batches", "Atomic batches of appends stored (group commit)."
    )
    batches.add_metric([], float(sum(c.batches for c in commits)))
    batched = CounterMetricFamily("sojourn_appends_batched", "Appends stored in those batches.")
    batched.add_metric([], float(sum(c.batched for c in commits)))
    return [active, capacity, timers, batches, batched]


def _watchdog_families(watchdogs: list[_Gauges]) -> Iterable[Metric]:
    if not watchdogs:
        from sojourn.projections.model import gauge_families

        return gauge_families(None)
    return watchdogs[0].gauges()


def _projector_families(projectors: list[Any]) -> Iterable[Metric]:
    """The projectors of this process (``sojourn.projections.projector.Projector``), summed;
    normally one."""
    lag = GaugeMetricFamily(
        "sojourn_projector_lag_events",
        "Decisions in the events stream this projector has not made views of yet (written, "
        "for the leader; folded, for the others).",
    )
    lag_s = GaugeMetricFamily(
        "sojourn_projector_lag_seconds",
        "Stored time of the newest event minus that of the last one this projector handled "
        "(0 when caught up).",
    )
    leader = GaugeMetricFamily(
        "sojourn_projector_leader", "1 while this process leads the projectors (writes views)."
    )
    views = CounterMetricFamily(
        "sojourn_projector_views_written", "Run views written to the runs KV bucket."
    )
    changes = CounterMetricFamily(
        "sojourn_projector_changes_published",
        "Change messages published on <prefix>.runs.<agent>.<run_id>.",
    )
    rows = CounterMetricFamily(
        "sojourn_projector_rows_written", "Rows written to this projector's SQLite read model."
    )
    malformed = CounterMetricFamily(
        "sojourn_projector_malformed",
        "Inbox messages, dead letters and event messages the projector skipped because they "
        "could not be read.",
        labels=["source"],
    )
    rebuild = GaugeMetricFamily(
        "sojourn_projector_rebuild_seconds",
        "How long the last --rebuild took (absent until one finished).",
    )
    lag.add_metric([], float(sum(p.lag_events for p in projectors)))
    lag_s.add_metric([], max((p.lag_seconds for p in projectors), default=0.0))
    leader.add_metric([], float(any(p.leading for p in projectors)))
    views.add_metric([], float(sum(p.views_written for p in projectors)))
    changes.add_metric([], float(sum(p.changes_published for p in projectors)))
    rows.add_metric([], float(sum(p.rows_written for p in projectors)))
    for source in ("inbox", "dlq", "events"):
        malformed.add_metric([source], float(sum(p.malformed[source] for p in projectors)))
    took = [p.rebuild_seconds for p in projectors if p.rebuild_seconds is not None]
    if took:
        rebuild.add_metric([], max(took))
    return [lag, lag_s, leader, views, changes, rows, malformed, rebuild]


_workers = _LiveCollector(_worker_families)
_watchdogs = _LiveCollector(_watchdog_families)
_projectors = _LiveCollector(_projector_families)
REGISTRY.register(SPEND_RECENT)
REGISTRY.register(_workers)
REGISTRY.register(_watchdogs)
REGISTRY.register(_projectors)


def track_worker(worker: Any, on: bool = True) -> None:
    (_workers.add if on else _workers.discard)(worker)


def track_watchdog(watchdog: _Gauges, on: bool = True) -> None:
    (_watchdogs.add if on else _watchdogs.discard)(watchdog)


def track_projector(projector: Any, on: bool = True) -> None:
    (_projectors.add if on else _projectors.discard)(projector)
