"""Runs a dead worker claimed after its last heartbeat: no beat lists them, so ``take_over``
would not wake them, and they would wait for their trigger's or wake's ack deadline.

Each beat carries ``events_seq``, an events-stream sequence that every decision the worker
writes after the beat lands above (its connection's appends are acknowledged in order). When
the worker dies, the decisions stored above that sequence are read once: a run whose decision
there was written by the dead worker (its activations, ``<worker_id>.<n>``, or its intake,
``intake:<worker_id>``), whose last decision is still the dead worker's and says there is work
to do, is an orphan, and is woken like the runs its beat listed. The fence keeps this safe
should a live worker hold such a run after all.
"""

from __future__ import annotations

import contextlib

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_events
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.events import RunEvent, RunStarted
from sojourn.schemas.health import ActiveRun, WorkerBeat
from sojourn.schemas.lifecycle import has_work
from sojourn.schemas.names import validate_token

__all__ = ["SCAN_MAX", "claimed_after_beat", "written_by"]

SCAN_MAX = 20_000
"""At most this many decisions are read above a dead worker's last beat (about 10 s of a busy
deployment's writes); runs claimed further up wait for their ack deadline, as before."""

_PAGE = 1_000


def written_by(writer: str, worker_id: str) -> bool:
    """Whether a decision's ``Sojourn-Writer`` is the worker's: one of its activations or its
    intake."""
    if writer == f"intake:{worker_id}":
        return True
    head, _, n = writer.rpartition(".")
    return head == worker_id and n.isdigit()


def _events(data: bytes) -> tuple[RunEvent, ...] | None:
    with contextlib.suppress(msgspec.MsgspecError, ValueError):
        return tuple(decode_events(data))
    return None


async def claimed_after_beat(broker: Broker, names: Names, dead: WorkerBeat) -> list[ActiveRun]:
    """The runs ``dead`` claimed after its last beat that still wait for it, each with its
    agent and priority, from its ``RunStarted`` (``""`` and the default when its first decision
    cannot be read)."""
    if dead.events_seq < 0:
        return []
    listed = {r.run_id for r in dead.runs}
    found: dict[str, RunStarted | None] = {}
    seq, read, stream, head = dead.events_seq + 1, 0, names.events_stream, f"{names.prefix}.ev."
    while read < SCAN_MAX:
        msgs, more = await broker.direct_get_batch(stream, names.events_all, seq, _PAGE)
        for m in msgs:
            run_id = m.subject.removeprefix(head)
            if run_id in listed or not written_by(m.header(h.WRITER), dead.worker_id):
                continue
            with contextlib.suppress(InvalidName):
                validate_token(run_id, "run id")
                started = [e for e in _events(m.data) or () if isinstance(e, RunStarted)]
                if started or run_id not in found:
                    found[run_id] = started[0] if started else None
        read += len(msgs)
        if not msgs or not more:
            break
        seq = msgs[-1].seq + 1
    orphans = []
    for run_id, begun in found.items():
        last = await broker.direct_get_last(stream, names.events(run_id))
        if last is None or not written_by(last.header(h.WRITER), dead.worker_id):
            continue  # someone else wrote since: not the dead worker's any more
        events = _events(last.data)
        if events is None or not has_work(events):
            continue
        if begun is None:
            first = await broker.direct_get_next(stream, names.events(run_id), 1)
            opening = _events(first.data) if first is not None else None
            if opening and isinstance(opening[0], RunStarted):
                begun = opening[0]
        if begun is None:
            orphans.append(ActiveRun(run_id, ""))
        else:
            orphans.append(ActiveRun(run_id, begun.agent, 0.0, begun.priority))
    return orphans
