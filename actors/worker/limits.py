"""Shared rate limits as one worker uses them (decision 0046).

``SharedLimits`` keeps every limit's record as this worker last saw it (read at start, then
followed by a core subscription and read again every ``REFRESH_EVERY`` seconds:
``worker/follower.py``), declares the limits the worker's agents and configuration name, and
makes every change to a record a compare-and-set on its subject (``broker/limits.py``), computed
by the pure rate algorithm (``actors/core/ratelimit.py``). Requests are coalesced per limit:
whatever the activations of this worker asked for while one write was in flight (slots, token
charges, a block) goes out in the next single write, so one round trip grants a batch and the
limit's throughput does not fall with the number of runs that share it. No grant is kept in
memory: a slot is the record's, and a worker that dies loses nothing but the slots it had handed
out and not used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, StoredMessage
from sojourn.broker.limits import LimitStore, read_limit
from sojourn.broker.names import InboxSubject, Names
from sojourn.schemas.codec import decode_limit_record, decode_limit_request, encode
from sojourn.schemas.errors import ConcurrencyConflict, UnknownLimit
from sojourn.schemas.limits import (
    LIMIT_BLOCK_MAX,
    LIMITS_MAX,
    Limit,
    LimitAnswer,
    LimitRecord,
)

from ..core.ratelimit import Grant, block, charge, declare, reserve, unblock
from ..ops import metrics as _metrics
from .clock import Clock
from .follower import RecordFollower
from .refusals import Rejected, reply

__all__ = ["SharedLimits"]

log = logging.getLogger("sojourn.actors.worker.limits")

WRITE_TRIES = 100
"""Compare-and-set attempts of one write before its callers get the conflict."""

Change = Callable[[LimitRecord], LimitRecord]


@dataclass(slots=True)
class _Pending:
    """What this worker's activations asked of one limit since its last write."""

    slots: list[asyncio.Future[Grant]] = field(default_factory=list)
    tokens: int = 0
    block_until: float = 0.0
    blocked: list[asyncio.Future[None]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.slots or self.tokens or self.blocked)


class SharedLimits:
    """The shared rate limits as this worker knows them, and its writes to them."""

    def __init__(
        self,
        broker: Broker,
        names: Names,
        writer: str,
        clock: Clock,
        declared: Mapping[str, Limit] | None = None,
    ) -> None:
        self.broker = broker
        self.names = names
        self.writer = writer
        self.clock = clock
        self.store = LimitStore(broker, names)
        self.declared: dict[str, Limit] = dict(declared or {})
        """The limits this worker's agents and configuration declare."""
        self.table: dict[str, LimitRecord] = {}
        self._seqs: dict[str, int] = {}
        """The subject sequence of the record in ``table`` when this worker wrote or read it
        (a compare-and-set starts from it; a notice does not know it)."""
        self._pending: dict[str, _Pending] = {}
        self._writing: set[str] = set()
        self._records = RecordFollower(
            broker,
            names.agents_stream,
            names.limits_all,
            on_stored=self._on_stored,
            on_notice=self._on_notice,
            what="the limits",
        )

    def record(self, name: str) -> LimitRecord | None:
        """Limit ``name`` as this worker knows it now (what the run machine checks a grant
        against: a block a provider's 429 imposed since)."""
        return self.table.get(name)

    # --- following the records ---------------------------------------------------------------

    async def start(self) -> None:
        """Read every limit, follow them, then declare this worker's."""
        await self._records.start()
        for name, limit in self.declared.items():
            await self.set(name, limit, by=self.writer, declared=True)

    async def stop(self) -> None:
        await self._records.stop()

    def kill(self) -> None:
        """Stop at once (``Worker.kill``)."""
        self._records.kill()

    def _on_stored(self, m: StoredMessage) -> None:
        rec = read_limit(m)
        if rec is not None and self._newer(rec):
            self.table[rec.name] = rec
            self._seqs[rec.name] = m.seq

    async def _on_notice(self, msg: Delivery) -> None:
        try:
            rec = decode_limit_record(msg.data)
        except msgspec.MsgspecError:
            return  # not a record (anyone may publish without authentication): ignored
        if msg.subject == self.names.limit(rec.name) and self._newer(rec):
            self.table[rec.name] = rec
            self._seqs.pop(rec.name, None)  # its sequence is not known from a notice

    def _newer(self, rec: LimitRecord) -> bool:
        known = self.table.get(rec.name)
        return known is None or rec.version > known.version

    # --- what activations ask ----------------------------------------------------------------

    async def reserve(self, name: str) -> Grant:
        """The next slot of limit ``name`` for one request (it may lie in the future).

        Raises:
            UnknownLimit: nobody declared or set ``name``.
            ConcurrencyConflict, BrokerUnavailable, JetStreamError: it could not be written.
        """
        fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._ask(name).slots.append(fut)
        self._kick(name)
        return await fut

    def charge(self, name: str, tokens: int) -> None:
        """Charge ``tokens`` a request of limit ``name`` used (written in the background; a
        write that fails is logged and counted in ``sojourn_limit_write_failures_total``)."""
        if tokens > 0:
            self._ask(name).tokens += tokens
            self._kick(name)

    async def block(self, name: str, seconds: float | None) -> None:
        """Block limit ``name`` for ``seconds`` (a provider's ``Retry-After``; 1 s when it gave
        none, at most ``LIMIT_BLOCK_MAX``): no request of any worker is granted a slot before
        then, and slots granted earlier that fall in the block are asked for again."""
        wait = 1.0 if seconds is None or not seconds > 0 else min(seconds, LIMIT_BLOCK_MAX)
        pending = self._ask(name)
        pending.block_until = max(pending.block_until, self.clock.now() + wait)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending.blocked.append(fut)
        self._kick(name)
        await fut
        _metrics.LIMIT_BLOCKS.labels(name).inc()

    def _ask(self, name: str) -> _Pending:
        pending = self._pending.get(name)
        if pending is None:
            pending = self._pending[name] = _Pending()
        return pending

    def _kick(self, name: str) -> None:
        if name in self._writing:
            return  # the write in flight takes it next
        self._writing.add(name)
        self._records.later(self._write_loop(name))

    async def _write_loop(self, name: str) -> None:
        """Write what is pending for ``name``, one compare-and-set per round, until nothing
        is."""
        try:
            while self._pending.get(name):
                pending = self._pending.pop(name)
                try:
                    grants = await self._write_pending(name, pending)
                except BaseException as e:
                    _fail(pending, e)
                    if pending.tokens:
                        _metrics.LIMIT_WRITE_FAILURES.labels(name).inc()
                        log.warning("charging %d tokens to limit %r: %s", pending.tokens, name, e)
                    if not isinstance(e, Exception):
                        raise
                    continue
                for fut, grant in zip(pending.slots, grants, strict=True):
                    if not fut.done():
                        fut.set_result(grant)
                for done in pending.blocked:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._writing.discard(name)

    async def _write_pending(self, name: str, pending: _Pending) -> list[Grant]:
        now = self.clock.now()
        grants: list[Grant] = []

        def change(rec: LimitRecord) -> LimitRecord:
            nonlocal grants
            if pending.block_until:
                rec = block(rec, pending.block_until)
            if pending.tokens:
                rec = charge(rec, now, pending.tokens)
            rec, grants = reserve(rec, now, len(pending.slots))
            return rec

        await self._update(name, change)
        if grants:
            series = _metrics.limit_metrics(name)
            series.grants.inc(len(grants))
            for grant in grants:
                series.wait.observe(max(0.0, grant.slot - now))
        return grants

    async def _update(
        self, name: str, change: Change, *, create: Limit | None = None, by: str = ""
    ) -> None:
        """Apply ``change`` to limit ``name``'s record by compare-and-set, reading the record
        again after a conflict. A limit with no record is created from ``create`` (an
        operator's, ``by``), else from this worker's declaration.

        Raises:
            UnknownLimit: there is no record and nothing to create it from.
            ConcurrencyConflict: ``WRITE_TRIES`` conflicts in a row.
        """
        for _ in range(WRITE_TRIES):
            rec, seq = self.table.get(name), self._seqs.get(name)
            if rec is None or seq is None:
                rec, seq = await self.store.get(name)
            if rec is None:
                base = create or self.declared.get(name)
                if base is None:
                    raise UnknownLimit(
                        f"no limit {name!r} is declared: declare it (Agent(limits=...), "
                        f"Worker(limits=...)) or set it (`sojourn limit {name} --requests "
                        "500/min`)"
                    )
                if seq == 0 and len(self.table) >= LIMITS_MAX:
                    raise UnknownLimit(f"a deployment has at most {LIMITS_MAX} limits")
                declared = create is None
                setter = self.writer if declared else by
                rec = declare(None, name, base, by=setter, declared=declared, now=self.clock.now())
                assert rec is not None
            new = change(rec)
            new = msgspec.structs.replace(new, version=rec.version + 1)
            try:
                seq = await self.store.put(new, seq)
            except ConcurrencyConflict:
                self._seqs.pop(name, None)
                _metrics.limit_metrics(name).conflicts.inc()
                continue
            self.table[name] = new
            self._seqs[name] = seq
            return
        raise ConcurrencyConflict(
            f"limit {name!r}: {WRITE_TRIES} writes in a row lost to others", run_id=name, expected=0
        )

    async def set(self, name: str, limit: Limit, *, by: str, declared: bool) -> LimitRecord:
        """Declare (``declared``: only creates it) or set limit ``name``'s rate; the record."""
        now = self.clock.now()
        same = {"changed": False}

        def change(rec: LimitRecord) -> LimitRecord:
            new = declare(rec, name, limit, by=by, declared=declared, now=now)
            same["changed"] = new is not None
            return rec if new is None else new

        rec = self.table.get(name)
        if declared and rec is not None:
            if rec.limit != limit:
                log.warning(
                    "limit %r is %s here but %s in the deployment (set by %s): the "
                    "deployment's holds; `sojourn limit %s` changes it",
                    name,
                    _text(limit),
                    _text(rec.limit),
                    rec.set_by or "?",
                    name,
                )
            return rec
        await self._update(name, change, create=None if declared else limit, by=by)
        return self.table[name]

    # --- an operator's requests --------------------------------------------------------------

    async def handle_request(self, msg: Delivery, inbox: InboxSubject) -> None:
        """Carry out a ``LimitRequest`` (set, block, unblock), answer it and settle ``msg``.

        Raises:
            Rejected: not a limit request, or one that cannot be carried out.
        """
        try:
            req = decode_limit_request(msg.data)
        except msgspec.ValidationError as e:
            raise Rejected("invalid_limit", f"not a limit request: {e}") from e
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"request is not valid JSON: {e}") from e
        name, by = inbox.target, inbox.sender or ""
        try:
            if req.action == "set":
                if req.limit is None:
                    raise Rejected("invalid_limit", "a set names the limit's rates: limit")
                await self.set(name, req.limit, by=by, declared=False)
            elif req.action == "block":
                seconds = req.seconds
                if seconds is None or not 0 < seconds <= LIMIT_BLOCK_MAX:
                    raise Rejected(
                        "invalid_limit",
                        f"a block lasts more than 0 and at most {LIMIT_BLOCK_MAX} s",
                    )
                until = self.clock.now() + seconds
                await self._update(name, lambda rec: block(rec, until))
            else:
                await self._update(name, unblock)
        except UnknownLimit as e:
            raise Rejected("unknown_limit", e.message) from e
        answer = LimitAnswer(record=self.table[name])
        await reply(self.broker, msg, encode(answer))
        await msg.ack()


def _fail(pending: _Pending, e: BaseException) -> None:
    """Hand the write's failure to everyone who waited on it."""
    error = e if isinstance(e, Exception) else RuntimeError(str(e))
    for slot in pending.slots:
        if not slot.done():
            slot.set_exception(error)
    for blocked in pending.blocked:
        if not blocked.done():
            blocked.set_exception(error)


def _text(limit: Limit) -> str:
    rates = [f"{r} requests" for r in (limit.requests,) if r] + [
        f"{t} tokens" for t in (limit.tokens,) if t
    ]
    return ", ".join(rates)
