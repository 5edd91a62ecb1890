"""The watchdog: tells waiting runs from dead ones, and gets the dead ones moving again.

It keeps the run model (``sojourn.projections.model``) current and judges every live run's
liveness each ``interval``. At start-up the model starts from the snapshot the projector leader
stores (``<PREFIX>_SNAPSHOTS``), when there is a usable one, and reads only the decisions after
it; without one it reads the events stream from the first message.

Runs that are ``stalled`` (owner silent), ``orphaned`` (work, no owner) or ``overdue`` (a wake
that should have happened) are re-woken: a wake message makes some worker look at the run, take
its lease once the old one lapses, and continue from the last recorded event. ``wedged`` runs are
reported (they need a human), never retried.

Several watchdogs may run at once (one per worker host, say). Before acting on a run, a
watchdog claims the action with a compare-and-set on ``<prefix>.watch.<run_id>``; the claim
names the problem (state and the run's last event), so of several watchdogs that see the same
problem exactly one acts, and the same problem is acted on again only after ``rewake_every``.

With ``Settings.retain_ended`` set, the watchdog also runs retention (``actors/ops/archive.py``)
every ``archive_every`` seconds: ended runs older than that leave the hot streams, and once an
hour the keyed starts' records nothing needs any more. Of several watchdogs, the one holding the
archiver's leader record (``<prefix>.leader.archiver``) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import msgspec
from prometheus_client.core import Metric

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, ConnectOptions, JetStreamError, header
from sojourn.broker.names import Names
from sojourn.broker.tasks import STOP_GRACE, settle_cancelled
from sojourn.broker.topology import ensure_topology
from sojourn.broker.wake import publish_wake
from sojourn.projections.model import RunModel, read_snapshot
from sojourn.schemas.codec import decode_watch_claim, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.health import Liveness, WatchClaim

from .archive import Archiver
from .metrics import WATCHDOG_ACTIONS, track_watchdog

__all__ = ["REWAKE_STATES", "Watchdog"]

log = logging.getLogger("sojourn.watchdog")

REWAKE_STATES = ("stalled", "orphaned", "overdue")
KEYED_SWEEP_EVERY = 3600.0
"""Seconds between two sweeps of the keyed starts' records by the periodic retention pass
(decision 0053): each judges every keyed record older than the cutoff, a few direct gets for
each live one, so they come once an hour rather than with every pass of the runs."""


class Watchdog:
    """Judges every live run of a deployment and re-wakes the ones that are stuck.

    Args:
        nats: server URL (default ``$SOJOURN_NATS_URL`` or ``nats://127.0.0.1:4222``), or
            ``ConnectOptions`` (credentials, TLS).
        settings: the deployment's settings (thresholds come from them).
        interval: seconds between two judgements (default: 0.5 s, at least one worker beat).
        rewake_every: seconds before the same problem of the same run is acted on again.
        on_change: called with a run's liveness whenever its state changes (the CLI prints it).
        archive_every: seconds between two retention passes (only with
            ``settings.retain_ended``; default 5 minutes).
        clock: the time retention judges ages by (default the wall clock; tests simulate one).
        from_snapshot: start the model from the stored snapshot, if one is usable (default);
            ``False`` reads the events stream from the first message.
    """

    def __init__(
        self,
        *,
        nats: str | ConnectOptions | None = None,
        broker: Broker | None = None,
        settings: Settings | None = None,
        interval: float | None = None,
        rewake_every: float | None = None,
        watchdog_id: str | None = None,
        on_change: Callable[[Liveness, Liveness | None], None] | None = None,
        archive_every: float = 300.0,
        clock: Callable[[], float] = time.time,
        from_snapshot: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.names = Names(self.settings.prefix)
        self.interval = interval or max(0.5, self.settings.worker_beat_interval)
        self.rewake_every = rewake_every or max(5.0, 2 * self.settings.stall_threshold)
        self.watchdog_id = (
            watchdog_id or f"wd-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.on_change = on_change
        self.from_snapshot = from_snapshot
        self.actions = 0
        self._url = nats
        self._broker = broker
        self._owns_broker = broker is None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last: dict[str, Liveness] = {}
        self._acted: dict[tuple[str, str, int], float] = {}
        self._scanned = asyncio.Event()
        self.model: RunModel
        self.archive_every = archive_every
        self.clock = clock
        self.archiver: Archiver | None = None
        self.archive_passes = 0
        self.keyed_sweeps = 0
        """Retention passes that swept the keyed starts' records too (``KEYED_SWEEP_EVERY``)."""
        self._archive_task: asyncio.Task[None] | None = None

    async def _open(self) -> None:
        if self._broker is None:
            self._broker = await Broker.connect(self._url, name=f"sojourn {self.watchdog_id}")
        await ensure_topology(self._broker, self.names, self.settings, consumers=False)
        self.model = RunModel(self._broker, self.names, self.settings)
        snap = await read_snapshot(self._broker, self.names) if self.from_snapshot else None
        if snap is not None:
            self.model.restore(snap)
            log.info(
                "watchdog: started from the snapshot at sequence %d (%d live runs)",
                snap.position,
                len(snap.runs),
            )

    async def survey(self) -> dict[str, Liveness]:
        """Read everything, judge every live run once, act on nothing, disconnect."""
        await self._open()
        try:
            while not await self.model.refresh(max_pages=10_000):
                pass
            return self.model.assess()
        finally:
            if self._owns_broker and self._broker is not None:
                await self._broker.close()

    async def start(self) -> Watchdog:
        await self._open()
        track_watchdog(self)
        self._task = asyncio.create_task(self._loop(), name="sojourn-watchdog")
        if self.settings.retain_ended is not None:
            self.archiver = Archiver(self._broker_or_fail(), self.settings, owner=self.watchdog_id)
            self._archive_task = asyncio.create_task(
                self._archive_loop(self.archiver), name="sojourn-archiver"
            )
        return self

    async def stop(self) -> None:
        track_watchdog(self, on=False)
        self._stopping = True  # the loop also ends on this: a cancel can be lost (see _loop)
        await settle_cancelled([t for t in (self._task, self._archive_task) if t], STOP_GRACE)
        if self._owns_broker and self._broker is not None:
            await self._broker.close()

    async def __aenter__(self) -> Watchdog:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def gauges(self) -> list[Metric]:
        return self.model.gauges()

    async def wait_scanned(self) -> None:
        """Wait until the model has caught up and judged every run at least once more."""
        self._scanned.clear()
        await self._scanned.wait()

    def liveness(self, run_id: str) -> Liveness | None:
        return self.model.assessed.get(run_id)

    # --- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Scan every ``interval`` until stopped. A cancel that lands while nats-py waits on a
        subscription's inner task can be swallowed there (``asyncio.wait_for`` in Python 3.11
        returns a result that raced the cancel), so the loop also checks the stop flag and
        whether its task was asked to cancel; otherwise a stop could wait forever."""
        me = asyncio.current_task()
        while not self._stopping and not (me is not None and me.cancelling()):
            started = time.monotonic()
            try:
                await self.scan()
            except asyncio.CancelledError:
                raise
            except SojournError as e:
                log.warning("watchdog: %s; retrying", e)
            except Exception:
                log.exception("watchdog: scan failed; retrying")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _archive_loop(self, archiver: Archiver) -> None:
        """A retention pass every ``archive_every`` seconds while this watchdog leads the
        archivers (the record outlives two missed passes, and at least a minute, then another
        watchdog takes over); the keyed starts' records in one pass an hour
        (``KEYED_SWEEP_EVERY``)."""
        me = asyncio.current_task()
        swept = -KEYED_SWEEP_EVERY
        while not self._stopping and not (me is not None and me.cancelling()):
            try:
                if await archiver.lead(max(3 * self.archive_every, 60.0)):
                    now = self.clock()
                    sweep = now - swept >= KEYED_SWEEP_EVERY
                    report = await archiver.run_pass(now=now, keyed=sweep)
                    swept = now if sweep else swept
                    self.archive_passes += 1
                    self.keyed_sweeps += 1 if sweep else 0
                    keyed = sum(report.keyed.values())
                    if report.moved or report.errors or keyed or report.keyed_errors:
                        log.info(
                            "retention: %d run(s) left the hot streams, %d stay for errors; "
                            "%d keyed start record(s) removed, %d stay for errors",
                            len(report.moved),
                            len(report.errors),
                            keyed,
                            len(report.keyed_errors),
                        )
            except asyncio.CancelledError:
                raise
            except SojournError as e:
                log.warning("retention: %s; retrying in %gs", e, self.archive_every)
            except Exception:
                log.exception("retention: pass failed; retrying")
            await asyncio.sleep(self.archive_every)

    async def scan(self) -> dict[str, Liveness]:
        """Read what is new, judge every run, act on the stuck ones."""
        caught_up = await self.model.refresh()
        if not caught_up and not self.model.caught_up:
            return {}
        now = time.time()
        judged = self.model.assess(now)
        for run_id, liv in judged.items():
            before = self._last.get(run_id)
            if before is None or before.state != liv.state:
                self._report(liv, before)
            if liv.state in REWAKE_STATES:
                await self._act(liv, now)
        for run_id in [r for r in self._last if r not in judged]:
            del self._last[run_id]
        self._last.update(judged)
        cutoff = now - self.rewake_every
        self._acted = {k: t for k, t in self._acted.items() if t > cutoff}
        self._scanned.set()
        return judged

    def _report(self, liv: Liveness, before: Liveness | None) -> None:
        if self.on_change is not None:
            self.on_change(liv, before)
        if liv.flagged:
            log.warning("run %s (%s) is %s: %s", liv.run_id, liv.agent, liv.state, liv.reason)
        elif before is not None and before.flagged:
            log.info("run %s (%s) is %s again", liv.run_id, liv.agent, liv.state)

    async def _act(self, liv: Liveness, now: float) -> None:
        """Re-wake a stuck run, once per problem across all watchdogs, on its lane."""
        summary = self.model.runs[liv.run_id]
        seq = summary.last_seq
        key = (liv.run_id, liv.state, seq)
        if key in self._acted:
            return
        self._acted[key] = now
        if not await self._claim(liv, seq, now):
            return
        await publish_wake(
            self._broker_or_fail(),
            self.names,
            liv.run_id,
            "watchdog",
            liv.state,
            agent=liv.agent or None,
            priority=summary.priority,
            fairness=summary.fairness,
        )
        self.actions += 1
        WATCHDOG_ACTIONS.labels("rewake", liv.state).inc()
        log.info("run %s: re-woken (%s: %s)", liv.run_id, liv.state, liv.reason)

    async def _claim(self, liv: Liveness, seq: int, now: float) -> bool:
        b = self._broker_or_fail()
        subject = self.names.watch(liv.run_id)
        last = await b.direct_get_last(self.names.health_stream, subject)
        expected = 0
        if last is not None:
            expected = int(header(last, h.SEQUENCE))
            with contextlib.suppress(msgspec.MsgspecError):
                prev = decode_watch_claim(last.data)
                same = prev.state == liv.state and prev.event_seq == seq
                if same and now - prev.at < self.rewake_every:
                    return False  # another watchdog (or we) acted on this very problem
        claim = WatchClaim(
            run_id=liv.run_id, state=liv.state, event_seq=seq, by=self.watchdog_id, at=now
        )
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected), h.TTL: "24h"}
        ack = await b.try_publish(subject, encode(claim), headers)
        return not isinstance(ack, JetStreamError)

    def _broker_or_fail(self) -> Broker:
        assert self._broker is not None
        return self._broker
