"""``POST /v1/runs/{id}/fork``: fork a run over HTTP (decision 0041). A fork is a start (a new
run of the old run's agent), so it takes the ``start`` action, as starting a run does, and is
sent as the caller's name: the history records who forked, from the bearer token, never from
the body. ``Idempotency-Key`` is the fork's run id, as for a start. A mixin of the gateway's
handler class (``_app.py``), which wraps it in its error mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from sojourn.schemas.codec import from_raw
from sojourn.schemas.errors import InvalidName, PayloadTooLarge, RunNotFound, UnknownAgent
from sojourn.schemas.gateway import GatewayAction, StartAnswer
from sojourn.schemas.names import reserved_run_id, validate_token

from ..client.base import TriggerRejected
from ..client.client import Client
from ..client.forks import KEEP_INPUT
from ._auth import Caller
from ._http import HttpProblem, json_response, read_body, require_json

__all__ = ["ForkRequest", "Forking"]


_ABSENT = msgspec.Raw(b"")
"""A member the body does not hold (``null`` is a value: an input or a payload of null)."""


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/runs/{id}/fork``: ``from_step`` (a position, as the history
    shows it) or ``from_failure``; ``input`` replaces the old run's input when given;
    ``signal`` (with ``payload``) is a signal the fork finds buffered when it starts."""

    from_step: int | None = None
    from_failure: bool = False
    input: msgspec.Raw = _ABSENT
    signal: str | None = None
    payload: msgspec.Raw = _ABSENT


class Forking:
    """The handler; ``_app._Gateway`` provides the rest."""

    if TYPE_CHECKING:
        client: Client
        max_body: int
        config: Any

        def _authorize(self, request: Request, action: GatewayAction) -> Caller: ...

        @staticmethod
        def _run_id(request: Request) -> str: ...

    async def fork(self, request: Request) -> Response:
        caller = self._authorize(request, "start")
        run_id = self._run_id(request)
        fork_id = request.headers.get("idempotency-key")
        if fork_id is not None:
            try:
                validate_token(fork_id, "Idempotency-Key (the fork's run id)")
            except InvalidName as e:
                raise HttpProblem("invalid_run_id", e.message) from None
            why = reserved_run_id(fork_id)
            if why is not None:
                raise HttpProblem("invalid_run_id", f"run id {fork_id!r} {why}")
        value = require_json(request, await read_body(request, self.max_body))
        try:
            asked: ForkRequest = from_raw(value if value is not None else b"{}", ForkRequest)
        except msgspec.ValidationError as e:
            raise HttpProblem("invalid_trigger", f"fork: {e}", run_id=run_id) from None
        if (asked.from_step is None) == (not asked.from_failure):
            raise HttpProblem(
                "invalid_fork", "a fork names from_step or from_failure: true", run_id=run_id
            )
        if asked.from_step is not None and asked.from_step < 0:
            raise HttpProblem("invalid_fork", "from_step is a position, 0 or more", run_id=run_id)
        if asked.signal is None and asked.payload:
            raise HttpProblem("invalid_trigger", "payload goes with signal", run_id=run_id)
        signal = None
        if asked.signal is not None:
            payload = from_raw(asked.payload) if asked.payload else None
            signal = (asked.signal, payload)
        new_input = from_raw(asked.input) if asked.input else KEEP_INPUT
        try:
            receipt = await self.client.trigger_fork(
                run_id,
                from_step=asked.from_step,
                from_failure=asked.from_failure,
                input=new_input,
                signal=signal,
                fork_id=fork_id,
                sender=caller.name,
                wait=True,
                timeout=self.config.start_wait,
            )
        except RunNotFound as e:
            raise HttpProblem("unknown_run", e.message, run_id=run_id) from None
        except UnknownAgent as e:
            raise HttpProblem("unknown_agent", e.message, run_id=run_id) from None
        except TriggerRejected as e:
            raise HttpProblem(e.code, e.message, run_id=e.run_id or run_id) from None
        except InvalidName as e:
            raise HttpProblem("invalid_trigger", e.message, run_id=run_id) from None
        except PayloadTooLarge as e:
            raise HttpProblem("payload_too_large", e.message, run_id=run_id) from None
        status = 202 if receipt.queued else 201 if receipt.created else 200
        answer = StartAnswer(run_id=receipt.run_id, created=receipt.created, queued=receipt.queued)
        return json_response(answer, status, {"Location": f"/v1/runs/{receipt.run_id}"})
