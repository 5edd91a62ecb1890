"""``client.update``: a request to a live run that wants an answer (decision 0042).

The update travels like a signal: published to the inbox on
``<prefix>[.as.<sender>].update.<run_id>.<name>`` with its id, recorded by the intake once per
id (``UpdateRequested``), decided by the run's code at its next wait (``UpdateCompleted`` or
``UpdateRejected``, stored before anything else happens). The answer is that stored event: the
caller reads it back from the run's history, so a caller that retries with the same id (after
a timeout, a crash of its own, or of the worker between the apply and anything else) gets the
same answer, and the run applies the update once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.schemas.codec import encode, from_raw, to_raw
from sojourn.schemas.errors import InvalidName, PayloadTooLarge
from sojourn.schemas.names import validate_signal_name, validate_token
from sojourn.schemas.updates import (
    UPDATE_ID_MAX,
    UpdateAnswer,
    UpdateBody,
    UpdateRejectedError,
    valid_update_id,
)
from sojourn.schemas.wire import IntakeError

from ..core.state import RunState, UpdateRecord
from ..history.snapshots import current as current_snapshot
from ..telemetry import outgoing
from .base import ClientBase

__all__ = ["Updates", "answer_of"]

_POLL_FIRST = 0.02
_POLL_MAX = 0.5


def answer_of(run_id: str, record: UpdateRecord | None, state: RunState) -> UpdateAnswer | None:
    """An update's outcome as the run's history tells it (``None``: not decided yet, and the
    run has not ended)."""
    if record is not None and record.outcome == "completed":
        if record.error is not None:
            message = f"{record.error.type}: {record.error.message}"
            return UpdateAnswer(
                run_id=run_id,
                update_id=record.update_id,
                name=record.name,
                ok=False,
                code="failed",
                message=message,
            )
        answer = from_raw(record.answer, Any) if record.answer is not None else None
        return UpdateAnswer(
            run_id=run_id, update_id=record.update_id, name=record.name, ok=True, answer=answer
        )
    if record is not None and record.outcome == "rejected":
        return UpdateAnswer(
            run_id=run_id,
            update_id=record.update_id,
            name=record.name,
            ok=False,
            code="unknown_update" if record.code == "unknown_update" else "rejected",
            message=record.message,
        )
    if state.terminal:
        return UpdateAnswer(
            run_id=run_id,
            update_id=record.update_id if record is not None else "",
            name=record.name if record is not None else "",
            ok=False,
            code="run_ended",
            message=f"run '{run_id}' ended ({state.status}) before it decided the update",
        )
    return None


class Updates(ClientBase):
    """``Client``'s updates."""

    async def update(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        update_id: str | None = None,
        timeout: float = 30.0,
        sender: str | None = None,
    ) -> Any:
        """Send the update ``name`` to a run and return its handler's answer
        (``ctx.on_update``).

        ``update_id`` names the update (default: a fresh one): sent again with the same id,
        it is applied once and answered the same, whatever happened in between. The run
        decides it at its next wait (a run busy in a step, when the step is done and its
        code waits).

        Raises:
            UpdateRejectedError: with ``code`` ``rejected`` (its validator refused it:
                nothing changed), ``failed`` (its handler raised), ``unknown_update``,
                ``run_ended``, ``unknown_run``, ``refused`` (the intake refused the message:
                ``intake_code``) or ``timeout`` (no answer within ``timeout``; it may still
                be applied: ask again with the same id).
            InvalidName: a bad run id, update name, update id or sender.
            PayloadTooLarge: the encoded update exceeds ``settings.max_payload``.
        """
        got = await self.update_answer(
            run_id, name, payload, update_id=update_id, timeout=timeout, sender=sender
        )
        if not got.ok:
            assert got.code is not None
            raise UpdateRejectedError(
                got.code, got.message, run_id=got.run_id, update_id=got.update_id
            )
        return got.answer

    async def update_answer(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        update_id: str | None = None,
        timeout: float = 30.0,
        sender: str | None = None,
    ) -> UpdateAnswer:
        """``update``'s outcome as data (what the gateway answers): an answer or a rejection
        from the run's history. Raises ``UpdateRejectedError`` only for what the run never
        saw: ``unknown_run``, ``refused`` and ``timeout``."""
        validate_token(run_id, "run_id")
        validate_signal_name(name)
        uid = update_id if update_id is not None else uuid.uuid4().hex
        if not valid_update_id(uid):
            raise InvalidName(
                f"update id {uid[:64]!r}: 1 to {UPDATE_ID_MAX} characters of A-Z a-z 0-9 . _ : -"
            )
        who = self._sender(sender)
        body = encode(UpdateBody(update_id=uid, payload=to_raw(payload)))
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"update is {len(body)} bytes; the limit is {self.settings.max_payload}",
                run_id=run_id,
            )
        await self._ensure()
        deadline = time.monotonic() + timeout
        headers = {h.MSG_ID: f"update:{run_id}:{uid}", **outgoing()}
        subject = self.names.update(run_id, name, who)
        reply = await self._publish_answered(subject, body, headers, max(0.1, timeout), who)
        if isinstance(reply, IntakeError):
            code, message = reply.error.code, reply.error.message
            if code == "unknown_run":
                raise UpdateRejectedError("unknown_run", message, run_id=run_id, update_id=uid)
            if code == "run_ended":
                return UpdateAnswer(
                    run_id=run_id,
                    update_id=uid,
                    name=name,
                    ok=False,
                    code="run_ended",
                    message=message,
                )
            raise UpdateRejectedError(
                "refused", message, run_id=run_id, update_id=uid, intake_code=code
            )
        if reply is not None and reply != "duplicate":
            run_id = reply.run_id  # a continued chain records it in its current run
        return await self._await_answer(run_id, uid, name, deadline)

    async def _await_answer(
        self, run_id: str, update_id: str, name: str, deadline: float
    ) -> UpdateAnswer:
        """Read the run's history until it decided ``update_id`` (or ended, or the deadline
        passed). A core subscription to the run's events subject (what ``sojourn watch``
        uses) is a hint to look again at once; without it, the look comes every 20 ms to
        250 ms."""
        appended = asyncio.Event()

        async def hint(_: Delivery) -> None:
            appended.set()

        sub = await self.broker.subscribe(self.names.events(run_id), cb=hint)
        try:
            pause = _POLL_FIRST
            while True:
                appended.clear()
                snap = await current_snapshot(self.store, run_id)
                if snap is not None:
                    state = snap.state
                    record = next((u for u in state.updates if u.update_id == update_id), None)
                    got = answer_of(run_id, record, state)
                    if got is not None:
                        return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UpdateRejectedError(
                        "timeout",
                        f"no answer to update {update_id!r} ({name!r}) yet; send it again "
                        "with the same id to keep waiting",
                        run_id=run_id,
                        update_id=update_id,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(appended.wait(), min(pause, left))
                pause = min(pause * 2, _POLL_MAX)
        finally:
            await sub.unsubscribe()
