"""Heartbeats: how a worker holds its runs, and how it learns that another worker died.

A worker holds the runs it executes by listing them in its heartbeat, one write per
``worker_beat_interval`` on ``<prefix>.worker.<worker_id>``; while the beats go on, no other
worker executes those runs, however long they take (docs/decisions/
0018-claims-without-lease-writes.md). It reads every worker's beats too (``Membership``): a run
another live worker lists is handed back (``holder``), an open step such a worker may still be
running is not settled (``held_step``), and when a worker falls silent its runs are woken at
once (``Heartbeats.take_over``), to continue from their last recorded event.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, Subscription
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.follow import read_all
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_worker_beat, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.health import BEAT_RUNS_MAX, ActiveRun, WorkerBeat, vouches
from sojourn.schemas.names import validate_token
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.vocabulary import wake_reason

from ..core.membership import Membership
from ..ops import metrics
from .orphans import claimed_after_beat
from .tenancy import held_step

__all__ = ["ASK_AFTER", "BEAT_TTL", "Heartbeats"]

log = logging.getLogger("sojourn.worker")

BEAT_TTL = "24h"
"""How long the broker keeps a worker's last heartbeat (the watchdog forgets it after 1 h)."""

ASK_AFTER = 1.5
"""Beat intervals without a new beat after which a worker's connection is asked after: the
server answers "no responders" on its presence subject at once if the connection is gone (a
killed process), so its runs are taken over long before ``worker_dead_after``."""


class Heartbeats:
    """One worker's heartbeats, and its reading of every worker's (``membership``).

    ``active``, ``run_agents`` and ``since`` are the worker's own records of the runs it
    executes (their tasks, their agents once known, when each began): each beat lists them.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        agents: Collection[str],
        concurrency: int,
        started_at: float,
        names: Names,
        settings: Settings,
        membership: Membership,
        broker: Callable[[], Broker],
        active: Mapping[str, object],
        run_agents: Mapping[str, str],
        run_lanes: Mapping[str, tuple[Priority, Fairness | None]],
        since: Mapping[str, float],
    ) -> None:
        self.worker_id = worker_id
        self.agents = agents
        self.concurrency = concurrency
        self.started_at = started_at
        self.names = names
        self.settings = settings
        self.membership = membership
        self._broker = broker
        self._active = active
        self._run_agents = run_agents
        self._run_lanes = run_lanes
        self._since = since
        self.beating = True
        """Heartbeats go on until the last activation of a stopping worker has ended."""
        self._looked_at = 0.0
        self._beaten_at = 0.0
        """When this worker's own last heartbeat was stored (monotonic)."""
        self._presence: Subscription | None = None
        self._store: EventStore | None = None

    async def beat(self, stopped: bool = False) -> None:
        """Store this worker's heartbeat, listing the runs it executes (none once ``stopped``)."""
        lanes, default = self._run_lanes, (PRIORITY_DEFAULT, None)
        runs = tuple(
            ActiveRun(
                run_id,
                self._run_agents.get(run_id, ""),
                self._since.get(run_id, 0.0),
                lanes.get(run_id, default)[0],
            )
            for run_id in itertools.islice(self._active, BEAT_RUNS_MAX)
        )
        beat = WorkerBeat(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            agents=tuple(sorted(self.agents)),
            active=len(self._active),
            capacity=self.concurrency,
            started_at=self.started_at,
            at=time.time(),
            interval=self.settings.worker_beat_interval,
            stopped=stopped,
            runs=() if stopped else runs,
            answers=self._presence is not None,
            events_seq=-1 if self._store is None else self._store.high_seq,
        )
        await self._broker().publish(
            self.names.worker(self.worker_id), encode(beat), {h.TTL: BEAT_TTL}
        )
        self._beaten_at = time.monotonic()

    async def start(self, store: EventStore) -> None:
        """Before the first beat: from now on each beat carries the events-stream sequence the
        worker's later decisions land above (``store.high_seq``, at least the stream's last
        sequence now), and the worker answers on its presence subject while its connection is
        up (beats say so): when the connection goes, the server itself tells the others."""
        info = await self._broker().api(f"$JS.API.STREAM.INFO.{self.names.events_stream}")
        store.high_seq = max(store.high_seq, int(info.get("state", {}).get("last_seq", 0)))
        self._store = store
        await self._answer()

    async def _answer(self) -> None:

        async def on_ask(msg: Delivery) -> None:
            if msg.reply:
                with contextlib.suppress(Exception):  # the asker may be gone: nothing to tell
                    await msg.respond(b"")

        b = self._broker()
        subject, since = self.names.presence(self.worker_id), time.monotonic()
        sub = await b.subscribe(subject, cb=on_ask)
        await b.flush()  # the server refuses a subscription before the flush's answer
        if b.denied(subject, since=since):
            # Answering nobody while the beats say it answers would let others condemn this
            # worker at its first late beat: its beats say it does not answer.
            log.warning(
                "may not subscribe to %s (the worker role's permissions predate decision 0031):"
                " other workers judge this one by its heartbeats alone", subject,
            )  # fmt: skip
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            return
        self._presence = sub

    async def close(self) -> None:
        """Stop answering on the presence subject (after the last beat, which says stopped)."""
        if self._presence is not None:
            sub, self._presence = self._presence, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def beat_loop(self) -> None:
        """The worker's heartbeat: one write per interval, listing the runs it executes; while
        it goes on, no other worker executes them (however long they take)."""
        await self._every_interval(lambda: self.beating, self.beat, "heartbeat")

    async def look(self) -> None:
        """Read every worker's heartbeat and judge who is alive (``Membership``)."""
        b = self._broker()
        beats: list[tuple[int, WorkerBeat]] = []
        for m in await read_all(b, self.names.health_stream, self.names.workers_all):
            with contextlib.suppress(msgspec.MsgspecError, InvalidName):  # any other shape
                beats.append((m.seq, _checked_beat(decode_worker_beat(m.data))))
        now = time.monotonic()
        blind = self.settings.worker_dead_after / 2
        if (self._looked_at and now - self._looked_at > blind) or now - self._beaten_at > blind:
            # Blind for a while (this connection, or the broker, was down: no worker could
            # heartbeat either), or this worker cannot heartbeat itself (on a cluster, the
            # health stream may be electing a leader while its replicas still answer reads):
            # the others' silence is not their fault.
            self.membership.resume(now)
        self._looked_at = now
        for dead in self.membership.observe(beats, now, time.time()):
            if dead.worker_id != self.worker_id:
                await self.take_over(dead)
        ask_after = ASK_AFTER * self.settings.worker_beat_interval
        late = [w for w in self.membership.overdue(now, ask_after) if w.worker_id != self.worker_id]
        if late:
            timeout = self.settings.worker_beat_interval
            asked = [b.present(self.names.presence(w.worker_id), timeout) for w in late]
            # An error (this connection may not ask: an older role) tells nothing, like silence.
            answers = await asyncio.gather(*asked, return_exceptions=True)
            for w, present in zip(late, answers, strict=True):
                gone = self.membership.condemn(w.worker_id) if present is False else None
                if gone is not None:
                    await self.take_over(gone, "its connection is gone")

    async def watch(self, stopping: asyncio.Event) -> None:
        """Watch the other workers; when one dies, wake its runs at once (``take_over``)."""
        await self._every_interval(
            lambda: not stopping.is_set(), self.look, "reading worker heartbeats"
        )

    async def _every_interval(
        self, going: Callable[[], bool], do: Callable[[], Awaitable[None]], what: str
    ) -> None:
        """``do`` once per beat interval while ``going()``; a failure is logged and the next
        interval tries again."""
        while going():
            await asyncio.sleep(self.settings.worker_beat_interval)
            try:
                await do()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("%s failed: %s", what, e)

    async def take_over(self, dead: WorkerBeat, why: str = "") -> None:
        """A worker died (its beats stopped, or its connection is gone): wake the runs it was
        executing, of the agents served here, so they resume now rather than when their wakes'
        ack deadline passes. Every surviving worker does it; the wakes' Msg-Id makes them one."""
        b = self._broker()
        try:
            unlisted = await claimed_after_beat(b, self.names, dead)
        except Exception as e:  # the listed runs are woken all the same
            log.warning("worker %s: runs claimed after its last beat unread: %s", dead.worker_id, e)
            unlisted = []
        mine = [r for r in (*dead.runs, *unlisted) if r.agent in self.agents]
        if not mine:
            return
        why = why or f"no heartbeat for {self.settings.worker_dead_after:g}s"
        log.warning("worker %s is dead (%s): waking %d of its runs", dead.worker_id, why, len(mine))
        incarnation = f"{dead.worker_id}:{dead.started_at:.6f}"
        for r in mine:
            wake = {
                h.WAKE_REASON: wake_reason("takeover"),
                h.MSG_ID: f"takeover:{incarnation}:{r.run_id}",
            }
            await b.publish(self.names.wake(r.run_id, r.agent, r.priority), b"", wake)
        metrics.TAKEOVERS.inc(len(mine))

    def served_elsewhere(self, agent: str) -> bool:
        """Whether another live worker serves ``agent``."""
        return self.membership.serving(agent, besides=self.worker_id)

    def holder(self, run_id: str) -> str | None:
        """The live other worker whose last beat lists ``run_id``, if any."""
        return self.membership.holder(run_id, besides=self.worker_id)

    async def held_step(self, run_id: str, history: list[Decision]) -> str | None:
        """The worker that may still be executing the run's open step (one started and never
        ended, by an activation of another worker that is alive and whose beats list the run or
        predate the step), if any. Settling such a step as in doubt would run it twice."""
        held = held_step(history)
        if held is None:
            return None
        worker, since = held
        if worker == self.worker_id or not worker:
            return None
        judged = self.membership.may_hold(worker, run_id, since)
        if judged is None:  # a worker this one has not seen yet: ask the broker
            try:
                m = await self._broker().direct_get_last(
                    self.names.health_stream, self.names.worker(worker)
                )
            except InvalidName:
                return None
            beat = None
            if m is not None:
                with contextlib.suppress(msgspec.DecodeError):
                    beat = decode_worker_beat(m.data)
            fresh = beat is not None and time.time() - beat.at < self.settings.worker_dead_after
            judged = fresh and vouches(beat, run_id, since)
        return worker if judged else None


def _checked_beat(beat: WorkerBeat) -> WorkerBeat:
    """``beat`` if every run it lists is named by tokens (what a worker writes): the runs of a
    worker that falls silent are woken by their subjects, and one that is no subject token
    (anyone may publish a beat on a deployment without authentication) would fail that wake,
    and with it the take-over of every other worker found silent in the same look.

    Raises:
        InvalidName: a run id, or an agent name other than ``""``, is not a token.
    """
    for r in beat.runs:
        validate_token(r.run_id, "run id")
        if r.agent:
            validate_token(r.agent, "agent")
    return beat
