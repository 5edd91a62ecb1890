"""Snapshots of folded state: a wake folds only what came after the last one.

A worker's history cache (``EventStore``, docs/decisions/0008) saved a wake the network, not
the work: the activation folded the whole history again every time, and so did the intake for
every signal it recorded. Now the store also keeps, per run, a ``Snapshot``: the state the
history folded to (``RunState`` is immutable, so sharing it is safe) up to a sequence, plus the
signal ids and intake Msg-Ids the intake deduplicates by. The next reader folds only the
decisions after it: ``fold(tail, state)`` equals ``fold(prefix + tail)`` because the fold is a
left fold over events. An activation's snapshot is of the history as loaded, so it never
includes what the activation then does live (its own operations are not folded while it runs).

The folds are pure; ``current`` reads what came after a snapshot through the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sojourn.broker.eventstore import Decision, EventStore
from sojourn.schemas.events import SignalReceived

from ..core.state import RunState, fold
from .values import has_refs

__all__ = [
    "INTAKE_MARK",
    "SNAPSHOT_EVENTS",
    "Snapshot",
    "as_snapshot",
    "current",
    "fold_after",
    "fold_history",
    "keep",
]

SNAPSHOT_EVENTS = 300_000
"""Events folded into the snapshots a worker keeps, in all (``EventStore(snapshot_weight)``):
about 0.1 KB of Python objects per event plus the stored values the folds refer to, so at
most some 60 MB in the worst case (one run of 150,000 steps); typical runs weigh tens."""

INTAKE_MARK = ":signal:"
"""In the Msg-Id of every decision the intake records for an inbox message
(``<run_id>:signal:<inbox_seq>``)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A run's history folded up to and including the decision ``seq``."""

    seq: int
    state: RunState
    refs: bool = False
    """Whether those decisions hold values by reference (the activation then reads them back
    and folds the whole history again, resolved): kept so that the next fold need not look."""
    signal_ids: frozenset[str] = frozenset()
    """The id of every signal those decisions recorded (the intake records one id once)."""
    intake_ids: frozenset[str] = frozenset()
    """The Msg-Ids of those decisions the intake wrote for inbox messages (``:signal:``):
    a redelivered message is recorded once."""


def fold_history(history: Sequence[Decision], snapshot: Snapshot | None = None) -> Snapshot:
    """``history`` folded, from ``snapshot`` when it is of a prefix of ``history`` (else from
    the start). The result is the snapshot of the whole ``history``."""
    if snapshot is not None and history and snapshot.seq <= history[-1].seq:
        at = _index_after(history, snapshot.seq)
        if at is not None:
            return fold_after(snapshot, history[at:])
    return fold_after(None, history)


def fold_after(snapshot: Snapshot | None, tail: Sequence[Decision]) -> Snapshot:
    """``snapshot`` (``None``: nothing yet) with ``tail``, the decisions after it, folded in."""
    base = snapshot or Snapshot(0, RunState())
    if not tail:
        return base
    events = [e for d in tail for e in d.events]
    signals = [e.signal_id for e in events if isinstance(e, SignalReceived)]
    intake = [d.msg_id for d in tail if INTAKE_MARK in d.msg_id]
    return Snapshot(
        tail[-1].seq,
        fold(events) if snapshot is None else fold(events, base.state),
        base.refs or has_refs(events),
        base.signal_ids.union(signals) if signals else base.signal_ids,
        base.intake_ids.union(intake) if intake else base.intake_ids,
    )


def _index_after(history: Sequence[Decision], seq: int) -> int | None:
    """The index of the first decision after ``seq``, if ``seq`` is a decision of
    ``history`` (searched from the end: a snapshot is usually of a recent prefix)."""
    for i in range(len(history) - 1, -1, -1):
        s = history[i].seq
        if s == seq:
            return i + 1
        if s < seq:
            return None
    return None


def as_snapshot(kept: tuple[int, object] | None) -> Snapshot | None:
    """What the store kept (``EventStore.snapshot``, opaque there), if one of ours."""
    if kept is None or not isinstance(kept[1], Snapshot) or kept[1].seq != kept[0]:
        return None
    return kept[1]


def keep(store: EventStore, run_id: str, snapshot: Snapshot) -> None:
    """Keep ``snapshot`` in the store, weighed by the events it folded."""
    if snapshot.seq:
        store.keep_snapshot(run_id, snapshot.seq, snapshot, max(1, snapshot.state.events))


async def current(store: EventStore, run_id: str) -> Snapshot | None:
    """The run's history folded up to its last decision (``None``: no history): from the
    store's snapshot plus the decisions after it when there is one (no read of the whole
    history), else from the history (through the store's cache). Kept for the next reader.

    Raises:
        HistoryError: a decision cannot be decoded.
        BrokerUnavailable / JetStreamError: the history could not be read.
    """
    snap = as_snapshot(store.snapshot(run_id))
    if snap is not None:
        snap = fold_after(snap, await store.load(run_id, after_seq=snap.seq))
    else:
        history = await store.history(run_id)
        if not history:
            return None
        snap = fold_history(history)
    keep(store, run_id, snap)
    return snap
