"""The Python client: start runs, await results, read status and history, cancel.

Clients never write run events. ``start`` publishes a trigger on
``<prefix>[.as.<user>].start.<agent>.<run_id>``, which the inbox stream captures: the JetStream
publish ack is the durable receipt, even while no worker is up, and until a worker takes it the
run is ``pending``, found by its id in the inbox. Everything else reads the run's event subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncGenerator, Iterable
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.archive import ArchiveStore
from sojourn.broker.connection import Broker, ConnectOptions, JetStreamError
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.follow import read_all
from sojourn.broker.names import Names
from sojourn.broker.progress import ProgressStore
from sojourn.broker.schedules import ScheduleStore
from sojourn.broker.topology import ensure_topology
from sojourn.projections.liveness import Thresholds, claim, classify, holders
from sojourn.projections.summary import summarize_all
from sojourn.schemas.codec import (
    decode_events,
    decode_intake_reply,
    decode_schedule_answer,
    decode_wedge_record,
    decode_worker_beat,
    encode,
    from_raw,
    to_raw,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import (
    BrokerUnavailable,
    InvalidName,
    PayloadTooLarge,
    RunNotFound,
    SojournError,
    UnknownAgent,
)
from sojourn.schemas.events import (
    Budget,
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
)
from sojourn.schemas.health import Liveness
from sojourn.schemas.names import (
    RESERVED_SIGNAL_PREFIX,
    reserved_run_id,
    validate_schedule_name,
    validate_signal_name,
    validate_token,
)
from sojourn.schemas.schedules import (
    CatchUp,
    Overlap,
    ScheduleAnswer,
    ScheduleRecord,
    ScheduleRequest,
    ScheduleSpec,
)
from sojourn.schemas.views import RunsPage, RunView
from sojourn.schemas.wire import (
    BudgetBody,
    CancelBody,
    InDoubtDecision,
    IntakeError,
    IntakeOk,
    ResumeBody,
    StartTrigger,
)

from ..core.cron import ScheduleError, parse_duration
from ..core.schedules import check_spec
from ..core.state import RunState, fold
from ..history.chain import current_run
from ..history.pending import PendingRun, find_pending
from ..history.snapshots import current as current_snapshot
from ..history.values import values_for
from ..ops.archive import read_archived
from .listing import list_runs
from .output import OutputReader, read_output
from .watching import read_view, watch_run

__all__ = [
    "Client",
    "PendingRun",
    "RunCancelledError",
    "RunFailedError",
    "StartReceipt",
    "TriggerRejected",
]

T = TypeVar("T")


class TriggerRejected(SojournError):
    """The intake refused a trigger; ``code`` is one of ``sojourn.schemas.REJECT_CODES``."""

    def __init__(self, code: str, message: str, *, run_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}", run_id=run_id)
        self.code = code


class RunFailedError(SojournError):
    """The awaited run failed; ``error`` is the recorded ``ErrorInfo``."""

    def __init__(self, run_id: str, error: ErrorInfo | None) -> None:
        detail = f"{error.type}: {error.message}" if error else "unknown error"
        super().__init__(f"run {run_id} failed: {detail}", run_id=run_id)
        self.error = error


class RunCancelledError(SojournError):
    """The awaited run was cancelled."""


class StartReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Client.trigger`` learned: the run id and, if the intake answered in time,
    whether this call created the run (``queued`` means no worker answered yet)."""

    run_id: str
    created: bool | None
    queued: bool


class Client:
    """Talks to a sojourn deployment over NATS.

    Example:
        >>> async def main():                                         # doctest: +SKIP
        ...     async with await Client.connect() as client:
        ...         run_id = await client.start("greeter", {"name": "Ada"})
        ...         print(await client.result(run_id, timeout=30))
    """

    def __init__(
        self,
        broker: Broker,
        settings: Settings | None = None,
        *,
        owns_broker: bool = False,
        speaks_for: Iterable[str] = (),
    ) -> None:
        self.broker = broker
        self.settings = settings or Settings()
        self.names = Names(self.settings.prefix)
        self.store = EventStore(broker, self.names, self.settings)
        self.archive = ArchiveStore(broker, self.names)
        self.speaks_for: frozenset[str] = frozenset(
            validate_token(n, "name to speak for") for n in speaks_for
        )
        """Names this client may send as besides its connection's user (an HTTP gateway's
        callers). The broker's permissions decide (``AuthUser.speaks_for``); this only turns a
        name it would refuse into a ``ValueError`` before anything is published."""
        self._owns = owns_broker
        self._ready = False

    @classmethod
    async def connect(
        cls,
        nats: str | ConnectOptions | None = None,
        *,
        settings: Settings | None = None,
        speaks_for: Iterable[str] = (),
    ) -> Client:
        """Connect to ``nats`` (default ``$SOJOURN_NATS_URL`` or ``nats://127.0.0.1:4222``): a
        URL, with ``user:password@`` if the server wants them, or ``ConnectOptions`` (a creds
        file, TLS files). ``speaks_for``: see the attribute.

        Raises:
            BrokerUnavailable: no server answered.
            CredentialsError: the server refused the credentials, or a creds or TLS file
                cannot be used.
        """
        broker = await Broker.connect(nats, name="sojourn-client")
        return cls(broker, settings, owns_broker=True, speaks_for=speaks_for)

    async def close(self) -> None:
        if self._owns:
            await self.broker.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _ensure(self) -> None:
        """Make sure the streams exist before the first publish: create the missing ones
        where this user may (never reconfigure existing ones: workers own their config).

        Raises:
            PermissionDenied: a stream is missing and this user may not create it (a client
                role: start a worker first), or the credentials are for another prefix.
        """
        if not self._ready:
            await ensure_topology(self.broker, self.names, self.settings, consumers=False)
            self._ready = True

    # --- starting runs -----------------------------------------------------------------------

    async def start(
        self,
        agent: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        wait: bool = False,
        timeout: float = 5.0,
        budget: Budget | None = None,
        sender: str | None = None,
    ) -> str:
        """Start a run of ``agent`` and return its run id.

        Idempotent: the same ``run_id`` started twice is one run, forever. Without ``run_id``
        a fresh one is generated here. With ``wait=True`` this waits up to ``timeout`` for the
        intake's answer and raises ``TriggerRejected`` if the trigger was refused. ``budget``:
        limits for this run, each replacing the agent's own (``Budget``). ``sender`` (a name
        token) is recorded as who started it (``RunStarted.trigger.sent_by``); on an
        authenticated connection it is the connection's user unless it is one of
        ``speaks_for``.

        Raises:
            InvalidName: ``agent``, ``run_id`` or ``sender`` is not a valid name.
            ValueError: ``sender`` is not this connection's user or one it speaks for.
            PayloadTooLarge: the encoded trigger exceeds ``settings.max_payload``.
            TriggerRejected: (``wait=True``) the intake refused it.
            BrokerUnavailable: the broker did not take the trigger.
        """
        receipt = await self.trigger(
            agent, input, run_id=run_id, wait=wait, timeout=timeout, budget=budget, sender=sender
        )
        return receipt.run_id

    async def trigger(
        self,
        agent: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
        budget: Budget | None = None,
        sender: str | None = None,
    ) -> StartReceipt:
        """Like ``start`` but returns the intake's full answer (see ``StartReceipt``)."""
        validate_token(agent, "agent name")
        who = self._sender(sender)
        run_id = validate_token(run_id, "run_id") if run_id is not None else _new_run_id()
        why = reserved_run_id(run_id)
        if why is not None:
            # The intake would refuse it (invalid_run_id): only sojourn makes ids of this
            # form. Said here, before anything is published.
            raise InvalidName(f"run id {run_id!r} {why}")
        limits = None if budget is None or budget.empty else BudgetBody(**_limits(budget))
        body = encode(StartTrigger(input=to_raw(input), run_id=run_id, budget=limits))
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"trigger is {len(body)} bytes; the limit is {self.settings.max_payload} "
                "(Settings.max_payload): store large inputs elsewhere and pass a reference",
                run_id=run_id,
            )
        await self._ensure()
        headers = {h.MSG_ID: f"start:{agent}:{run_id}"}
        # The run id in the subject makes the stored trigger findable: the run is pending.
        subject = self.names.start(agent, who, run_id)
        if not wait:
            await self._publish(subject, body, headers)
            return StartReceipt(run_id=run_id, created=None, queued=True)
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if reply == "duplicate":
            # The inbox already holds this exact trigger (a retry inside the dedup window):
            # the intake answers only once, so answer from the run's history instead.
            exists = await self.store.last_seq(run_id) > 0
            return StartReceipt(run_id=run_id, created=False if exists else None, queued=not exists)
        if reply is None:
            return StartReceipt(run_id=run_id, created=None, queued=True)
        if isinstance(reply, IntakeError):
            if reply.error.code == "unknown_agent":
                raise UnknownAgent(reply.error.message)
            raise TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)
        return StartReceipt(run_id=reply.run_id, created=reply.created, queued=False)

    async def _publish_answered(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        sender: str | None = None,
    ) -> IntakeOk | IntakeError | Literal["duplicate"] | None:
        """Publish to the inbox asking the intake to answer: its answer, ``"duplicate"`` when
        the broker already holds this very message (the intake answers only once), ``None``
        when no answer came within ``timeout`` (stored; no worker has taken it yet). The
        answer comes to an inbox of ``sender``'s, the only place the intake answers it."""
        inbox = self.broker.new_inbox(sender if self.identity is not None else None)
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            if await self._publish(subject, body, {**headers, h.REPLY_TO: inbox}):
                return "duplicate"
            try:
                msg = await sub.next_msg(timeout=timeout)
            except TimeoutError:
                return None
        finally:
            await sub.unsubscribe()
        reply = decode_intake_reply(msg.data)
        assert isinstance(reply, IntakeOk | IntakeError)
        return reply

    @property
    def identity(self) -> str | None:
        """Who this client is to sojourn: the authenticated NATS user of its connection, if
        any. Messages then travel on ``<prefix>.as.<user>...`` subjects, the only ones the
        broker lets that user publish on, so the history records who sent them."""
        return self.broker.user

    def _sender(self, claimed: str | None) -> str | None:
        """The sender token to publish as: the authenticated user, or one of the names it
        speaks for (``speaks_for``: the broker lets it), else what the caller claims (trusted
        only where the deployment has no authentication)."""
        if self.identity is not None:
            if claimed is None or claimed == self.identity:
                return self.identity
            if claimed in self.speaks_for:
                return claimed
            raise ValueError(
                f"this connection is authenticated as {self.identity!r}: it cannot send as "
                f"{claimed[:200]!r} (a gateway's user speaks only for the names it is given)"
            )
        return None if claimed is None else validate_token(claimed, "sender")

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> bool:
        """Publish to the inbox; ``True`` when the broker says it is a duplicate."""
        try:
            ack = await self.broker.try_publish(subject, body, headers)
        except TimeoutError as e:
            raise BrokerUnavailable("the inbox did not acknowledge the trigger in time") from e
        if isinstance(ack, JetStreamError):
            raise BrokerUnavailable(f"the inbox did not store the trigger: {ack.description}")
        return ack.duplicate

    async def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        sender: str | None = None,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> str:
        """Send the signal ``name`` to a run (durable: buffered until the run waits for it).

        ``signal_id`` makes a retried send count once, forever (default: a fresh id per call,
        returned). The JetStream ack is the receipt, even while no worker is up. ``sender``
        (a name token) is recorded as who sent it; on an authenticated connection the sender
        is always the connection's user. With ``wait=True`` this waits up to ``timeout`` for
        the intake to record it, and raises ``TriggerRejected`` if it refused it (``run_ended``,
        ``unknown_run``...); a signal id recorded before counts as recorded.

        Raises:
            InvalidName: bad run id, signal name or sender, or a reserved (``sojourn-``) name.
            PayloadTooLarge: the encoded payload exceeds ``settings.max_payload``.
            TriggerRejected: (``wait=True``) the intake refused it.
        """
        validate_token(run_id, "run_id")
        validate_signal_name(name)
        if name.startswith(RESERVED_SIGNAL_PREFIX):
            raise InvalidName(f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved")
        if signal_id is not None and not _SIGNAL_ID.fullmatch(signal_id):
            raise InvalidName(
                f"signal id {signal_id[:64]!r}: 1 to 200 characters of A-Z a-z 0-9 . _ : -"
            )
        who = self._sender(sender)
        body = encode(payload)
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"signal payload is {len(body)} bytes; the limit is {self.settings.max_payload}",
                run_id=run_id,
            )
        await self._ensure()
        sid = signal_id or uuid.uuid4().hex
        # The broker's Msg-Id dedup spans the whole inbox: scope it to the run, so the same
        # signal id used for two runs is two signals. The intake dedups by Sojourn-Signal-Id.
        headers = {h.MSG_ID: f"signal:{run_id}:{sid}", h.SIGNAL_ID: sid}
        subject = self.names.signal(run_id, name, who)
        if not wait:
            await self._publish(subject, body, headers)
            return sid
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if reply == "duplicate":
            # Sent before within the dedup window, and answered then: what happened to it is in
            # the run's history (recorded under its id, or refused because the run ended).
            snap = await current_snapshot(self.store, run_id)
            if snap is None or sid in snap.signal_ids or not snap.state.terminal:
                return sid
            raise TriggerRejected(
                "run_ended", f"run '{run_id}' has ended ({snap.state.status})", run_id=run_id
            )
        if isinstance(reply, IntakeError):
            raise TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)
        return sid

    def _operator(self, by: str | None) -> str:
        """The sender of a control message, which always has one."""
        return self._sender(by) or self.broker.sender("anonymous")

    async def resume(self, run_id: str, note: str = "", *, by: str | None = None) -> None:
        """Lift a suspension (a poll cap reached, non-determinism after a code fix): the run
        replays again. Durable, like a signal. Needs the admin role where the deployment
        authenticates; ``by`` (a name token, default the connection's user) is recorded."""
        validate_token(run_id, "run_id")
        await self._ensure()
        body = encode(ResumeBody(note=note))
        await self._publish(
            self.names.resume(run_id, self._operator(by)),
            body,
            {h.MSG_ID: f"resume:{run_id}:{uuid.uuid4().hex}"},
        )

    async def set_budget(self, run_id: str, budget: Budget, *, by: str | None = None) -> None:
        """Change a run's budget: each limit ``budget`` sets replaces the run's own (the rest
        stay). A run suspended because it used up a limit is resumed, and checks its new
        limits at its next step. Durable, like a signal; needs the admin role where the
        deployment authenticates; ``by`` (a name token, default the connection's user) is
        recorded.

        Raises:
            ValueError: ``budget`` sets no limit.
        """
        validate_token(run_id, "run_id")
        if budget.empty:
            raise ValueError("a budget change names at least one limit")
        await self._ensure()
        await self._publish(
            self.names.budget(run_id, self._operator(by)),
            encode(BudgetBody(**_limits(budget))),
            {h.MSG_ID: f"budget:{run_id}:{uuid.uuid4().hex}"},
        )

    async def decide(
        self, run_id: str, position: int, action: str, result: Any = None, *, by: str | None = None
    ) -> None:
        """Settle an in-doubt step of a run suspended by ``@step(in_doubt="ask")`` (or as a
        ``crash_loop``): ``retry``
        runs it again (same idempotency key), ``skip`` records ``result`` as its result without
        running it, ``fail`` fails it. Then the run resumes."""
        if action not in ("retry", "skip", "fail"):
            raise ValueError("action must be retry, skip or fail")
        op = (await self.state(run_id)).op(int(position))
        if op is None or op.kind != "step" or op.status != "started":
            raise ValueError(f"position {position} of run {run_id} is not an in-doubt step")
        # One message: the intake records the decision and resumes the run in one append.
        await self._publish(
            self.names.decide(run_id, int(position), op.attempts, self._operator(by)),
            encode(InDoubtDecision(action=action, result=to_raw(result))),  # type: ignore[arg-type]
            {h.MSG_ID: f"decide:{run_id}:{uuid.uuid4().hex}"},
        )

    # --- schedules ---------------------------------------------------------------------------

    async def add_schedule(
        self,
        name: str,
        *,
        agent: str,
        every: str | int | timedelta | None = None,
        cron: str | None = None,
        input: Any = None,
        timezone: str = "UTC",
        overlap: Overlap = "skip",
        catch_up: CatchUp = "latest",
        jitter: float = 0.0,
        budget: Budget | None = None,
        replace: bool = False,
        timeout: float = 10.0,
        by: str | None = None,
    ) -> ScheduleRecord:
        """Create schedule ``name``: a run of ``agent`` with ``input`` at every fire time,
        kept by the broker (no process needs to be up for a fire to happen on time; one is
        needed to run it). Exactly one of ``every`` (``"10s"``, ``"1h30m"``, seconds, a
        ``timedelta``: whole seconds, epoch-anchored) and ``cron`` (5 or 6 fields, the wall
        clock of ``timezone``). Adding the same spec again changes nothing; another spec under
        an existing name is refused unless ``replace``. Returns the stored record (its
        ``next_fire_at``).

        Raises:
            ScheduleError: the expression, interval, zone or jitter cannot be used.
            TriggerRejected: the intake refused it (``schedule_exists``, ``invalid_input``,
                ``unknown_agent``, ...).
            TimeoutError: no worker answered within ``timeout`` (the request stays queued).
        """
        spec = schedule_spec(
            name,
            agent=agent,
            every=every,
            cron=cron,
            input=input,
            timezone=timezone,
            overlap=overlap,
            catch_up=catch_up,
            jitter=jitter,
            budget=budget,
        )
        answer = await self._schedule_request(
            name, ScheduleRequest(action="add", spec=spec, replace=replace), timeout, by
        )
        assert answer.record is not None
        return answer.record

    async def schedules(self) -> list[ScheduleRecord]:
        """Every schedule of the deployment, by name (read from the broker: no worker needed)."""
        await self._ensure()
        return await ScheduleStore(self.broker, self.names).all()

    async def schedule(self, name: str) -> ScheduleRecord | None:
        """Schedule ``name``'s record, or ``None``."""
        validate_schedule_name(name)
        await self._ensure()
        got = await ScheduleStore(self.broker, self.names).get(name)
        return None if got is None else got[0]

    async def pause_schedule(
        self, name: str, *, timeout: float = 10.0, by: str | None = None
    ) -> ScheduleRecord:
        """Stop ``name``'s fires (its pending fire is removed); the schedule is kept."""
        answer = await self._schedule_request(name, ScheduleRequest(action="pause"), timeout, by)
        assert answer.record is not None
        return answer.record

    async def resume_schedule(
        self, name: str, *, timeout: float = 10.0, by: str | None = None
    ) -> ScheduleRecord:
        """Fire ``name`` again, from its next fire time after now (the fire times that passed
        while it was paused are not caught up)."""
        answer = await self._schedule_request(name, ScheduleRequest(action="resume"), timeout, by)
        assert answer.record is not None
        return answer.record

    async def trigger_schedule(
        self, name: str, *, timeout: float = 10.0, by: str | None = None
    ) -> ScheduleAnswer:
        """Fire ``name`` now, paused or not, under its overlap policy: the answer's
        ``outcome`` is ``started`` (with ``run_id``) or ``skipped``."""
        return await self._schedule_request(name, ScheduleRequest(action="trigger"), timeout, by)

    async def delete_schedule(
        self, name: str, *, timeout: float = 10.0, by: str | None = None
    ) -> bool:
        """Remove ``name`` and everything the broker keeps of it; ``False`` if there was no
        such schedule. Runs it started are not touched."""
        answer = await self._schedule_request(name, ScheduleRequest(action="delete"), timeout, by)
        return answer.changed

    async def _schedule_request(
        self, name: str, req: ScheduleRequest, timeout: float, by: str | None
    ) -> ScheduleAnswer:
        validate_schedule_name(name)
        body = encode(req)
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"schedule request is {len(body)} bytes; the limit is "
                f"{self.settings.max_payload} (Settings.max_payload)"
            )
        await self._ensure()
        operator = self._operator(by)
        inbox = self.broker.new_inbox(operator if self.identity is not None else None)
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            headers = {h.REPLY_TO: inbox, h.MSG_ID: f"schedule:{name}:{uuid.uuid4().hex}"}
            await self._publish(self.names.schedule(name, operator), body, headers)
            try:
                msg = await sub.next_msg(timeout=timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no worker answered the {req.action} of schedule {name!r} within "
                    f"{timeout:g} s (it stays queued: is a worker serving its agent up?)"
                ) from None
        finally:
            await sub.unsubscribe()
        return _schedule_answer(msg.data, name)

    async def cancel(
        self,
        run_id: str,
        reason: str = "",
        *,
        by: str | None = None,
        terminate: bool = False,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> None:
        """Ask for a run to be cancelled (durable: takes effect even if no worker is up).
        ``by`` (a name token, default the connection's user) is recorded as who asked.

        A running step is interrupted within about a second (an async one cancelled, a sync
        one abandoned in its thread); the agent's compensation (``on_cancel``) runs, then the
        run ends ``cancelled`` and its live children are cancelled. ``terminate=True`` is
        ``terminate``. With ``wait=True`` this waits up to ``timeout`` for the intake to
        record it, and raises ``TriggerRejected`` if it refused it (``unknown_run``...)."""
        validate_token(run_id, "run_id")
        who = self._sender(by)
        await self._ensure()
        body = encode(CancelBody(reason=reason, terminate=terminate))
        subject = self.names.cancel(run_id, who)
        headers = {h.MSG_ID: f"cancel:{run_id}:{uuid.uuid4().hex}"}
        if not wait:
            await self._publish(subject, body, headers)
            return
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if isinstance(reply, IntakeError):
            raise TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)

    async def terminate(self, run_id: str, reason: str = "", *, by: str | None = None) -> None:
        """End a run at once without its compensation: a running step is interrupted as by
        ``cancel``, ``on_cancel`` does not run (nor the rest of a compensation under way), and
        the run ends ``cancelled``, its reason saying it was terminated. Its live children
        are terminated too."""
        await self.cancel(run_id, reason, by=by, terminate=True)

    # --- reading runs ------------------------------------------------------------------------

    async def history(self, run_id: str) -> list[Decision]:
        """Every stored decision of the run, oldest first (empty if it does not exist).

        An ended run that retention moved out of the hot streams (``Settings.retain_ended``)
        is read from the archive: the same decisions as before. The hot stream is asked
        first; the archive only when it holds nothing of the run (or, should anything have
        been appended after the run was archived, not its start).

        Raises:
            HistoryError: the run's archived copy is damaged.
        """
        validate_token(run_id, "run_id")
        hot = await self.store.load(run_id)
        if hot and hot[0].events and isinstance(hot[0].events[0], RunStarted):
            return hot
        archived = await read_archived(self.archive, run_id)
        if not archived:
            return hot
        return [*archived, *(d for d in hot if d.seq > archived[-1].seq)]

    async def state(self, run_id: str) -> RunState:
        """The run's current state (the fold of its history).

        Raises:
            RunNotFound: no such run.
        """
        history = await self.history(run_id)
        if not history:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        return fold(e for d in history for e in d.events)

    async def liveness(self, run_id: str, *, now: float | None = None) -> Liveness:
        """What the run is doing now, judged like the watchdog judges it: from its history,
        the last heartbeat of the worker that holds it, and any wedge record.

        Raises:
            RunNotFound: no such run.
        """
        history = await self.history(run_id)
        if not history:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        summary = summarize_all((d.seq, 0, d.events) for d in history)
        progress = await ProgressStore(self.broker, self.names).last(run_id)
        m = await self.broker.direct_get_last(self.names.health_stream, self.names.wedge(run_id))
        wedge = None
        if m is not None:
            with contextlib.suppress(msgspec.MsgspecError):
                wedge = decode_wedge_record(m.data)
        limits = Thresholds(
            stall_after=self.settings.stall_threshold, overdue_after=self.settings.overdue_after
        )
        beats = []
        for b in await read_all(self.broker, self.names.health_stream, self.names.workers_all):
            with contextlib.suppress(msgspec.MsgspecError):
                beats.append(decode_worker_beat(b.data))
        listed = holders(beats).get(run_id)
        lease, beat = claim(listed, progress), listed[0] if listed else None
        now = time.time() if now is None else now
        return classify(summary, lease, now, limits, wedge, beat)

    async def pending(self, run_id: str) -> PendingRun | None:
        """The run's start, if it is stored in the inbox and no worker has taken it yet (the
        run has no history): which agent it names and since when it waits. ``None`` for a run
        that exists, or of which nothing is known.

        Only starts that name their run in the subject are found (``Client.start`` and
        ``sojourn start`` send that form; a start on ``<prefix>.start.<agent>`` is not)."""
        validate_token(run_id, "run_id")
        if await self.store.last_seq(run_id) > 0:
            return None
        return await find_pending(
            self.broker, self.names, run_id, max_payload=self.settings.max_payload
        )

    # --- the read side (kept by a projector) ---------------------------------------------------

    async def view(self, run_id: str) -> RunView | None:
        """The run's view in the runs bucket (``schemas.views.RunView``: status, liveness, what
        it waits for, its step, spend and budget...) as the projector last wrote it; ``None``
        when there is none (no projector runs, or the run is unknown to it)."""
        validate_token(run_id, "run_id")
        return await read_view(self.broker, self.names, run_id)

    async def runs(
        self,
        *,
        agent: str | None = None,
        status: str | Iterable[str] = (),
        liveness: str | Iterable[str] = (),
        since: float | timedelta | None = None,
        parent_run_id: str | None = None,
        schedule: str | None = None,
        limit: int = 100,
        after: str | None = None,
        timeout: float = 5.0,
    ) -> RunsPage:
        """One page of runs matching every filter given, most recently updated first, from a
        projector's read model. ``status`` and ``liveness`` take one value or several (any of
        them); ``since`` is a unix time or a ``timedelta`` (updated within it). More pages:
        pass the answer's ``next`` as ``after``.

        Raises:
            InvalidName / ValueError: a filter is not valid.
            SojournError: no projector answers (start ``sojourn projector`` or ``sojourn
                dev``), or it refused the query.
        """
        if isinstance(since, timedelta):
            since = time.time() - since.total_seconds()
        return await list_runs(
            self.broker,
            self.names,
            agent=agent,
            status=_values(status),  # type: ignore[arg-type]  # validated by list_runs
            liveness=_values(liveness),  # type: ignore[arg-type]
            since=since,
            parent_run_id=parent_run_id,
            schedule=schedule,
            limit=limit,
            after=after,
            timeout=timeout,
        )

    def watch(self, run_id: str, *, timeout: float | None = None) -> AsyncGenerator[RunView, None]:
        """Every view of the run, in order, until it ends (the terminal view is the last): the
        views already stored first, then each new one as the projector writes it. Needs a
        running projector. Use ``contextlib.aclosing`` to stop early. A run that continued as
        new is followed: after its end come the views of its chain's next run (``run_id`` of
        each view says which), until the chain's last run ends.

        Raises (while iterating):
            RunNotFound: nothing is known of the run, or its start was refused.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        validate_token(run_id, "run_id")
        return self._watch_chain(run_id, timeout)

    async def _watch_chain(
        self, run_id: str, timeout: float | None
    ) -> AsyncGenerator[RunView, None]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(deadline - loop.time(), 0.001)
            last: RunView | None = None
            async with contextlib.aclosing(
                watch_run(self.broker, self.names, run_id, timeout=left)
            ) as views:
                async for view in views:
                    last = view
                    yield view
            if last is None or last.status != "completed":
                return
            nxt, _ = await current_run(self.broker, self.names, run_id)
            if nxt == run_id:
                return
            run_id = nxt

    def stream(
        self, run_id: str, *, after: int = 0, follow: bool = True, timeout: float | None = None
    ) -> OutputReader:
        """The run's output chunks (``ctx.stream``, ``ctx.progress``) after offset ``after``,
        then new ones until the run ends (``follow``). Each ``OutputChunk`` has its ``offset``:
        keep the last one to resume exactly there after a disconnect, hours later.

        Example:
            >>> async with client.stream(run_id, after=last) as chunks:  # doctest: +SKIP
            ...     async for c in chunks:
            ...         print(c.text, end="")
            ...         last = c.offset
        """
        validate_token(run_id, "run_id")
        return read_output(
            self.broker, self.names, run_id, after=after, follow=follow, timeout=timeout
        )

    async def current_run(self, run_id: str) -> str:
        """The run of ``run_id``'s continue-as-new chain that carries on now: ``run_id``
        itself unless it continued as new (``RunState.continued_as`` names the next run;
        ``status`` is then ``completed``), else its chain's latest run."""
        validate_token(run_id, "run_id")
        current, _ = await current_run(self.broker, self.names, run_id)
        return current

    async def status(self, run_id: str) -> str:
        """``pending``, ``running``, ``waiting``, ``suspended``, ``completed``, ``failed`` or
        ``cancelled``. A run whose start is stored and not yet taken by a worker is
        ``pending`` (see ``pending``).

        Raises:
            RunNotFound: the run has no history and no stored start.
        """
        history = await self.history(run_id)
        if history:
            return fold(e for d in history for e in d.events).status
        if await self.pending(run_id) is None:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        return "pending"

    @overload
    async def result(self, run_id: str, *, timeout: float | None = None) -> Any: ...

    @overload
    async def result(self, run_id: str, *, timeout: float | None = None, type: type[T]) -> T: ...

    async def result(self, run_id: str, *, timeout: float | None = None, type: Any = None) -> Any:
        """Wait for the run to end and return its output, decoded as ``type``.

        Works for runs that ended long ago and runs that have not started yet. A run that
        continued as new (``ctx.continue_as_new``) has not ended for this: the answer is the
        outcome of its chain's last run, whichever run of the chain ``run_id`` names.

        Raises:
            RunFailedError / RunCancelledError: the run ended without output.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        validate_token(run_id, "run_id")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end = await self._end_of(run_id, deadline, timeout)
            if isinstance(end, RunCompleted) and end.continued_as is not None:
                run_id, _ = await current_run(self.broker, self.names, end.continued_as)
                continue
            if isinstance(end, RunCompleted) and end.output_ref is not None:
                end = await values_for(self.broker, self.names, self.settings).resolve_one(end)
            return _outcome(run_id, end, Any if type is None else type)

    async def _end_of(self, run_id: str, deadline: float | None, timeout: float | None) -> RunEvent:
        """The terminal event of ``run_id``, once it is stored (before ``deadline``)."""
        changed = asyncio.Event()

        def terminal_in(data: bytes) -> RunEvent | None:
            try:
                events = decode_events(data)
            except msgspec.MsgspecError:
                return None
            return next((e for e in events if isinstance(e, _TERMINAL)), None)

        async def on_event(msg: Delivery) -> None:
            # Only a hint: a plain subscriber also sees appends the stream refused (a fenced
            # writer's), so the answer is always read back from what the stream stored.
            if terminal_in(msg.data) is not None:
                changed.set()

        # Subscribe first, then look at the last stored message: whichever way the end
        # arrives, it is seen, and only one message is read (not the whole history).
        sub = await self.broker.subscribe(self.names.events(run_id), cb=on_event)
        await self.broker.flush()  # the server has our SUB before we look: nothing slips by
        # An end published just before the SUB is never heard, and may be stored only after
        # the first look: look again shortly (2, 4, 8 ... 512 ms) before the 5 s cadence.
        hinted = 1
        archive_looked = False
        try:
            while True:
                last = await self.broker.direct_get_last(
                    self.names.events_stream, self.names.events(run_id)
                )
                event = terminal_in(last.data) if last is not None else None
                if last is None and not archive_looked:
                    archive_looked = True  # an archived run ended long ago: its end is there
                    event = await self._archived_end(run_id)
                if event is not None:
                    return event
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"run {run_id} did not finish within {timeout}s")
                # Re-read now and then too: a core subscription misses what is published
                # while the connection is down.
                wait = 5.0 if remaining is None else min(remaining, 5.0)
                if hinted:
                    # The live message can overtake the stored copy's visibility to a direct
                    # get by a moment (on a cluster, a replica that has not applied it yet
                    # may answer): look again shortly (2, 4, 8 ... 512 ms), not in 5 s.
                    wait = min(wait, 0.001 * 2**hinted)
                    hinted = hinted + 1 if hinted < 9 else 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
                if changed.is_set():
                    changed.clear()
                    hinted = 1
        finally:
            await sub.unsubscribe()

    async def _archived_end(self, run_id: str) -> RunEvent | None:
        """The terminal event of an archived run (``None``: the run is not archived)."""
        archived = await read_archived(self.archive, run_id)
        ends = [e for d in archived[-1:] for e in d.events if isinstance(e, _TERMINAL)]
        return ends[-1] if ends else None


_TERMINAL = (RunCompleted, RunFailed, RunCancelled)


def schedule_spec(
    name: str,
    *,
    agent: str,
    every: str | int | timedelta | None = None,
    cron: str | None = None,
    input: Any = None,
    timezone: str = "UTC",
    overlap: Overlap = "skip",
    catch_up: CatchUp = "latest",
    jitter: float = 0.0,
    budget: Budget | None = None,
) -> ScheduleSpec:
    """The spec ``Client.add_schedule`` sends, checked here first (no connection needed).

    Raises:
        InvalidName: the schedule or agent name is not one.
        ScheduleError: the expression, interval, zone or jitter cannot be used.
    """
    validate_schedule_name(name)
    validate_token(agent, "agent name")
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
        if seconds != int(seconds):
            raise ScheduleError("every must be whole seconds")
        every = int(seconds)
    interval = parse_duration(every) if isinstance(every, str) else every
    limits = None if budget is None or budget.empty else BudgetBody(**_limits(budget))
    spec = ScheduleSpec(
        agent=agent,
        cron=cron,
        every=interval,
        input=to_raw(input),
        timezone=timezone,
        overlap=overlap,
        catch_up=catch_up,
        jitter=float(jitter),
        budget=limits,
    )
    check_spec(spec, time.time())
    return spec


def _schedule_answer(data: bytes, name: str) -> ScheduleAnswer:
    """The intake's answer to a schedule request, or the error it answered with, raised."""
    answer = decode_schedule_answer(data)
    if isinstance(answer, IntakeError):
        if answer.error.code == "unknown_agent":
            raise UnknownAgent(answer.error.message)
        raise TriggerRejected(answer.error.code, answer.error.message)
    return answer


def _values(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _outcome(run_id: str, event: RunEvent, tp: Any) -> Any:
    if isinstance(event, RunCompleted):
        return from_raw(event.output, tp)
    if isinstance(event, RunFailed):
        raise RunFailedError(run_id, event.error)
    assert isinstance(event, RunCancelled)
    raise RunCancelledError(f"run {run_id} was cancelled: {event.reason}", run_id=run_id)


_SIGNAL_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
"""A caller's signal id: it travels in a header and is recorded in the history."""


def _new_run_id() -> str:
    return uuid.uuid4().hex


def _limits(budget: Budget) -> dict[str, Any]:
    return {k: v for k, v in msgspec.structs.asdict(budget).items() if v is not None}
