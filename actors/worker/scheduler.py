"""Schedules in a worker: their requests (add, pause, resume, trigger, delete) and their fires.

A schedule's record is the broker's, rewritten by compare-and-set; its next fire is a one-shot
message schedule the broker fires into the fire consumer of the schedule's agent, so a fire is
stored with no process alive and taken by a worker that can start its run. Handling a fire
records the decision first (what starts, what is skipped or missed, the run to cancel, the next
fire), then creates the runs, each create-only under an id derived from its fire time, then arms
the next fire: a fire handled twice (redelivered, or by two workers) finds its decision recorded
and does only what may still be missing. Whatever crashes in between, the next delivery of the
same fire finishes the job (until the next fire is armed nothing can replace it: the stream
keeps one fire per schedule), and nothing starts twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.names import InboxSubject, Names
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.schedules import ScheduleStore, fire_headers
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_events, decode_schedule_request, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import (
    ConcurrencyConflict,
    HistoryError,
    InvalidName,
    SojournError,
)
from sojourn.schemas.lifecycle import TERMINAL_EVENTS, has_work
from sojourn.schemas.names import validate_schedule_name, validate_token
from sojourn.schemas.schedules import (
    FireOutcome,
    ScheduleAction,
    ScheduleAnswer,
    ScheduleCounts,
    ScheduleRecord,
    ScheduleRequest,
    ScheduleSpec,
)
from sojourn.schemas.wire import CancelBody, StartTrigger

from ..agents.agent import Agent
from ..core.cron import Calendar, ScheduleError
from ..core.schedules import calendar_of, check_spec, fire_time_of, jitter_of, plan_fire, run_id_for
from ..history.chain import current_run
from ..ops import metrics
from .dead_letters import dead_letter, send_dead_letter
from .debounce import DebounceFires, Debounces
from .faults import fault
from .refusals import Rejected, reply
from .schedule_records import after, check_input, expected, fits, input_error, record_fault
from .starts import ScheduledFire, Starts, handback_delay

__all__ = ["Scheduler"]

log = logging.getLogger("sojourn.schedules")

CAS_TRIES = 20
"""Compare-and-set attempts on one record before a fire is handed back (1 s) to try later."""

FIRES_IN_FLIGHT = 64
"""Fires one worker handles at once, per agent."""

KEPT_MAX = 10_000
"""Records, ended runs and calendars one worker keeps in memory (each bounded)."""

RunNew = Callable[[str, list[Decision], Delivery], Awaitable[bool]]
"""The worker's ``_run_new``: execute a run just created, holding ``msg`` until it rests."""

HeldBy = Callable[[str], bool]
"""Whether a run is executing in this worker or listed by another live worker's heartbeat."""


class Scheduler:
    """One worker's part in keeping schedules: the requests its intake receives, and the
    fires of the agents it serves."""

    def __init__(
        self,
        *,
        broker: Broker,
        names: Names,
        settings: Settings,
        starts: Starts,
        registry: AgentRegistry,
        agents: Mapping[str, Agent[Any, Any]],
        run_new: RunNew,
        held: HeldBy,
    ) -> None:
        self.broker = broker
        self.names = names
        self.settings = settings
        self.starts = starts
        self.clock = starts.clock
        """The runs' clock (the intake's): fire times are planned on it."""
        self.registry = registry
        self.agents = agents
        self.run_new = run_new
        self.held = held
        self.store = ScheduleStore(broker, names)
        self._records: OrderedDict[str, tuple[ScheduleRecord, int]] = OrderedDict()
        """The records this worker wrote last, with their sequences: a fire starts from its
        schedule's copy here (its compare-and-set refuses it if the record changed since),
        saving a read. Any check a copy fails is made again on a fresh read."""
        self._ended: OrderedDict[str, None] = OrderedDict()
        """Scheduled runs known to have ended (here, or read so): the overlap check and the
        look for unclaimed runs need no read for them."""
        self._calendars: dict[tuple[str | None, int | None, str], Calendar] = {}
        self.debounce = DebounceFires(Debounces(starts), agents, run_new, settings.max_deliveries)
        """The fires of debounced starts' bursts (decision 0047), taken beside the schedules'."""

    def run_ended(self, run_id: str) -> None:
        """A run a schedule started has ended (called by the worker when it ended here)."""
        self._ended[run_id] = None
        if len(self._ended) > KEPT_MAX:
            self._ended.popitem(last=False)

    def _kept(self, name: str, got: tuple[ScheduleRecord, int] | None) -> None:
        if got is None:
            self._records.pop(name, None)
            return
        self._records[name] = got
        self._records.move_to_end(name)
        if len(self._records) > KEPT_MAX:
            self._records.popitem(last=False)

    def _calendar(self, spec: ScheduleSpec) -> Calendar:
        key = (spec.cron, spec.every, spec.timezone)
        cal = self._calendars.get(key)
        if cal is None:
            if len(self._calendars) >= KEPT_MAX:
                self._calendars.clear()
            cal = self._calendars[key] = calendar_of(spec)
        return cal

    # --- requests ----------------------------------------------------------------------------

    async def handle_request(self, msg: Delivery, inbox: InboxSubject) -> None:
        """Carry out one ``ScheduleRequest``, answer it and settle ``msg``.

        Raises:
            Rejected: the request cannot be carried out (the intake dead-letters, answers, acks).
        """
        try:
            req = decode_schedule_request(msg.data)
        except msgspec.ValidationError as e:
            raise Rejected("invalid_trigger", f"not a schedule request: {e}") from e
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"request is not valid JSON: {e}") from e
        name = inbox.target
        try:
            if req.action == "add":
                answer = await self._add(msg, name, req, inbox.sender)
            elif req.action in ("pause", "resume"):
                answer = await self._toggle(name, pause=req.action == "pause")
            elif req.action == "delete":
                answer = await self._delete(name)
            else:
                await self._trigger(msg, name)
                return
        except HistoryError as e:  # the stored record: retrying cannot help, deleting does
            raise Rejected(
                "invalid_schedule", f"{e.message}: delete the schedule, then add it again"
            ) from e
        if answer is None:
            return  # handed back for a worker that serves the agent
        await reply(self.broker, msg, encode(answer))
        await msg.ack()

    async def _served(self, msg: Delivery, agent_name: str) -> Agent[Any, Any] | None:
        """The agent, if served here; ``None`` after handing ``msg`` back for a worker that
        serves it (as a start is).

        Raises:
            Rejected: no worker serves an agent of that name.
        """
        agent = self.agents.get(agent_name)
        if agent is not None:
            return agent
        if await self.registry.is_known(agent_name):
            await msg.nak(delay=handback_delay(msg.num_delivered))
            return None
        raise Rejected("unknown_agent", f"no worker serves an agent named '{agent_name}'")

    async def _add(
        self, msg: Delivery, name: str, req: ScheduleRequest, sender: str | None
    ) -> ScheduleAnswer | None:
        spec = req.spec
        if spec is None:
            raise Rejected("invalid_schedule", "an add names what to schedule (spec)")
        try:
            validate_token(spec.agent, "agent name")
        except InvalidName as e:
            raise Rejected("invalid_schedule", e.message) from e
        now = self.clock.now()
        try:
            cal = check_spec(spec, now)
        except ScheduleError as e:
            raise Rejected("invalid_schedule", str(e)) from e
        agent = await self._served(msg, spec.agent)
        if agent is None:
            return None
        check_input(agent, spec)
        for _ in range(CAS_TRIES):
            got = await self._get(name)
            old, seq = got if got is not None else (None, 0)
            if old is not None and old.spec == spec:
                await self._arm_pending(old)  # a redelivery may find it written, not armed
                return ScheduleAnswer(name=name, action="add", record=old, changed=False)
            if old is not None and not req.replace:
                raise Rejected(
                    "schedule_exists",
                    f"schedule {name!r} exists with another spec: replace it (--replace) or "
                    "delete it first",
                )
            record = ScheduleRecord(
                name=name,
                spec=spec,
                revision=old.revision + 1 if old is not None else 1,
                paused=old.paused if old is not None else False,
                created_at=old.created_at if old is not None else now,
                updated_at=now,
                created_by=sender,
                next_fire_at=None if old is not None and old.paused else cal.next_after(now),
                last_fire_at=old.last_fire_at if old is not None else None,
                last_run_id=old.last_run_id if old is not None else None,
                last_outcome=old.last_outcome if old is not None else None,
                counts=old.counts if old is not None else ScheduleCounts(),
            )
            try:
                await self.store.put(record, seq)
            except ConcurrencyConflict:
                continue
            if old is not None and old.spec.agent != spec.agent:
                await self.store.remove_fire(old.spec.agent, name)
            await self._arm_pending(record)
            return ScheduleAnswer(name=name, action="add", record=record)
        raise SojournError(f"schedule {name!r} kept changing; try again")

    async def _toggle(self, name: str, *, pause: bool) -> ScheduleAnswer:
        action: ScheduleAction = "pause" if pause else "resume"
        for _ in range(CAS_TRIES):
            got = await self._get(name)
            if got is None:
                raise Rejected("unknown_schedule", f"there is no schedule named {name!r}")
            old, seq = got
            if old.paused == pause:
                await self._arm_pending(old)
                return ScheduleAnswer(name=name, action=action, record=old, changed=False)
            now = self.clock.now()
            try:
                nxt = None if pause else calendar_of(old.spec).next_after(now)
            except ScheduleError as e:
                raise Rejected("invalid_schedule", str(e)) from e
            record = msgspec.structs.replace(
                old, paused=pause, revision=old.revision + 1, next_fire_at=nxt, updated_at=now
            )
            try:
                await self.store.put(record, seq)
            except ConcurrencyConflict:
                continue
            await self._arm_pending(record)
            return ScheduleAnswer(name=name, action=action, record=record)
        raise SojournError(f"schedule {name!r} kept changing; try again")

    async def _delete(self, name: str) -> ScheduleAnswer:
        try:
            got = await self._get(name)
        except HistoryError:  # a record that cannot be read names no agent: every agent's fire
            await self.store.remove(name, ["*"])
            return ScheduleAnswer(name=name, action="delete")
        if got is None:
            return ScheduleAnswer(name=name, action="delete", changed=False)
        await self.store.remove(name, [got[0].spec.agent])
        return ScheduleAnswer(name=name, action="delete")

    async def _get(self, name: str) -> tuple[ScheduleRecord, int] | None:
        """Schedule ``name``'s record and its sequence, or ``None``.

        Raises:
            HistoryError: the record cannot be read, or holds what no worker writes (see
                ``record_fault``): nothing can be done with it but delete it.
        """
        got = await self.store.get(name)
        if got is not None:
            fault = record_fault(got[0], name, self._calendar)
            if fault is not None:
                raise HistoryError(f"the record of schedule {name!r} cannot be used: {fault}")
        return got

    async def _arm_pending(self, record: ScheduleRecord) -> None:
        """Make the broker's pending fire what ``record`` says (armed, or none)."""
        if record.paused or record.next_fire_at is None:
            await self.store.disarm(record.name)
            return
        at = record.next_fire_at
        await self.store.arm(record, at, at + jitter_of(record.name, at, record.spec.jitter))

    async def _trigger(self, msg: Delivery, name: str) -> None:
        """Fire ``name`` now: at the time the inbox stored the request (the same on every
        delivery of it), under the overlap policy, whether paused or not."""
        got = await self._get(name)
        if got is None:
            raise Rejected("unknown_schedule", f"there is no schedule named {name!r}")
        agent = await self._served(msg, got[0].spec.agent)
        if agent is None:
            return
        fire_at = float(int(msg.timestamp.timestamp()))
        run_id = f"{run_id_for(name, fire_at)}-t{msg.stream_seq}"
        now = self.clock.now()
        for _ in range(CAS_TRIES):
            if got is None:
                raise Rejected("unknown_schedule", f"there is no schedule named {name!r}")
            rec, seq = got
            check_input(agent, rec.spec)
            cancel: str | None = None
            outcome: FireOutcome
            if rec.last_run_id == run_id:  # decided by an earlier delivery of this request
                record, outcome = rec, "started"
                break
            starts, skipped, cancel = await self._overlap(rec, [fire_at])
            outcome = "started" if starts else "skipped"
            record = after(
                rec,
                now,
                started=[run_id] if starts else [],
                skipped=len(skipped),
                outcome=outcome,
                chain=False,
            )
            try:
                await self.store.put(record, seq)
                break
            except ConcurrencyConflict:
                got = await self._get(name)
        else:
            raise SojournError(f"schedule {name!r} kept changing; try again")
        if cancel is not None:
            await self._cancel(cancel, name)
        metrics.schedule_fired(name, rec.spec.agent, outcome, None)
        answer = ScheduleAnswer(
            name=name,
            action="trigger",
            record=record,
            run_id=run_id if outcome == "started" else None,
            outcome=outcome,
        )
        await reply(self.broker, msg, encode(answer))
        if outcome != "started":
            await msg.ack()
            return
        await self._start_runs(record, agent, [(run_id, fire_at)], msg, arm=False)

    # --- fires -------------------------------------------------------------------------------

    async def fire_loop(self, sub: Any, agent: str, stopping: asyncio.Event) -> None:
        """Take the fires of ``agent``'s schedules from its consumer and handle them."""
        inflight = asyncio.Semaphore(FIRES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        tasks.add(asyncio.create_task(self.debounce.loop(agent, stopping)))  # its own consumer
        while not stopping.is_set():
            try:
                msgs: list[Delivery] = await sub.fetch(batch=FIRES_IN_FLIGHT, timeout=1.0)
                for m in msgs:
                    await inflight.acquire()
                    task = asyncio.create_task(self._fire_one(m, agent, inflight))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            except asyncio.CancelledError:
                for t in list(tasks):
                    t.cancel()
                raise
            except Exception:
                log.exception("fire loop of %s: error; continuing", agent)
                await asyncio.sleep(0.5)

    async def _fire_one(self, msg: Delivery, agent: str, inflight: asyncio.Semaphore) -> None:
        try:
            await self.on_fire(msg, agent)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception as e:
            # Broker trouble, or a bug: the fire comes back (bounded like any delivery).
            log.warning("fire %r: %s: %s; will retry", msg.subject[:200], type(e).__name__, e)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
        finally:
            inflight.release()

    async def _refuse(self, msg: Delivery, code: str, why: str) -> None:
        """Keep a record of a message on a fire subject that is not a fire we made; ack it."""
        record = dead_letter(msg, "other", code, why, limit=self.broker.max_payload or 1 << 20)
        await send_dead_letter(self.broker, self.names, record)
        await msg.ack()

    async def on_fire(self, msg: Delivery, agent_name: str) -> None:
        """Handle one fire: decide, record, arm the next, start; settle ``msg``."""
        head = f"{self.names.prefix}.schedule.fire.{agent_name}."
        try:
            if not msg.subject.startswith(head):
                raise InvalidName(f"{msg.subject!r} is not a fire of agent {agent_name!r}")
            name = validate_schedule_name(msg.subject[len(head) :])
        except InvalidName as e:
            await self._refuse(msg, "invalid_trigger", e.message)
            return
        if msg.header(h.GARBLED):
            await self._refuse(msg, "invalid_headers", "the header block cannot be read")
            return
        fire = fire_headers(msg.headers)
        if fire is None or not msg.header(h.SCHEDULER):
            await self._refuse(msg, "invalid_trigger", "not a fire armed by sojourn")
            return
        if msg.num_delivered >= self.settings.max_deliveries:
            await self._refuse(msg, "max_deliveries", f"fire delivered {msg.num_delivered} times")
            return
        agent = self.agents.get(agent_name)
        if agent is None:  # this worker stopped serving it: another one will
            await msg.nak(delay=1.0)
            return
        cached = self._records.get(name)
        for _ in range(CAS_TRIES):
            try:
                got = cached if cached is not None else await self._get(name)
            except HistoryError as e:
                # Handed back, it would come back every second for nothing: kept once, and
                # the schedule fires no more until it is deleted (and added again).
                log.error("schedule %s: %s; not fired", name, e.message)
                await self._refuse(msg, "poison", e.message)
                return
            fresh = cached is None
            cached = None
            if got is None:
                await msg.ack()  # deleted
                return
            rec, seq = got
            if not fresh and not expected(rec, fire.revision, fire.fire_at, agent_name):
                continue  # the copy kept here is not the record now: read it
            if rec.spec.agent != agent_name or rec.revision != fire.revision or rec.paused:
                # Armed before a change, which armed its own. Should this stale one have
                # replaced it (arms racing), arm what the record says again.
                await self._arm_pending(rec)
                await msg.ack()
                return
            if rec.last_fire_at is not None and fire.fire_at <= rec.last_fire_at:
                if fire.fire_at == rec.last_fire_at:
                    await self._redo(rec, agent, msg)  # handled, maybe not finished
                else:
                    await msg.ack()
                return
            if rec.next_fire_at != fire.fire_at:
                await self._arm_pending(rec)
                await msg.ack()
                return
            now = self.clock.now()
            try:
                cal = self._calendar(rec.spec)
            except ScheduleError as e:  # stored by a version that accepted it: cannot fire
                log.error("schedule %s: %s; not fired", name, e)
                await msg.ack()
                return
            delay_of = functools.partial(jitter_of, name, jitter=rec.spec.jitter)
            plan = plan_fire(cal, rec.spec.catch_up, fire.fire_at, now, delay_of)
            starts, skipped, cancel = await self._overlap(rec, list(plan.start))
            failed: list[float] = []
            if starts and not fits(agent, rec.spec):
                failed, starts = starts, []
            ids = [run_id_for(name, t) for t in starts]
            outcome: FireOutcome = (
                "started" if ids else "skipped" if skipped else "failed" if failed else "missed"
            )
            record = after(
                rec,
                now,
                started=ids,
                skipped=len(skipped),
                missed=plan.missed,
                failed=len(failed),
                outcome=outcome,
                chain=True,
                newest=plan.newest,
                next_at=plan.next_at,
                cancelled=cancel,
            )
            try:
                self._kept(name, (record, await self.store.put(record, seq)))
                break
            except ConcurrencyConflict:
                self._kept(name, None)
                continue
        else:
            await msg.nak(delay=1.0)
            return
        for t in starts:
            lateness = now - (t + jitter_of(name, t, rec.spec.jitter))
            metrics.schedule_fired(name, agent_name, "started", max(0.0, lateness))
        dropped: tuple[tuple[FireOutcome, int], ...] = (
            ("skipped", len(skipped)),
            ("missed", plan.missed),
        )
        for counted, n in dropped:
            for _ in range(min(n, 1000)):
                metrics.schedule_fired(name, agent_name, counted, None)
        if failed:
            for _ in failed:
                metrics.schedule_fired(name, agent_name, "failed", None)
            why = input_error(agent, rec.spec) or "input does not fit the agent"
            letter = dead_letter(
                msg, "start", "invalid_input", f"schedule {name!r}: {why}", limit=1 << 20
            )
            await send_dead_letter(self.broker, self.names, letter)
        if cancel is not None:
            await self._cancel(cancel, name)
        await self._start_runs(record, agent, [(run_id_for(name, t), t) for t in starts], msg)
        await self._wake_unclaimed(rec, agent_name)

    async def _wake_unclaimed(self, rec: ScheduleRecord, agent: str) -> None:
        """Wake a run of an earlier fire that may have lost its only claim (``rec``: the record
        as this fire found it).

        A fire's run executes in the worker that handled the fire, which holds the fire
        unacknowledged until the run rests; should that worker die before its heartbeat lists
        the run, the fire's redelivery wakes it (``_redo``). But the stream keeps one fire per
        schedule, and this fire replaced that one: for a schedule firing more often than the
        consumer's ack wait, nothing else would wake the run but a watchdog (and under overlap
        ``skip`` the schedule would skip every fire meanwhile). So a run of the last fire that
        did not end here and that no live worker holds is looked at: one with work left (not
        ended, parked or suspended) is woken. A wake is only a hint: the claim checks and the
        fence keep a run to one executor."""
        for run_id in dict.fromkeys((*rec.last_runs, rec.last_run_id)):
            if run_id is None or run_id in self._ended or self.held(run_id):
                continue
            last = await self.broker.direct_get_last(
                self.names.events_stream, self.names.events(run_id)
            )
            try:
                unclaimed = last is not None and has_work(decode_events(last.data))
            except msgspec.MsgspecError:
                continue  # a poison history is not ours to wake
            if unclaimed:
                log.warning("schedule %s: run %s has no worker: waking it", rec.name, run_id)
                await publish_wake(self.broker, self.names, run_id, "takeover", agent=agent)

    async def _redo(self, rec: ScheduleRecord, agent: Agent[Any, Any], msg: Delivery) -> None:
        """A fire handled before (its decision is recorded): arm the next fire and create the
        runs it decided, in case the handler stopped before doing so. Both are idempotent."""
        if rec.last_cancelled is not None:
            await self._cancel(rec.last_cancelled, rec.name)
        runs = [(r, t) for r in rec.last_runs if (t := fire_time_of(r)) is not None]
        await self._start_runs(rec, agent, runs, msg)

    async def _overlap(
        self, rec: ScheduleRecord, starts: list[float]
    ) -> tuple[list[float], list[float], str | None]:
        """Apply the overlap policy to the fire times ``starts``: what starts, what is
        skipped, and the live run to cancel first (``cancel-previous``)."""
        if not starts or rec.spec.overlap == "allow":
            return starts, [], None
        # One live run at a time: of several due fire times, only the newest may start.
        extra, starts = starts[:-1], starts[-1:]
        live = await self._live(rec.last_run_id)
        if live is None:
            return starts, extra, None
        if rec.spec.overlap == "skip":
            return [], extra + starts, None
        return starts, extra, live

    async def _live(self, run_id: str | None) -> str | None:
        """The current run of ``run_id``'s chain if it has not ended, else ``None``."""
        if run_id is None or run_id in self._ended:
            return None
        rid, last = await current_run(self.broker, self.names, run_id)
        if last is None:
            return None
        try:
            events = decode_events(last.data)
        except msgspec.DecodeError:
            return None  # a poison history is not a live run
        if events and isinstance(events[-1], TERMINAL_EVENTS):
            if rid == run_id:
                self.run_ended(run_id)
            return None
        return rid

    async def _cancel(self, run_id: str, name: str) -> None:
        body = CancelBody(reason=f"schedule {name}: replaced by its next run (cancel-previous)")
        await self.broker.publish(
            self.names.cancel(run_id, self.broker.sender("worker")),
            encode(body),
            {h.MSG_ID: f"schedule-cancel:{name}:{run_id}"},
        )

    async def _start_runs(
        self,
        rec: ScheduleRecord,
        agent: Agent[Any, Any],
        runs: list[tuple[str, float]],
        msg: Delivery,
        *,
        arm: bool = True,
    ) -> None:
        """Create the runs ``(run_id, fire time)`` (create-only), then (``arm``) arm the
        schedule's next fire, then settle ``msg``: held by the last run if this worker
        executes it at once, else acked.

        Created before armed: until the next fire is armed, nothing can replace ``msg`` (the
        stream keeps one fire per schedule), so if this stops halfway the same fire comes back
        and finishes the job."""
        made: list[tuple[str, list[Decision] | None, bool]] = []
        for run_id, at in runs:
            trigger = StartTrigger(input=rec.spec.input, run_id=run_id, budget=rec.spec.budget)
            fire = ScheduledFire(name=rec.name, at=at)
            try:
                got = await self.starts.create_scheduled(msg, agent.name, trigger, fire)
            except Rejected as r:
                log.warning("schedule %s: run %s not started: %s", rec.name, run_id, r.message)
                continue
            if got is not None:
                made.append((run_id, got[1], got[2]))
        if arm:
            await self._arm_pending(rec)
        fault("fired")
        for i, (run_id, history, wake) in enumerate(made):
            if history is not None and i == len(made) - 1:
                if await self.run_new(run_id, history, msg):
                    return  # the run executes here; msg is settled when it rests
            if wake:
                await publish_wake(self.broker, self.names, run_id, "start", agent=agent.name)
        await msg.ack()
