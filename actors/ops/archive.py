"""Retention: ended runs older than ``Settings.retain_ended`` leave the hot streams.

One pass (``Archiver.run_pass``; ``sojourn archive`` runs one, the watchdog one every
``archive_every`` seconds while it leads, when ``retain_ended`` is set):

1. **Candidates** from the read side: every view in the runs KV bucket that says its run ended
   before the cutoff and is not archived (``projections.retention.select``). Runs without a
   view (no projector ever ran) are not found.
2. **Judge from the history itself**, never from the view: the run's stored messages are read
   and folded; it must have ended, its last event and last message must be older than the
   cutoff, and a child run's parent must have ended too (``projections.retention.judge``): a
   live parent reads its child's end from the child's last event and cancels children it does
   not see ended, so a child leaves only after its parent.
3. **Archive** (policy ``object_store``): the messages as stored are written to the archive
   (``broker.archive``), read back and compared byte for byte (or, if an earlier pass already
   stored them, compared decision by decision). Policy ``discard`` keeps no copy.
4. **Remove**: the run's events are purged up to the last archived sequence (a message appended
   after the judgement is never removed unseen), then its wakes and timers, lease, output,
   watchdog claim and wedge record.
5. **Mark** its view ``archived`` (compare-and-set on the KV entry).

Each step is idempotent and nothing is removed before its copy is verified, so a crash at any
point leaves the run either fully hot or archived and (partly) hot; the next pass finishes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.broker import BROKER_ERRORS
from sojourn.broker import headers as h
from sojourn.broker.archive import ArchiveStore, decode_archive, encode_archive
from sojourn.broker.connection import Broker, JetStreamError
from sojourn.broker.delivery import PublishAck, StoredMessage
from sojourn.broker.eventstore import Decision
from sojourn.broker.names import Names
from sojourn.projections.retention import Verdict, cutoff, judge, select
from sojourn.projections.summary import RunSummary, summarize_all
from sojourn.schemas.codec import decode_events, decode_run_view, encode, from_raw
from sojourn.schemas.config import ArchivePolicy, Settings
from sojourn.schemas.errors import InvalidName, SojournError
from sojourn.schemas.health import LeaderRecord
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from sojourn.schemas.names import validate_token
from sojourn.schemas.views import RunView

from .keyed import KeyedKind, KeyedRecords
from .metrics import ARCHIVE_ERRORS, ARCHIVED_RUNS

__all__ = [
    "LEADER_ROLE",
    "ArchiveReport",
    "Archiver",
    "Outcome",
    "RetentionUnavailable",
    "read_archived",
]

log = logging.getLogger("sojourn.archive")
T = TypeVar("T")

LEADER_ROLE = "archiver"
"""The leader record's role (``<prefix>.leader.archiver``): one watchdog archives at a time."""

PASS_CONCURRENCY = 16
"""Runs moved at once in a pass."""

_VIEW_PAGE = 1000
_STREAM_NOT_FOUND = 10059

Outcome = Literal["archived", "discarded", "finished", "would_archive"]
"""What a pass did with a run it moved: ``archived`` (copy verified, then removed),
``discarded`` (removed without a copy), ``finished`` (a previous pass had removed its events:
the rest was cleaned up), ``would_archive`` (a dry run)."""

Stage = Literal["read", "archive", "remove", "view"]


class RetentionUnavailable(SojournError):
    """Retention cannot run on this deployment (the events stream denies purge)."""


class _Failed(Exception):
    def __init__(self, stage: Stage, cause: BaseException) -> None:
        super().__init__(f"{stage}: {cause}")
        self.stage: Stage = stage
        self.cause = cause


@dataclass
class ArchiveReport:
    """What one pass found and did.

    Attributes:
        moved: the runs that left the hot streams (or, in a dry run, would), with what was
            done (``Outcome``).
        skipped: candidates kept in place, counted by why (``Verdict``: ``live``, ``young``,
            ``parent_live``, ``empty``).
        errors: runs that could not be moved this pass (left hot), with the stage and error.
        bytes_before / bytes_after: the events stream's size around the pass.
        keyed: keyed starts' records removed (or, in a dry run, that would be), by kind
            (``actors/ops/keyed.py``); keyed_errors: those that could not be judged or
            removed (subject -> error), left for the next pass.
    """

    now: float
    cutoff: float
    policy: ArchivePolicy
    dry_run: bool
    candidates: int = 0
    moved: dict[str, Outcome] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    keyed: dict[KeyedKind, int] = field(default_factory=dict)
    keyed_errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready builtins (``sojourn archive --json``)."""
        return {
            "now": self.now,
            "cutoff": self.cutoff,
            "policy": self.policy,
            "dry_run": self.dry_run,
            "candidates": self.candidates,
            "moved": len(self.moved),
            "runs": self.moved,
            "skipped": self.skipped,
            "errors": self.errors,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "keyed": self.keyed,
            "keyed_errors": self.keyed_errors,
        }


async def read_archived(archive: ArchiveStore, run_id: str) -> list[Decision]:
    """The archived decisions of ``run_id`` (empty: none archived).

    Raises:
        HistoryError: the archived object is damaged or not this run's.
    """
    data = await archive.get(run_id)
    return [] if data is None else decode_archive(run_id, data)


class Archiver:
    """Moves ended runs out of the hot streams (see the module docstring).

    Args:
        broker: a connection with the ``watchdog`` role (or ``admin``): it purges the events
            stream, which no other role may.
        settings: the deployment; ``retain_ended`` and ``archive`` are its defaults.
        retain_ended: seconds an ended run stays (overrides the settings'; one is needed).
        policy: ``object_store`` or ``discard`` (overrides the settings').
        owner: this archiver's name in its leader record.
        concurrency: runs moved at once.
    """

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        *,
        retain_ended: float | None = None,
        policy: ArchivePolicy | None = None,
        owner: str | None = None,
        concurrency: int = PASS_CONCURRENCY,
    ) -> None:
        retain = settings.retain_ended if retain_ended is None else retain_ended
        if retain is None or retain < 0:
            raise ValueError("retention needs retain_ended (seconds an ended run stays), >= 0")
        self.broker = broker
        self.settings = settings
        self.names = Names(settings.prefix)
        self.retain_ended = retain
        self.policy: ArchivePolicy = policy or settings.archive
        self.owner = owner or f"ar-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.concurrency = max(1, concurrency)
        self.archive = ArchiveStore(broker, self.names)

    # --- a pass ------------------------------------------------------------------------------

    async def prepare(self) -> bool:
        """Check that runs can be removed and create the archive bucket if it is missing;
        ``False`` when there is no events stream (nothing ever ran: nothing to do).

        Raises:
            RetentionUnavailable: the events stream denies purge.
            PermissionDenied: the archive bucket is missing and this user may not create it.
        """
        cfg = await self.broker.stream_config(self.names.events_stream)
        if cfg is None:
            return False
        if cfg.get("deny_purge"):
            raise RetentionUnavailable(
                f"the events stream {self.names.events_stream} denies purge: it was created "
                "before retention existed, and JetStream cannot lift deny_purge from a stream, "
                "so ended runs cannot be removed from it (docs/operations.md, Retention, says "
                "how to migrate)"
            )
        if self.policy == "object_store":
            await self.archive.ensure(self.settings.replicas)
        return True

    async def run_pass(
        self,
        *,
        now: float | None = None,
        limit: int | None = None,
        dry_run: bool = False,
        keyed: bool = True,
    ) -> ArchiveReport:
        """One pass over the runs due at ``now`` (default: the wall clock), at most ``limit``
        of them, oldest end first, then (with ``keyed``) over the keyed starts' records. With
        ``dry_run`` nothing is written.

        Raises:
            RetentionUnavailable: the events stream denies purge.
        """
        at = time.time() if now is None else now
        report = ArchiveReport(
            now=at,
            cutoff=cutoff(at, self.retain_ended),
            policy=self.policy,
            dry_run=dry_run,
        )
        if not dry_run:
            if not await self.prepare():
                return report
        elif await self.broker.stream_config(self.names.events_stream) is None:
            return report
        report.bytes_before = await self._stream_bytes()
        due = await self.due(at, limit)
        report.candidates = len(due)
        gate = asyncio.Semaphore(self.concurrency)

        async def one(run_id: str) -> None:
            async with gate:
                try:
                    result = await self.move(run_id, at, dry_run=dry_run)
                except _Failed as e:
                    ARCHIVE_ERRORS.labels(e.stage).inc()
                    report.errors[run_id] = str(e)
                    log.warning("retention: run %s stays hot: %s", run_id, e)
                    return
            if result in ("archived", "discarded", "finished", "would_archive"):
                report.moved[run_id] = result
            else:
                report.skipped[result] = report.skipped.get(result, 0) + 1

        await asyncio.gather(*(one(r) for r in due))
        report.bytes_after = await self._stream_bytes()
        if keyed:  # then the keyed starts' records that nothing needs any more (0053)
            sweep = KeyedRecords(self.broker, self.names, self.archive)
            report.keyed, report.keyed_errors = await sweep.sweep(report.cutoff, dry_run=dry_run)
        return report

    async def due(self, now: float, limit: int | None = None) -> list[str]:
        """The runs whose views say they are due at ``now`` (a hint: ``move`` checks)."""
        kept: list[RunView] = []
        seq = 1
        stream, keys = self.names.runs_kv_stream, self.names.run_keys_all
        while True:
            msgs, pending = await self.broker.direct_get_batch(stream, keys, seq, _VIEW_PAGE)
            page = [v for v in (self._view(m) for m in msgs) if v is not None]
            wanted = set(select(page, now=now, retain_ended=self.retain_ended))
            kept += [v for v in page if v.run_id in wanted]
            if not msgs or pending == 0:
                break
            seq = msgs[-1].seq + 1
        return select(kept, now=now, retain_ended=self.retain_ended, limit=limit)

    def _view(self, m: StoredMessage) -> RunView | None:
        """A KV entry's view, if it is one and is filed under its own run id."""
        if not m.data:
            return None  # a delete marker
        try:
            view = decode_run_view(m.data)
            validate_token(view.run_id, "run_id")
        except (msgspec.MsgspecError, InvalidName):
            return None
        return view if m.subject == self.names.run_key(view.run_id) else None

    # --- one run -----------------------------------------------------------------------------

    async def move(self, run_id: str, now: float, *, dry_run: bool = False) -> Outcome | Verdict:
        """Judge one run from its history and, if it is due, archive and remove it.

        Returns what was done, or the verdict that kept it in place.

        Raises:
            _Failed: a step failed (the run stays hot, or archived and hot: a later pass
                finishes it).
        """
        messages, decisions = await self._read(run_id)
        if not messages:
            if dry_run:
                return "empty"
            return await self._finish(run_id)
        summary = summarize_all((d.seq, d.size, d.events) for d in decisions)
        parent_ended = None
        if summary.parent_run_id is not None and summary.terminal:
            parent_ended = await self._stage("read", self._ended(summary.parent_run_id))
        verdict = judge(
            summary,
            last_stored_at=messages[-1].time,
            now=now,
            retain_ended=self.retain_ended,
            parent_ended=parent_ended,
        )
        if verdict != "archive":
            return verdict
        if dry_run:
            return "would_archive"
        if self.policy == "object_store":
            await self._stage("archive", self.copy(run_id, messages, decisions))
        await self._stage("remove", self.remove(run_id, summary, messages[-1].seq))
        await self._stage("view", self.mark_archived(run_id))
        outcome: Outcome = "archived" if self.policy == "object_store" else "discarded"
        ARCHIVED_RUNS.labels(self.policy).inc()
        return outcome

    async def _read(self, run_id: str) -> tuple[list[StoredMessage], list[Decision]]:
        async def read() -> tuple[list[StoredMessage], list[Decision]]:
            msgs = await self.broker.direct_get_range(
                self.names.events_stream, self.names.events(run_id)
            )
            if not msgs:
                return [], []
            # The fold is of the archived form itself: what is judged is what is kept.
            return msgs, decode_archive(run_id, encode_archive(run_id, msgs, time.time()))

        return await self._stage("read", read())

    async def copy(
        self, run_id: str, messages: Sequence[StoredMessage], decisions: Sequence[Decision]
    ) -> None:
        """Write the run's history to the archive (unless an equal copy is there) and read it
        back: it must hold exactly these messages.

        Raises:
            SojournError: the copy read back differs (nothing may be removed).
        """
        stored = await read_archived(self.archive, run_id)
        if stored == list(decisions):
            return  # an earlier pass stored it and crashed before removing
        data = encode_archive(run_id, messages, time.time())
        await self.archive.put(run_id, data)
        back = await self.archive.get(run_id)
        if back != data or decode_archive(run_id, back) != list(decisions):
            raise SojournError(f"run {run_id}: the archive read back differs", run_id=run_id)

    async def remove(self, run_id: str, summary: RunSummary, last_seq: int) -> None:
        """Purge the run's events up to ``last_seq``, then its other subjects."""
        n = self.names
        await self._purge(n.events_stream, n.events(run_id), upto=last_seq)
        left = await self.broker.direct_get_last(n.events_stream, n.events(run_id))
        if left is not None:
            # Appended after it ended (nothing should): kept hot; readers prepend the archive.
            log.error("retention: run %s got message %d after its end", run_id, left.seq)
        await self._purge_rest(run_id, summary.agent)

    async def _purge_rest(self, run_id: str, agent: str) -> None:
        n = self.names
        subjects = [
            (n.wake_stream, n.wake(run_id)),
            (n.wake_stream, n.timer(run_id, "*")),
            (n.leases_stream, n.lease(run_id)),
            (n.output_stream, n.output(run_id)),
            (n.health_stream, n.watch(run_id)),
            (n.health_stream, n.wedge(run_id)),
        ]
        try:
            subjects.append((n.wake_stream, n.wake(run_id, validate_token(agent, "agent"))))
        except InvalidName:
            pass  # no valid agent recorded: no routed wake either
        for stream, subject in subjects:
            await self._purge(stream, subject)

    async def _finish(self, run_id: str) -> Outcome | Verdict:
        """A due view whose run has no events left: an earlier pass removed them and stopped
        before the rest. Finish if the history is accounted for (archived, or policy
        ``discard``)."""

        async def finish() -> Outcome | Verdict:
            if self.policy == "object_store" and not await self.archive.exists(run_id):
                return "empty"  # never archived here: not ours to clean up
            view = await self._current_view(run_id)
            await self._purge_rest(run_id, view.agent if view is not None else "")
            await self.mark_archived(run_id)
            return "finished"

        return await self._stage("remove", finish())

    async def mark_archived(self, run_id: str) -> None:
        """Set ``archived`` on the run's view, by compare-and-set (the projector may write it
        at the same moment: read again and retry)."""
        subject = self.names.run_key(run_id)
        for _ in range(10):
            m = await self.broker.direct_get_last(self.names.runs_kv_stream, subject)
            view = self._view(m) if m is not None else None
            if m is None or view is None or view.archived:
                return
            body = encode(msgspec.structs.replace(view, archived=True))
            ack = await self.broker.try_publish(
                subject, body, {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(m.seq)}
            )
            if isinstance(ack, PublishAck):
                return
        raise SojournError(f"run {run_id}: its view kept changing", run_id=run_id)

    async def _current_view(self, run_id: str) -> RunView | None:
        m = await self.broker.direct_get_last(self.names.runs_kv_stream, self.names.run_key(run_id))
        return None if m is None else self._view(m)

    async def _ended(self, run_id: str) -> bool:
        """Whether ``run_id`` (a parent) has ended: its last event is terminal, or it has left
        the hot streams itself (archived, or its view says so)."""
        last = await self.broker.direct_get_last(
            self.names.events_stream, self.names.events(run_id)
        )
        if last is not None:
            try:
                return any(isinstance(e, TERMINAL_EVENTS) for e in decode_events(last.data))
            except msgspec.MsgspecError:
                return False
        if await self.archive.exists(run_id):
            return True
        view = await self._current_view(run_id)
        return view is not None and view.archived

    async def _purge(self, stream: str, subject: str, *, upto: int | None = None) -> None:
        body: dict[str, Any] = {"filter": subject}
        if upto is not None:
            body["seq"] = upto + 1  # purge below this sequence: what was judged, nothing after
        try:
            await self.broker.api(f"$JS.API.STREAM.PURGE.{stream}", body)
        except JetStreamError as e:
            if e.err_code != _STREAM_NOT_FOUND:
                raise

    async def _stream_bytes(self) -> int:
        try:
            info = await self.broker.api(f"$JS.API.STREAM.INFO.{self.names.events_stream}")
        except JetStreamError:
            return 0
        return int(info.get("state", {}).get("bytes", 0) or 0)

    @staticmethod
    async def _stage(stage: Stage, work: Awaitable[T]) -> T:
        try:
            return await work
        except BROKER_ERRORS as e:
            raise _Failed(stage, e) from e
        except SojournError as e:
            raise _Failed(stage, e) from e

    # --- leadership (several watchdogs) ------------------------------------------------------

    async def lead(self, ttl: float, now: float | None = None) -> bool:
        """Take or renew the archiver's leadership for ``ttl`` seconds (a compare-and-set on
        ``<prefix>.leader.archiver``, like the projector's); ``False``: another leads."""
        at = time.time() if now is None else now
        subject = self.names.leader(LEADER_ROLE)
        m = await self.broker.direct_get_last(self.names.health_stream, subject)
        rec: LeaderRecord | None = None
        if m is not None:
            try:
                rec = from_raw(m.data, LeaderRecord)
            except msgspec.MsgspecError:
                rec = None
        if rec is not None and rec.owner != self.owner and rec.expires_at > at:
            return False
        body = encode(LeaderRecord(owner=self.owner, expires_at=at + ttl, at=at))
        expected = str(m.seq if m is not None else 0)
        ack = await self.broker.try_publish(
            subject, body, {h.EXPECTED_LAST_SUBJECT_SEQUENCE: expected}
        )
        return isinstance(ack, PublishAck)
