"""The operator's controls over HTTP: resume a suspended run, raise its budget, terminate it, pause
or unpause it or every run of an agent, pause or resume a schedule. Each needs a token with the
admin role (the ``operate`` action), as the same controls need the admin role over NATS, and is
recorded as sent by the caller's name. A mixin of the gateway's handler class (``_app.py``), which
wraps each in its error mapping.

Under broker authentication the control subjects are sent by the gateway's own NATS user,
which then must be allowed them (an ``admin`` user; a ``client`` user's ``speaks_for`` never
covers control subjects): docs/gateway.md, "Operator controls".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from sojourn.schemas.codec import from_raw
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.events import Budget, RunEvent
from sojourn.schemas.gateway import GatewayAction
from sojourn.schemas.lifecycle import end_status
from sojourn.schemas.names import validate_schedule_name, validate_token

from ..client.base import TriggerRejected
from ..client.client import Client
from ..core.cron import ScheduleError
from ._auth import Caller
from ._http import HttpProblem, json_response, read_body, require_json

__all__ = ["ControlAnswer", "Controls"]


class ControlAnswer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``POST /v1/runs/{id}/{resume,budget,terminate}``: the request is stored for the run (the
    intake records it; a resume of a run that is not suspended changes nothing)."""

    run_id: str
    requested: str


class _Note(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    note: str = ""
    reason: str = ""


class _BudgetRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    usd: float | None = None
    tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    steps: int | None = None
    tool_calls: int | None = None
    polls: int | None = None
    wall_seconds: float | None = None


_TEXT_MAX = 1024


class Controls:
    """The handlers; ``_app._Gateway`` provides the rest."""

    if TYPE_CHECKING:
        client: Client
        max_body: int

        def _authorize(self, request: Request, action: GatewayAction) -> Caller: ...

        @staticmethod
        def _run_id(request: Request) -> str: ...

        async def _exists(self, run_id: str) -> list[RunEvent]: ...

    async def _body(self, request: Request, run_id: str) -> _Note:
        value = require_json(request, await read_body(request, self.max_body))
        if value is None:
            return _Note()
        try:
            note: _Note = from_raw(value, _Note)
        except msgspec.ValidationError as e:
            raise HttpProblem("invalid_trigger", f"body: {e}", run_id=run_id) from None
        if len(note.note) > _TEXT_MAX or len(note.reason) > _TEXT_MAX:
            raise HttpProblem("invalid_trigger", f"at most {_TEXT_MAX} characters", run_id=run_id)
        return note

    async def _live(self, run_id: str) -> None:
        last = await self._exists(run_id)
        ended = next((s for e in last if (s := end_status(e)) is not None), None)
        if ended is not None:
            raise HttpProblem("run_ended", f"run '{run_id}' has ended ({ended})", run_id=run_id)

    async def resume(self, request: Request) -> Response:
        caller = self._authorize(request, "operate")
        run_id = self._run_id(request)
        note = await self._body(request, run_id)
        await self._live(run_id)
        await self.client.resume(run_id, note.note, by=caller.name)
        return json_response(ControlAnswer(run_id=run_id, requested="resume"), 202)

    async def terminate(self, request: Request) -> Response:
        caller = self._authorize(request, "operate")
        run_id = self._run_id(request)
        note = await self._body(request, run_id)
        await self._live(run_id)
        try:
            await self.client.cancel(run_id, note.reason, by=caller.name, terminate=True)
        except TriggerRejected as e:
            raise HttpProblem(e.code, e.message, run_id=run_id) from None
        return json_response(ControlAnswer(run_id=run_id, requested="terminate"), 202)

    async def budget(self, request: Request) -> Response:
        """The limits given replace the run's (the others stay); a run suspended on a limit
        it used up is resumed."""
        caller = self._authorize(request, "operate")
        run_id = self._run_id(request)
        value = require_json(request, await read_body(request, self.max_body))
        try:
            asked: _BudgetRequest = from_raw(value if value is not None else b"{}", _BudgetRequest)
        except msgspec.ValidationError as e:
            raise HttpProblem("invalid_trigger", f"budget: {e}", run_id=run_id) from None
        limits = msgspec.structs.asdict(asked)
        if all(v is None for v in limits.values()):
            raise HttpProblem("invalid_trigger", "a budget names at least one limit")
        for name, v in limits.items():
            if v is not None and (not math.isfinite(v) or v < 0):
                raise HttpProblem("invalid_trigger", f"budget {name}: a number >= 0")
        await self._live(run_id)
        await self.client.set_budget(run_id, Budget(**limits), by=caller.name)
        return json_response(ControlAnswer(run_id=run_id, requested="budget"), 202)

    async def pause(self, request: Request) -> Response:
        """``POST /v1/runs/{id}/{pause,unpause}`` (``202``: stored for the run, like a
        signal) and ``POST /v1/agents/{agent}/{pause,unpause}`` (the agent's hold once
        recorded; an unpause once its held runs are resumed)."""
        caller = self._authorize(request, "operate")
        verb = str(request.path_params["verb"])
        if verb not in ("pause", "unpause"):
            raise HttpProblem("not_found", f"no such operation: {verb}")
        if "agent" in request.path_params:
            agent = str(request.path_params["agent"])
            try:
                validate_token(agent, "agent name")
            except InvalidName as e:
                raise HttpProblem("invalid_trigger", e.message) from None
            note = await self._body(request, "")
            try:
                if verb == "pause":
                    hold = await self.client.pause_agent(agent, note.reason, by=caller.name)
                else:
                    hold = await self.client.unpause_agent(agent, by=caller.name)
            except TriggerRejected as e:
                raise HttpProblem(e.code, e.message) from None
            except TimeoutError as e:  # no worker up: the request stays queued
                raise HttpProblem("unavailable", str(e)) from None
            return json_response(hold)
        run_id = self._run_id(request)
        note = await self._body(request, run_id)
        await self._live(run_id)
        if verb == "pause":
            await self.client.pause(run_id, note.reason, by=caller.name)
        else:
            await self.client.unpause(run_id, note.note, by=caller.name)
        return json_response(ControlAnswer(run_id=run_id, requested=verb), 202)

    async def schedule(self, request: Request) -> Response:
        """``POST /v1/schedules/{name}/{pause,resume}``: the schedule's record after it."""
        caller = self._authorize(request, "operate")
        name = str(request.path_params["name"])
        verb = str(request.path_params["verb"])
        try:
            validate_schedule_name(name)
        except InvalidName as e:
            raise HttpProblem("invalid_schedule", e.message) from None
        if verb not in ("pause", "resume"):
            raise HttpProblem("not_found", "a schedule is paused or resumed")
        try:
            if verb == "pause":
                record = await self.client.pause_schedule(name, by=caller.name)
            else:
                record = await self.client.resume_schedule(name, by=caller.name)
        except TriggerRejected as e:
            raise HttpProblem(e.code, e.message) from None
        except ScheduleError as e:
            raise HttpProblem("invalid_schedule", str(e)) from None
        return json_response(record)
