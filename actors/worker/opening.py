"""A new run opened with its first decision: one append, not two, before its first step.

When this worker's intake creates a run it will execute at once, it does not append the run's
``RunStarted`` alone. The activation starts from that event held in memory, runs the agent's
code to its first journaled call, and its first append stores ``RunStarted`` and that
decision together: create-only (expected last sequence 0) under the start's Msg-Id, exactly as
the intake would have stored ``RunStarted`` alone. The intake answers the sender once that
append is settled (``Opening.settled``):

- ``stored``: the run exists and executes here; the answer is ``created``.
- ``earlier``: the Msg-Id was stored before (a redelivery of this trigger created the run):
  nothing of this activation was stored; it stops, and the intake wakes the run.
- ``exists``: another start created the run first: it stops, and the intake answers as for any
  start of an existing run.
- ``abandoned``: the activation ended before its first append (it failed, and settled the
  trigger itself): the intake answers nothing; the trigger's redelivery creates the run.

A cancel stored in the inbox behind the start (``look``) is recorded right after
``RunStarted``, which is then stored alone, so the run starts no step. Nothing here does I/O:
the appender (``worker/appends.py``) stores the opening, the intake waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Literal

from sojourn.broker.eventstore import Decision
from sojourn.schemas.events import CancelRequested, RunStarted

__all__ = ["OpenedAs", "Opening", "QueuedCancel"]

OpenedAs = Literal["stored", "earlier", "exists", "abandoned"]

QueuedCancel = tuple[int, CancelRequested]
"""A cancel stored in the inbox behind the start: its inbox sequence and the event it records."""


class Opening:
    """A run created in memory by this worker's intake, stored with its first decision."""

    def __init__(
        self,
        started: RunStarted,
        msg_id: str,
        writer: str,
        look: Awaitable[QueuedCancel | None] | None,
    ) -> None:
        """``msg_id``: the start's (the same on every delivery of the trigger); ``writer``: the
        intake's; ``look``: the look for a cancel queued behind the start, if one is needed."""
        self.started = started
        self.msg_id = msg_id
        self.writer = writer
        self.look = look
        self.settled: asyncio.Future[OpenedAs] = asyncio.get_running_loop().create_future()
        """How the opening append ended (or the error it ended with)."""
        self.sent = asyncio.Event()
        """Set once the opening append is handed to the broker (the intake's loop fetches
        again then: its next pull request goes out with the append, not before it). The
        intake may give it its own event (``Intake.handle``'s ``progress``)."""

    @property
    def run_id(self) -> str:
        return self.started.run_id

    def history(self) -> list[Decision]:
        """The run's history as the activation starts from it: ``RunStarted``, not stored yet
        (sequence 0)."""
        return [Decision(seq=0, events=(self.started,), writer=self.writer, msg_id=self.msg_id)]

    def settle(self, how: OpenedAs) -> None:
        if not self.settled.done():
            self.settled.set_result(how)

    def fail(self, error: BaseException) -> None:
        """The opening append failed (the broker stayed away): the intake hands the trigger
        back, so that its redelivery creates the run."""
        if not self.settled.done():
            self.settled.set_exception(error)
