"""Shared rate limits, decided without I/O: the generic cell rate algorithm over a limit's
record (decision 0046).

A limit of ``N`` requests per period ``P`` spaces its grants ``T = ceil(P / N)`` nanoseconds
apart (``burst`` - 1 of them may come early, no more): the record keeps the *theoretical
arrival time* of the next request (``requests_tat``), and a reservation of ``n`` requests takes
the next ``n`` slots from it, each ``T`` after the last, never before now or the end of a block.
So in any window of length ``W`` at most ``ceil(W / T) + burst - 1`` slots begin: 600/min gives
at most 100 in any 10 s. Tokens are charged after the request, from its recorded usage, onto
``tokens_tat`` (``ceil(P / M)`` ns per token): a bucket of one period's tokens; a request gets no
slot while it is overdrawn. A block (a provider's 429) moves every slot past its end and
raises the epoch, so a grant made before it whose slot it covers asks again.

``SharedLimits`` (``actors/worker/limits.py``) reads and writes the records; the run machine
(``StepTurn``) decides with ``usable`` whether a recorded grant still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from sojourn.schemas.limits import NS, Limit, LimitRecord

__all__ = [
    "LIMIT_GRACE",
    "LIMIT_SLEEP_MAX",
    "Grant",
    "block",
    "charge",
    "declare",
    "reserve",
    "unblock",
    "usable",
]

LIMIT_SLEEP_MAX: Final = 0.5
"""Seconds to a slot an activation waits out in the process; a run whose slot is further away
parks (no worker holds it) and a timer wakes it at the slot."""

LIMIT_GRACE: Final = 5.0
"""Seconds after its slot a grant may still be used (a run woken by the broker's timer copy
after its worker died is a few seconds late); later, the run asks for a new slot."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A slot of a limit: the attempt may start at ``slot`` (unix seconds); ``epoch`` is the
    limit's block epoch when it was granted."""

    limit: str
    slot: float
    epoch: int


def reserve(rec: LimitRecord, now: float, count: int) -> tuple[LimitRecord, list[Grant]]:
    """Take the next ``count`` slots of ``rec`` at ``now``: the record to write (compare-and-
    set) and the grants, in order."""
    if count < 1:
        return rec, []
    limit = rec.limit
    now_ns = int(now * NS)
    earliest = max(now_ns, rec.blocked_until, _tokens_ready(rec))
    rate = limit.request_rate
    tat = rec.requests_tat
    grants = []
    if rate is None:  # tokens only: no spacing of requests
        grants = [Grant(rec.name, earliest / NS, rec.epoch)] * count
    else:
        step = rate.interval_ns
        early = (limit.burst - 1) * step
        for _ in range(count):
            slot = max(earliest, tat - early)
            grants.append(Grant(rec.name, slot / NS, rec.epoch))
            tat = max(tat, slot) + step
    new = msgspec.structs.replace(rec, requests_tat=tat, granted=rec.granted + count)
    return new, grants


def _tokens_ready(rec: LimitRecord) -> int:
    """When the tokens charged so far leave room for a request (ns): a bucket of one
    period's tokens."""
    rate = rec.limit.token_rate
    if rate is None:
        return 0
    return rec.tokens_tat - (rate.period_ns - rate.interval_ns)


def charge(rec: LimitRecord, now: float, tokens: int) -> LimitRecord:
    """Charge ``tokens`` (a request's recorded usage) to ``rec`` at ``now``."""
    rate = rec.limit.token_rate
    if rate is None or tokens <= 0:
        return rec
    start = max(rec.tokens_tat, int(now * NS))
    return msgspec.structs.replace(rec, tokens_tat=start + tokens * rate.interval_ns)


def block(rec: LimitRecord, until: float) -> LimitRecord:
    """No slot begins before ``until`` (unix seconds): a provider answered 429. Raises the
    epoch, so grants made before whose slots fall in the block ask again."""
    until_ns = int(until * NS)
    return msgspec.structs.replace(
        rec,
        blocked_until=max(rec.blocked_until, until_ns),
        requests_tat=max(rec.requests_tat, until_ns),
        epoch=rec.epoch + 1,
        blocks=rec.blocks + 1,
    )


def unblock(rec: LimitRecord) -> LimitRecord:
    """Lift a block (an operator's ``sojourn limit NAME --unblock``); slots granted since
    keep their times."""
    return msgspec.structs.replace(rec, blocked_until=0)


def declare(
    rec: LimitRecord | None,
    name: str,
    limit: Limit,
    *,
    by: str,
    declared: bool,
    now: float,
) -> LimitRecord | None:
    """The record after a declaration (``declared``: by a worker's configuration) or an
    operator's ``set`` of ``limit``; ``None`` when nothing changes. A declaration never
    overrules an operator's setting, nor another declaration: it only creates the limit."""
    if rec is None:
        return LimitRecord(name=name, limit=limit, set_by=by, declared=declared, updated_at=now)
    if declared or (rec.limit == limit and not rec.declared):
        return None
    return msgspec.structs.replace(rec, limit=limit, set_by=by, declared=False, updated_at=now)


def usable(grant: Grant, rec: LimitRecord | None, now: float) -> bool:
    """Whether an attempt may still start on ``grant`` at ``now`` (its slot may be ahead): not
    overtaken by a block that covers its slot, and not missed by more than ``LIMIT_GRACE``."""
    if now > grant.slot + LIMIT_GRACE:
        return False
    if rec is None:
        return True
    return not (rec.epoch > grant.epoch and int(grant.slot * NS) < rec.blocked_until)
