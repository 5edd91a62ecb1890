"""The places of queued runs in their concurrency keys' queues (decision 0048), as the
projector counts them from the live runs it follows (pure).

A run queued at its start carries its ticket (its queue entry's sequence: the order the key
admits in); it is queued while it waits on ``queue:<key>``. Its position is one more than the
number of runs of the same agent and key queued with a smaller ticket."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from sojourn.schemas.concurrency import queued_detail
from sojourn.schemas.lifecycle import queued_on
from sojourn.schemas.views import RunView

from .summary import RunSummary

__all__ = ["POSITION_REWRITES_MAX", "depths", "placed", "positions"]

POSITION_REWRITES_MAX = 2000
"""Views one periodic pass rewrites at most for a changed queue position (the rest follow on
the next passes): a long queue moving costs a bounded number of writes per pass."""


def positions(runs: Iterable[RunSummary]) -> dict[str, tuple[str, int]]:
    """Each queued run's key and position (1: next to take a slot of its key)."""
    queues: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for s in runs:
        key = queued_on(s.waiting_on) if s.status == "pending" else None
        if key is None or not s.queue_ticket:
            continue
        queues.setdefault((s.agent, key), []).append((s.queue_ticket, s.run_id))
    out: dict[str, tuple[str, int]] = {}
    for (_, key), queued in queues.items():
        queued.sort()
        for i, (_, run_id) in enumerate(queued, 1):
            out[run_id] = (key, i)
    return out


def depths(runs: Iterable[RunSummary]) -> dict[str, tuple[int, int]]:
    """Per agent: how many of its runs are queued (all keys), and its deepest key's queue."""
    per_key: dict[tuple[str, str], int] = {}
    for s in runs:
        key = queued_on(s.waiting_on) if s.status == "pending" else None
        if key is not None:
            per_key[(s.agent, key)] = per_key.get((s.agent, key), 0) + 1
    out: dict[str, tuple[int, int]] = {}
    for (agent, _), n in per_key.items():
        total, deepest = out.get(agent, (0, 0))
        out[agent] = (total + n, max(deepest, n))
    return out


def placed(live: Mapping[str, RunView], where: Mapping[str, tuple[str, int]]) -> dict[str, RunView]:
    """The views of ``live`` whose queue position is not ``where``'s, with it (at most
    ``POSITION_REWRITES_MAX``, the runs next in line first)."""
    changed: list[tuple[int, str, RunView]] = []
    for run_id, (key, position) in where.items():
        view = live.get(run_id)
        if view is None or view.queue_position == position:
            continue
        placed_view = msgspec.structs.replace(
            view, detail=queued_detail(key, position), queue_position=position
        )
        changed.append((position, run_id, placed_view))
    changed.sort(key=lambda c: (c[0], c[1]))
    return {run_id: v for _, run_id, v in changed[:POSITION_REWRITES_MAX]}
