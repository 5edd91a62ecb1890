"""The chaos harness's checker: the invariants of docs/chaos.md, on histories the harness read
and the effect store's tables.

``check_run`` checks one run's history (invariants 1-5: not lost, ended, positions contiguous,
no anomalies, every attempt settled) and returns how each step attempt ended; ``check_effects``
checks the effect store against those outcomes (6 and 7: exactly one effect per step, no
execution without its start recorded); ``check_watchdog`` compares a watchdog's run model with
the histories (8). Each adds what it finds to a ``Report``; only ``check_effects`` reads a file
(the SQLite database), and only ``check_watchdog`` awaits (the watchdog's next judgement).
``bench/chaos.py`` runs them after every harness run; ``tests/test_chaos.py`` runs them on
hand-made histories too.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from sojourn.actors import Watchdog, fold
from sojourn.broker.eventstore import Decision
from sojourn.schemas.events import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitCompleted,
    WaitStarted,
)

from .chaos_agents import GATE, STEP

__all__ = ["OP_EVENTS", "TERMINAL", "Report", "check_effects", "check_run", "check_watchdog"]

TERMINAL = (RunCompleted, RunFailed, RunCancelled)
OP_EVENTS = (StepStarted, StepCompleted, StepFailed, WaitStarted, WaitCompleted)


@dataclass
class Report:
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    ended_otherwise: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    steps_expected: int = 0
    effects_per_step: Counter[int] = field(default_factory=Counter)
    effects_per_open_step: Counter[int] = field(default_factory=Counter)
    executions: int = 0
    effects: int = 0
    reexec_by_reason: Counter[str] = field(default_factory=Counter)
    in_doubt: int = 0
    failed_attempts: int = 0
    attempts: int = 0
    timer_waits: int = 0
    gate_latencies: list[float] = field(default_factory=list)
    decisions: int = 0
    events: int = 0

    def violate(self, text: str) -> None:
        self.violations.append(text)


def check_run(
    run_id: str, history: list[Decision], steps: int, report: Report, gate: bool = False
) -> dict[tuple[int, int], str]:
    """Check one run's history; return how each recorded step attempt ended:
    ``completed``, ``failed`` (retried), ``in_doubt`` (superseded by attempt + 1), or
    ``open`` (never settled)."""
    v = report.violate
    events = [e for d in history for e in d.events]
    report.decisions += len(history)
    report.events += len(events)
    outcome: dict[tuple[int, int], str] = {}
    if not history:
        report.lost.append(run_id)
        return outcome
    seqs = [d.seq for d in history]
    if seqs != sorted(set(seqs)):
        v(f"{run_id}: stream sequences not strictly increasing: {seqs}")
    if not isinstance(events[0], RunStarted):
        v(f"{run_id}: first event is {type(events[0]).__name__}, not RunStarted")
    if sum(isinstance(e, RunStarted) for e in events) != 1:
        v(f"{run_id}: {sum(isinstance(e, RunStarted) for e in events)} RunStarted events")

    # Positions are contiguous: each operation event is at a known position or the next one.
    top = -1
    for e in events:
        if isinstance(e, OP_EVENTS):
            if e.position > top + 1:
                v(f"{run_id}: {type(e).__name__} at position {e.position} after {top} (gap)")
            top = max(top, e.position)

    # Exactly one terminal event, RunCompleted, and nothing after it.
    ends = [i for i, e in enumerate(events) if isinstance(e, TERMINAL)]
    if not ends:
        report.stuck.append(run_id)
    elif len(ends) > 1:
        v(f"{run_id}: {len(ends)} terminal events")
    if ends:
        end = events[ends[0]]
        if ends[-1] != len(events) - 1:
            v(f"{run_id}: events after the terminal event")
        if isinstance(end, RunCompleted):
            report.completed += 1
            got = msgspec.json.decode(bytes(end.output))
            if got != list(range(steps)):
                v(f"{run_id}: output {got!r}, expected {list(range(steps))!r}")
        else:
            detail = getattr(end, "error", None) or getattr(end, "reason", "")
            report.ended_otherwise.append(f"{run_id}: {type(end).__name__} {detail}")
            v(f"{run_id}: ended with {type(end).__name__}: {detail}")

    state = fold(events)
    if state.anomalies != ():
        v(f"{run_id}: fold anomalies {list(state.anomalies)}")

    # Every started attempt is settled: completed, failed with a retry, or in doubt (a later
    # attempt exists); attempts are 1, 2, 3... at each position.
    gate_at = 2 * steps - 1
    gates = 0
    gate_sent: float | None = None
    gate_parked = False
    starts: dict[int, list[int]] = defaultdict(list)
    completed: dict[int, list[int]] = defaultdict(list)
    failed: dict[int, list[StepFailed]] = defaultdict(list)
    for e in events:
        if isinstance(e, StepStarted):
            if e.name != STEP or e.position % 2:
                v(f"{run_id}: step {e.name!r} started at position {e.position}")
            starts[e.position].append(e.attempt)
        elif isinstance(e, StepCompleted):
            completed[e.position].append(e.attempt)
        elif isinstance(e, StepFailed):
            failed[e.position].append(e)
        elif isinstance(e, WaitStarted):
            want_key = "signal:" + GATE if gate and e.position == gate_at else "sleep"
            if e.position % 2 == 0 or e.key != want_key:
                v(f"{run_id}: wait {e.key!r} at position {e.position}")
            if gate and e.position == gate_at:
                gate_parked = True
        elif isinstance(e, WaitCompleted):
            want_outcome = "signal" if gate and e.position == gate_at else "timeout"
            if e.outcome != want_outcome:
                v(f"{run_id}: wait at {e.position} ended with {e.outcome!r}")
            if want_outcome == "signal" and gate_sent is not None:
                report.gate_latencies.append(max(0.0, e.at - gate_sent))
        elif isinstance(e, SignalReceived):
            gates += 1
            if gate_parked and gate_sent is None:  # it arrived while the run was parked on it
                gate_sent = e.at
    if gate and gates != 1:
        v(f"{run_id}: {gates} gate signals recorded, expected exactly 1")
    for p, attempts in starts.items():
        report.attempts += len(attempts)
        if attempts != list(range(1, len(attempts) + 1)):
            v(f"{run_id}: position {p} attempts {attempts}, expected 1..{len(attempts)}")
        if len(completed[p]) > 1:
            v(f"{run_id}: position {p} completed {len(completed[p])} times")
        for f in failed[p]:
            if f.retry_at is None:
                v(f"{run_id}: position {p} attempt {f.attempt} failed for good: {f.error.message}")
        done = set(completed[p])
        fails = {f.attempt for f in failed[p]}
        for a in done | fails:
            if a not in attempts:
                v(f"{run_id}: position {p} attempt {a} ended but never started")
        last = max(attempts)
        for a in sorted(set(attempts)):
            if a in done:
                outcome[(p, a)] = "completed"
            elif a in fails:
                outcome[(p, a)] = "failed"
                report.failed_attempts += 1
            elif a < last:
                outcome[(p, a)] = "in_doubt"
                report.in_doubt += 1
            else:
                outcome[(p, a)] = "open"
                if ends:
                    v(f"{run_id}: position {p} attempt {a} started and never settled")
    if ends and isinstance(events[ends[0]], RunCompleted):
        for i in range(steps):
            if not completed.get(2 * i):
                v(f"{run_id}: completed without step {i} (position {2 * i}) completed")
        kinds = [(op.kind, op.status) for op in state.ops]
        want = [
            ("step", "completed") if p % 2 == 0 else ("wait", "completed")
            for p in range(2 * steps - 1 + int(gate))
        ]
        if kinds != want:
            v(f"{run_id}: operations {kinds}, expected {want}")
    report.timer_waits += sum(isinstance(e, WaitCompleted) for e in events)
    return outcome


def check_effects(
    db_path: Path,
    histories: dict[str, list[Decision]],
    outcomes: dict[str, dict[tuple[int, int], str]],
    steps: int,
    report: Report,
) -> None:
    """Exactly one effect per (run, step position); every raw execution had its start recorded."""
    v = report.violate
    db = sqlite3.connect(str(db_path))
    try:
        effects = db.execute("SELECT key, run, step FROM effects").fetchall()
        execs = db.execute("SELECT key, run, step, attempt FROM executions").fetchall()
    finally:
        db.close()
    report.effects, report.executions = len(effects), len(execs)
    per_step = Counter((run, step) for _, run, step in effects)
    wrong_key = [key for key, run, step in effects if key != f"{run}/{step}"]
    if wrong_key:
        v(
            f"{len(wrong_key)} effect(s) applied under a key that is not their step's "
            f"idempotency key <run>/<position>, e.g. {wrong_key[:3]}"
        )
    strays = [
        key
        for key, run, step in effects
        if run not in histories or step % 2 or not 0 <= step < 2 * steps
    ]
    if strays:
        v(f"{len(strays)} effect(s) not of a step of any run, e.g. {strays[:3]}")
    for run_id in histories:
        done = {p for (p, _), how in outcomes.get(run_id, {}).items() if how == "completed"}
        for i in range(steps):
            n = per_step.get((run_id, 2 * i), 0)
            if 2 * i in done:
                report.steps_expected += 1
                report.effects_per_step[n] += 1
            else:  # a step of a stuck run that never completed
                report.effects_per_open_step[n] += 1
            # A step recorded as completed applied its effect exactly once; a step of a stuck
            # run that never completed may have applied it once or not yet, never twice.
            if n > 1 or (n == 0 and 2 * i in done):
                v(f"{run_id}: step {i} (position {2 * i}) applied its effect {n} times")
    per_attempt = Counter((run, step, attempt) for _, run, step, attempt in execs)
    for (run, step, attempt), n in per_attempt.items():
        how = outcomes.get(run, {}).get((step, attempt))
        if how is None:
            v(f"{run}: position {step} attempt {attempt} ran without its start recorded")
            continue
        if n > 1:
            v(f"{run}: position {step} attempt {attempt} ran {n} times")
        if how == "completed":
            report.reexec_by_reason["completed attempt (the one that counts)"] += 1
        elif how == "failed":
            report.reexec_by_reason["failed attempt, retried"] += n
        elif how == "in_doubt":
            report.reexec_by_reason["in-doubt attempt, run again"] += n
        else:
            report.reexec_by_reason["attempt never settled"] += n
    if report.executions < report.effects:
        v(f"executions ({report.executions}) < effects ({report.effects})")


async def check_watchdog(
    watchdog: Watchdog, histories: dict[str, list[Decision]], report: Report
) -> None:
    """The watchdog's run model equals the histories: a run it still holds as live must not
    have ended, and every run that has not ended must be in it (after it has read everything)."""
    try:
        async with asyncio.timeout(60):
            while True:
                await watchdog.wait_scanned()
                if watchdog.model.caught_up and watchdog.model.lag_events == 0:
                    break
    except TimeoutError:
        report.violate("watchdog: its run model did not catch up within 60 s")
        return
    live = set(watchdog.model.runs)
    for run_id, h in histories.items():
        ended = fold(e for d in h for e in d.events).terminal
        if ended and run_id in live:
            report.violate(f"{run_id}: ended, but the watchdog's model holds it as live")
        if not ended and h and run_id not in live:
            report.violate(f"{run_id}: not ended, but missing from the watchdog's model")
