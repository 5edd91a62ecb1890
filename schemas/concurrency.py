"""Concurrency keys (decision 0048): at most ``limit`` live runs per (agent, key), fleet-wide.

A start may name a concurrency key and a limit (``StartTrigger.concurrency``), or its agent
may declare one (``Agent(concurrency=Concurrency(key=..., limit=...))``, the key taken from
the run's input). A run is **live** from its admission to its end (completed, failed or
cancelled; a run that continues as new passes its slot on to the next run of its chain): a
waiting or sleeping run holds its slot. A start that finds every slot of its key taken is
**queued**: its run exists (``RunStarted.concurrency`` with a ``ticket``), shows ``pending``
(``queued on key K, position P``) and holds nothing until a slot frees, in the order the
queue received them.

Keys are hostile data: 1 to ``KEY_MAX_BYTES`` bytes of UTF-8 without control characters,
never a subject token (``key_token`` hashes them); limits are whole numbers from 1 to
``LIMIT_MAX``. Pure: the bodies, the records the broker keeps, and the rules; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from .flow import KEY_MAX_BYTES, key_fault, key_token

__all__ = [
    "HOLDERS_MAX",
    "KEY_MAX_BYTES",
    "LIMIT_MAX",
    "Concurrency",
    "ConcurrencyBody",
    "QueueEntry",
    "QueueListing",
    "QueuedRun",
    "SlotHolder",
    "SlotsRecord",
    "concurrency_fault",
    "key_token",
    "limit_fault",
    "queued_detail",
    "with_holder",
    "without_holder",
]

LIMIT_MAX: Final = 1000
"""The highest limit of one key: its slots record names every holder, so it stays small (at
most ``LIMIT_MAX`` run ids of at most 128 characters, well under a message's size)."""

HOLDERS_MAX: Final = LIMIT_MAX
"""Holders a slots record names at most (a record beyond it is not one a worker wrote)."""


class ConcurrencyBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """``StartTrigger.concurrency``: run at most ``limit`` runs of the agent started with
    ``key`` at once; a start beyond it is queued until a slot frees."""

    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Concurrency:
    """An agent's concurrency key, declared with it: ``key`` takes the run's input (decoded as
    the agent's input type) and returns the key (a string; ``None``: this run is not limited);
    ``limit`` is the most runs live at once per key.

    ``Agent(..., concurrency=Concurrency(key=lambda input: input.tenant, limit=5))``
    """

    key: Callable[[Any], str | None]
    limit: int

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise TypeError("Concurrency(key=...) is a function of the run's input")
        why = limit_fault(self.limit)
        if why is not None:
            raise ValueError(why)


class SlotHolder(msgspec.Struct, frozen=True, array_like=True):
    """A run holding a slot of its key: its id (a chain's first run: the chain keeps the
    slot), the inbox sequence of the start that took it (0: admitted from the queue) and when."""

    run_id: str
    inbox_seq: int
    since: float


class SlotsRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The one message on ``<prefix>.schedule.flow.slots.<agent>.<key_token>``: the runs that
    hold a slot of the key, every write a compare-and-set on the subject's sequence."""

    agent: str
    key: str
    limit: int
    """The limit of the start (or queued run) that wrote the record last."""
    holders: tuple[SlotHolder, ...] = ()
    updated_at: float = 0.0

    def holds(self, run_id: str) -> bool:
        return any(h.run_id == run_id for h in self.holders)


class QueueEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The one message on ``<prefix>.schedule.flow.queue.<agent>.<key_token>.<run_id>``: a run
    waiting for a slot of its key. Its stream sequence is the run's place in the queue (its
    ``ticket``): the oldest entry is admitted first."""

    agent: str
    key: str
    run_id: str
    limit: int
    inbox_seq: int
    """The start that queued it: while that start is still in the inbox, the run may still be
    created (an entry is written before its run)."""
    at: float


class QueuedRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run of a ``QueueListing``."""

    run_id: str
    position: int
    queued_at: float


class QueueListing(msgspec.Struct, frozen=True, kw_only=True):
    """What ``sojourn queue KEY --agent A`` shows: the key's slots and the head of its queue."""

    agent: str
    key: str
    limit: int | None
    """The limit the key's slots record names (``None``: the key never held a slot)."""
    holders: tuple[SlotHolder, ...]
    depth: int
    """Runs queued on the key."""
    queued: tuple[QueuedRun, ...]
    """The first of them, oldest first."""


def limit_fault(limit: object) -> str | None:
    """Why ``limit`` cannot be a concurrency limit, ``None`` when it can."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        return f"a concurrency limit is a whole number, not {type(limit).__name__}"
    if not 1 <= limit <= LIMIT_MAX:
        return f"a concurrency limit is from 1 to {LIMIT_MAX}, not {limit}"
    return None


def concurrency_fault(body: ConcurrencyBody) -> str | None:
    """Why ``body`` cannot limit a start, ``None`` when it can."""
    why = key_fault(body.key)
    if why is not None:
        return f"concurrency key: {why}"
    return limit_fault(body.limit)


def queued_detail(key: str, position: int | None) -> str:
    """How a queued run's status says where it is: ``queued on key K, position P``."""
    shown = key if len(key) <= 64 else key[:61] + "..."
    if position is None:
        return f"queued on key {shown}"
    return f"queued on key {shown}, position {position}"


def with_holder(record: SlotsRecord, holder: SlotHolder, limit: int, at: float) -> SlotsRecord:
    """``record`` with ``holder`` added (once: a run already holding one keeps it)."""
    if record.holds(holder.run_id):
        return record
    return msgspec.structs.replace(
        record, limit=limit, holders=(*record.holders, holder), updated_at=at
    )


def without_holder(record: SlotsRecord, run_id: str, at: float) -> SlotsRecord:
    """``record`` with every slot ``run_id`` holds released."""
    kept = tuple(h for h in record.holders if h.run_id != run_id)
    return msgspec.structs.replace(record, holders=kept, updated_at=at)
