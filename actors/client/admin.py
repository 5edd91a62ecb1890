"""An operator's controls of runs: ``resume`` a suspended run, change its budget
(``set_budget``), settle a step in doubt (``decide``).

Each is one durable message to the intake, like a signal; where the deployment authenticates,
each needs the admin role, and the operator's name is recorded with it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sojourn.broker import headers as h
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.events import Budget
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import InDoubtDecision, PauseBody, ResumeBody

from .base import budget_body
from .reading import RunReading

__all__ = ["AdminControls"]


class AdminControls(RunReading):
    """``Client``'s operator controls: ``resume``, ``set_budget``, ``decide`` (a decision
    reads the run's state first, hence the reads under it)."""

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

    async def pause(self, run_id: str, reason: str = "", *, by: str | None = None) -> None:
        """Hold a run: it goes on to its next step (a step in flight finishes and is recorded;
        a wait keeps its timer, which fires into it as usual) and there suspends itself
        (reason ``manual``) until ``unpause``. A run paused already, or suspended, is left as
        it is. Durable, like a signal; needs the admin role where the deployment
        authenticates; ``by`` (a name token, default the connection's user) is recorded."""
        validate_token(run_id, "run_id")
        await self._ensure()
        await self._publish(
            self.names.pause(run_id, self._operator(by)),
            encode(PauseBody(reason=reason)),
            {h.MSG_ID: f"pause:{run_id}:{uuid.uuid4().hex}"},
        )

    async def unpause(self, run_id: str, note: str = "", *, by: str | None = None) -> None:
        """Lift a pause: a run it suspended replays and goes on from its next step; one it had
        not reached yet goes on without stopping. The same message as ``resume``."""
        await self.resume(run_id, note, by=by)

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
            encode(budget_body(budget)),
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
