"""Retention of keyed starts' records (decision 0053): the records singleton, debounced and
concurrency-keyed starts keep per key (decisions 0047, 0048) leave once nothing needs them.

A key's record is one message in the schedules stream, written by compare-and-set; a record
nothing needs is equivalent to none (the next start with the key writes over either), so it
may go once it is dead and older than the cutoff (``Settings.retain_ended`` ago):

- a **singleton** record, once the run it names has ended (its chain's current run's last
  event is an end), or will never exist (its start is no longer in the inbox), the end or the
  record older than the cutoff;
- a **burst** record (debounce), once the burst is closed and its run exists (or was
  archived), closed before the cutoff, with none of its triggers still in the inbox (a
  redelivered trigger reads the record to know it was counted);
- a debounce **fire** message (the broker's fired copy of a burst's timer, kept one per key),
  stored before the cutoff, once its burst is closed and its run exists (or the key's record
  is of a later burst, or gone);
- a concurrency key's **slots** record, once no run holds a slot, last written before the
  cutoff.

Removal is a purge of the record's subject *up to the sequence judged*: a record written after
the judgement (a start with the key, on any worker, at that moment) is never removed, and a
writer whose compare-and-set expected the removed one reads again and finds none. A message
that cannot be read (nothing a worker wrote) goes once older than the cutoff. One retention
pass (``Archiver.run_pass``) sweeps them after the runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

from sojourn.broker import BROKER_ERRORS
from sojourn.broker.archive import ArchiveStore
from sojourn.broker.connection import Broker, JetStreamError
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.flow import BURST, FlowStore
from sojourn.broker.names import Names
from sojourn.schemas.codec import (
    decode_debounce_record,
    decode_singleton_record,
    decode_slots_record,
)
from sojourn.schemas.errors import PermissionDenied, SojournError
from sojourn.schemas.flow import key_token

from ..history.keyed import recorded_pending, singleton_run

__all__ = ["ERRORS_MAX", "KEYED_KINDS", "KeyedKind", "KeyedRecords"]

log = logging.getLogger("sojourn.archive")

KeyedKind = Literal["singleton", "burst", "fire", "slots"]
KEYED_KINDS: tuple[KeyedKind, ...] = ("singleton", "burst", "fire", "slots")
_SUBJECT_KIND: dict[KeyedKind, str] = {
    "singleton": "single",
    "burst": "burst",
    "fire": "fire",
    "slots": "slots",
}
ERRORS_MAX = 100
"""Records left for errors after which a sweep stops (the broker is in trouble: the next pass
goes on)."""
_READ_ERRORS: tuple[type[BaseException], ...] = (*BROKER_ERRORS, SojournError)
_PAGE = 1000
_CONCURRENCY = 16
_STREAM_NOT_FOUND = 10059


class KeyedRecords:
    """Finds and removes keyed starts' records nothing needs any more (module docstring)."""

    def __init__(self, broker: Broker, names: Names, archive: ArchiveStore) -> None:
        self.broker = broker
        self.names = names
        self.archive = archive
        self.stream = names.schedules_stream

    async def sweep(
        self, cutoff: float, *, dry_run: bool = False
    ) -> tuple[dict[KeyedKind, int], dict[str, str]]:
        """Remove (with ``dry_run``: count) the dead records older than ``cutoff``. Returns how
        many of each kind, and the records that could not be judged or removed (subject ->
        error), left for the next pass."""
        removed: dict[KeyedKind, int] = dict.fromkeys(KEYED_KINDS, 0)
        errors: dict[str, str] = {}
        judges: dict[KeyedKind, Callable[[StoredMessage, float], Awaitable[bool]]] = {
            "singleton": self._singleton_dead,
            "burst": self._burst_dead,
            "fire": self._fire_dead,
            "slots": self._slots_dead,
        }
        gate = asyncio.Semaphore(_CONCURRENCY)
        denied: list[PermissionDenied] = []

        async def one(kind: KeyedKind, m: StoredMessage) -> None:
            async with gate:
                if denied:
                    return
                try:
                    if not await judges[kind](m, cutoff):
                        return
                    if not dry_run:
                        await self._purge(m.subject, m.seq)
                except PermissionDenied as e:  # every record would say the same: said once
                    denied.append(e)
                    return
                except Exception as e:  # one record's trouble never stops the sweep
                    if len(errors) < ERRORS_MAX:
                        errors[m.subject] = f"{type(e).__name__}: {e}"
                        log.warning("retention: keyed record %r stays: %s", m.subject, e)
                    return
            removed[kind] += 1

        for kind in KEYED_KINDS:
            pattern = f"{self.names.prefix}.schedule.flow.{_SUBJECT_KIND[kind]}.>"
            seq = 1
            while len(errors) < ERRORS_MAX:
                try:
                    msgs, pending = await self.broker.direct_get_batch(
                        self.stream, pattern, seq, _PAGE
                    )
                except _READ_ERRORS as e:  # the next pass reads them again
                    errors[pattern] = f"{type(e).__name__}: {e}"
                    log.warning("retention: cannot read %r: %s", pattern, e)
                    break
                old = [m for m in msgs if m.time < cutoff]
                await asyncio.gather(*(one(kind, m) for m in old))
                if denied or not msgs or pending == 0:
                    break
                seq = msgs[-1].seq + 1
            if denied:
                why = (
                    f"{denied[0]}: these credentials may not purge {self.stream} (credentials "
                    "rendered before 2026-12-07: render them again, python -m sojourn.broker.auth)"
                )
                errors[self.stream] = why
                log.warning("retention: keyed records stay: %s", why)
                break
        return removed, errors

    # --- judges: is this record dead, and older than the cutoff? ------------------------------

    def _subject(self, kind: str, agent: str, key: str) -> str:
        return FlowStore.subject(self.names, kind, agent, key_token(key))

    async def _singleton_dead(self, m: StoredMessage, cutoff: float) -> bool:
        try:
            rec = decode_singleton_record(m.data)
        except msgspec.MsgspecError:
            return True  # not a record a worker wrote (and stored before the cutoff)
        if m.subject != self._subject("single", rec.agent, rec.key):
            return True  # not filed under its own key: no start ever reads it as its key's
        live, last = await singleton_run(self.broker, self.names, rec)
        if live is not None:
            return False
        return last is None or last.time < cutoff  # never created or archived; or ended

    async def _burst_dead(self, m: StoredMessage, cutoff: float) -> bool:
        try:
            rec = decode_debounce_record(m.data)
        except msgspec.MsgspecError:
            return True
        if m.subject != self._subject("burst", rec.agent, rec.key):
            return True
        if not rec.closed or rec.updated_at >= cutoff:
            return False  # open, or closed lately
        if await recorded_pending(self.broker, self.names, (*rec.recorded, rec.burst)):
            return False  # a trigger of it may be redelivered, and must find itself counted
        return await self._exists(rec.run_id)  # else its run is still to be created from it

    async def _fire_dead(self, m: StoredMessage, cutoff: float) -> bool:
        head = f"{self.names.prefix}.schedule.flow.fire."
        agent, _, token = m.subject[len(head) :].partition(".")
        burst = m.headers.get(BURST, "")
        if not agent or not token or not burst.isdigit():
            return True  # not a fire sojourn armed
        record = f"{self.names.prefix}.schedule.flow.burst.{agent}.{token}"
        last = await self.broker.direct_get_last(self.stream, record)
        if last is None:
            return True  # its burst's record is gone: the fire was handled long ago
        try:
            rec = decode_debounce_record(last.data)
        except msgspec.MsgspecError:
            return True
        if rec.burst != int(burst):
            return True  # an earlier burst's: the trigger that opened the next saw its run
        # This burst's: handled once it is closed and its run exists (until then a redelivered
        # fire is what creates the run)
        return rec.closed and await self._exists(rec.run_id)

    async def _slots_dead(self, m: StoredMessage, cutoff: float) -> bool:
        try:
            rec = decode_slots_record(m.data)
        except msgspec.MsgspecError:
            return True
        if m.subject != f"{self.names.prefix}.schedule.flow.slots.{rec.agent}.{key_token(rec.key)}":
            return True
        return not rec.holders and rec.updated_at < cutoff

    async def _exists(self, run_id: str) -> bool:
        """Whether ``run_id`` has a history, in the events stream or the archive."""
        last = await self.broker.direct_get_last(
            self.names.events_stream, self.names.events(run_id)
        )
        return last is not None or await self.archive.exists(run_id)

    async def _purge(self, subject: str, seq: int) -> None:
        """Remove ``subject``'s messages up to ``seq``: what was judged, nothing written after."""
        body: dict[str, Any] = {"filter": subject, "seq": seq + 1}
        try:
            await self.broker.api(f"$JS.API.STREAM.PURGE.{self.stream}", body)
        except JetStreamError as e:
            if e.err_code != _STREAM_NOT_FOUND:
                raise
