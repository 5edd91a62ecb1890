"""Forking a run (``Client.fork``, decision 0041): a new run whose history up to a position is
an old run's, re-executed from there with the code deployed now.

A fork is asked for like a start, on the old run's agent's start subject, with
``StartTrigger.fork``: the same permission as a start, and the same idempotency (the same fork
run id asked for twice is one run). The worker's intake copies the history; the client only
checks the request against what it can read first, so a fork that cannot be made is refused
at once, even while no worker is up.
"""

from __future__ import annotations

import uuid
from typing import Any

from sojourn.broker import headers as h
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.errors import InvalidName, PayloadTooLarge, RunNotFound
from sojourn.schemas.events import RunStarted
from sojourn.schemas.names import (
    RESERVED_SIGNAL_PREFIX,
    reserved_run_id,
    validate_signal_name,
    validate_token,
)
from sojourn.schemas.wire import ForkBody, ForkSignal, IntakeError, StartTrigger

from ..core.fork import ForkRefused, plan_fork
from ..telemetry import outgoing
from .base import ClientBase, TriggerRejected, rejected
from .runs import StartReceipt

__all__ = ["KEEP_INPUT", "Forks", "fork_run_id"]


class _KeepInput:
    def __repr__(self) -> str:
        return "KEEP_INPUT"


KEEP_INPUT: Any = _KeepInput()
"""``Client.fork``'s default input: the fork keeps the old run's."""


def fork_run_id(run_id: str) -> str:
    """A fresh id for a fork of ``run_id``: ``<run_id>-fork-<8 hex digits>`` (a plain fresh
    id when that would be too long)."""
    rid = f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
    return rid if len(rid) <= 128 and reserved_run_id(rid) is None else uuid.uuid4().hex


class Forks(ClientBase):
    """``Client.fork`` and ``Client.trigger_fork``."""

    async def fork(
        self,
        run_id: str,
        *,
        from_step: int | None = None,
        from_failure: bool = False,
        input: Any = KEEP_INPUT,
        signal: tuple[str, Any] | None = None,
        fork_id: str | None = None,
        sender: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> str:
        """Fork ``run_id`` and return the fork's run id.

        The fork is a new run of the same agent, linked to the old one
        (``RunState.forked_from``): its history holds the old run's decisions of every position
        before ``from_step`` (their recorded results are reused, nothing before is executed
        again), and it executes from ``from_step`` on with the code deployed now. With
        ``from_failure=True`` it starts at the position the run failed at. ``input``: the
        fork's input (default: the old run's). ``signal``: ``(name, payload)``, a signal the
        fork finds buffered when it starts. The old run is only read, never changed: a live
        run may be forked and goes on. ``fork_id``: the fork's run id (default: a fresh one);
        the same id asked for twice is one fork, forever. With ``wait=True`` this waits up to
        ``timeout`` for the intake's answer.

        Raises:
            RunNotFound: ``run_id`` has no history.
            TriggerRejected: the fork cannot be made (``invalid_fork``: a position beyond the
                history, a run that did not fail, a position where an earlier one is still
                open...; ``invalid_input``...), said here or by the intake.
            InvalidName: a bad run id, fork id or signal name.
            PayloadTooLarge: the request is larger than ``settings.max_payload``.
        """
        receipt = await self.trigger_fork(
            run_id,
            from_step=from_step,
            from_failure=from_failure,
            input=input,
            signal=signal,
            fork_id=fork_id,
            sender=sender,
            wait=wait,
            timeout=timeout,
        )
        return receipt.run_id

    async def trigger_fork(
        self,
        run_id: str,
        *,
        from_step: int | None = None,
        from_failure: bool = False,
        input: Any = KEEP_INPUT,
        signal: tuple[str, Any] | None = None,
        fork_id: str | None = None,
        sender: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> StartReceipt:
        """Like ``fork`` but returns the intake's full answer (see ``StartReceipt``)."""
        validate_token(run_id, "run_id")
        if (from_step is None) == (not from_failure):
            raise ValueError("fork from a step (from_step=N) or from_failure=True, not both")
        if from_step is not None and (isinstance(from_step, bool) or from_step < 0):
            raise ValueError(f"from_step is a position (0 or more), not {from_step!r}")
        fid = validate_token(fork_id, "fork id") if fork_id is not None else fork_run_id(run_id)
        why = reserved_run_id(fid)
        if why is not None:
            raise InvalidName(f"run id {fid!r} {why}")
        extra = None
        if signal is not None:
            name = validate_signal_name(signal[0])
            if name.startswith(RESERVED_SIGNAL_PREFIX):
                raise InvalidName(
                    f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved"
                )
            extra = ForkSignal(name=name, payload=to_raw(signal[1]))
        who = self._sender(sender)
        await self._ensure()
        history = await self.store.load(run_id)
        try:
            plan = plan_fork(
                run_id,
                [e for d in history for e in d.events],
                from_step=from_step,
                from_failure=from_failure,
            )
        except ForkRefused as r:
            if r.code == "unknown_run":
                raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id) from None
            raise TriggerRejected(r.code, r.message, run_id=run_id) from None
        started: RunStarted = plan.started
        new_input = input is not KEEP_INPUT
        body = encode(
            StartTrigger(
                input=to_raw(input if new_input else None),
                run_id=fid,
                fork=ForkBody(
                    run_id=run_id,
                    from_step=from_step,
                    from_failure=from_failure,
                    new_input=new_input,
                    signal=extra,
                ),
            )
        )
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"the fork request is {len(body)} bytes; the limit is "
                f"{self.settings.max_payload} (Settings.max_payload)",
                run_id=fid,
            )
        headers = {h.MSG_ID: f"start:{started.agent}:{fid}", **outgoing()}
        subject = self.names.start(started.agent, who, fid)
        if not wait:
            await self._publish(subject, body, headers)
            return StartReceipt(run_id=fid, created=None, queued=True)
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if reply == "duplicate":
            exists = await self.store.last_seq(fid) > 0
            return StartReceipt(run_id=fid, created=False if exists else None, queued=not exists)
        if reply is None:
            return StartReceipt(run_id=fid, created=None, queued=True)
        if isinstance(reply, IntakeError):
            raise rejected(reply, fid)
        return StartReceipt(run_id=reply.run_id, created=reply.created, queued=False)
