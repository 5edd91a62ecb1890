"""Schedules from the client: ``add_schedule`` (with its spec checked here first,
``schedule_spec``), reading them, and pausing, resuming, triggering and deleting them.

A schedule is kept by the broker (its record, and its pending fire as a message schedule): no
process needs to be up for a fire to happen on time. Requests that change one go to the intake
(``<prefix>.as.<sender>.schedule.<name>``), which answers once a worker serving the agent has
done it; reads go to the broker directly.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any, Required, TypedDict, Unpack

from sojourn.broker import headers as h
from sojourn.broker.schedules import ScheduleStore
from sojourn.schemas.codec import decode_schedule_answer, encode, to_raw
from sojourn.schemas.errors import PayloadTooLarge
from sojourn.schemas.events import Budget
from sojourn.schemas.names import validate_schedule_name, validate_token
from sojourn.schemas.schedules import (
    CatchUp,
    Overlap,
    ScheduleAnswer,
    ScheduleRecord,
    ScheduleRequest,
    ScheduleSpec,
)
from sojourn.schemas.wire import IntakeError

from ..core.cron import ScheduleError, parse_duration
from ..core.schedules import check_spec
from .base import ClientBase, budget_body, refuse_unknown, rejected

__all__ = ["ScheduleOptions", "Schedules", "schedule_spec"]


class ScheduleOptions(TypedDict, total=False):
    """What a schedule does, as ``Client.add_schedule`` and ``schedule_spec`` take it (keyword
    arguments): ``agent``, and exactly one of ``every`` and ``cron``; the others have defaults.

    Attributes:
        agent: the agent each fire starts a run of (required).
        every: ``"10s"``, ``"1h30m"``, seconds or a ``timedelta``: whole seconds,
            epoch-anchored.
        cron: 5 or 6 fields, matched against the wall clock of ``timezone``.
        input: each run's input (JSON-encodable; default ``None``).
        timezone: an IANA zone name (default ``"UTC"``).
        overlap: what a fire does while the previous run is live (default ``"skip"``).
        catch_up: which missed fire times are made up for (default ``"latest"``).
        jitter: each fire happens up to this many seconds late (default 0).
        budget: limits for each run the schedule starts (default: the agent's).
    """

    agent: Required[str]
    every: str | int | timedelta | None
    cron: str | None
    input: Any
    timezone: str
    overlap: Overlap
    catch_up: CatchUp
    jitter: float
    budget: Budget | None


def schedule_spec(name: str, **options: Unpack[ScheduleOptions]) -> ScheduleSpec:
    """The spec ``Client.add_schedule`` sends, checked here first (no connection needed).

    Raises:
        TypeError: ``options`` name something ``ScheduleOptions`` does not, or no ``agent``.
        InvalidName: the schedule or agent name is not one.
        ScheduleError: the expression, interval, zone or jitter cannot be used.
    """
    refuse_unknown(options, ScheduleOptions, "schedule_spec")
    if "agent" not in options:
        raise TypeError("schedule_spec() missing 1 required keyword-only argument: 'agent'")
    validate_schedule_name(name)
    agent = validate_token(options["agent"], "agent name")
    every = options.get("every")
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
        if seconds != int(seconds):
            raise ScheduleError("every must be whole seconds")
        every = int(seconds)
    spec = ScheduleSpec(
        agent=agent,
        cron=options.get("cron"),
        every=parse_duration(every) if isinstance(every, str) else every,
        input=to_raw(options.get("input")),
        timezone=options.get("timezone", "UTC"),
        overlap=options.get("overlap", "skip"),
        catch_up=options.get("catch_up", "latest"),
        jitter=float(options.get("jitter", 0.0)),
        budget=budget_body(options.get("budget")),
    )
    check_spec(spec, time.time())
    return spec


class Schedules(ClientBase):
    """``Client``'s schedules: ``add_schedule``, ``schedules``, ``schedule``,
    ``pause_schedule``, ``resume_schedule``, ``trigger_schedule``, ``delete_schedule``."""

    async def add_schedule(
        self,
        name: str,
        *,
        replace: bool = False,
        timeout: float = 10.0,
        by: str | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> ScheduleRecord:
        """Create schedule ``name``: a run of ``agent`` with ``input`` at every fire time,
        kept by the broker (no process needs to be up for a fire to happen on time; one is
        needed to run it). ``options`` are the keyword arguments of ``ScheduleOptions``:
        ``agent``, and exactly one of ``every`` (``"10s"``, ``"1h30m"``, seconds, a
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
        spec = schedule_spec(name, **options)
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


def _schedule_answer(data: bytes, name: str) -> ScheduleAnswer:
    """The intake's answer to a schedule request, or the error it answered with, raised."""
    answer = decode_schedule_answer(data)
    if isinstance(answer, IntakeError):
        raise rejected(answer)
    return answer
