"""Holding every run of an agent: ``pause_agent``, ``unpause_agent`` and ``agent_holds``.

A pause of an agent is a request to a worker's intake (``<prefix>.as.<sender>.hold.<agent>``,
the admin role where the deployment authenticates), answered once the hold is recorded; every
worker then suspends the agent's runs before their next step, new runs before their first.
An unpause is answered once every run the hold suspended is resumed (decision 0039).
"""

from __future__ import annotations

import uuid

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.follow import read_all
from sojourn.schemas.codec import decode_hold, decode_hold_answer, encode
from sojourn.schemas.holds import HOLD_REASON_MAX, AgentHold, HoldAction, HoldAnswer, HoldRequest
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import IntakeError

from .base import ClientBase, rejected

__all__ = ["AgentHoldControls"]


class AgentHoldControls(ClientBase):
    """``Client``'s holds of whole agents."""

    async def pause_agent(
        self, agent: str, reason: str = "", *, timeout: float = 10.0, by: str | None = None
    ) -> HoldAnswer:
        """Hold every run of ``agent``: each live run goes on to its next step (a step in
        flight finishes and is recorded; a wait keeps its timer, which fires into it as
        usual) and there suspends itself (reason ``manual``); a new run suspends before its
        first step. Until ``unpause_agent``. ``by`` (a name token, default the connection's
        user) is recorded; needs the admin role where the deployment authenticates.

        Raises:
            ValueError: ``reason`` is longer than ``HOLD_REASON_MAX``.
            TimeoutError: no worker answered within ``timeout`` (the request stays queued).
        """
        return await self._hold_request(agent, "pause", reason, timeout, by)

    async def unpause_agent(
        self, agent: str, *, timeout: float = 30.0, by: str | None = None
    ) -> HoldAnswer:
        """Lift ``agent``'s hold: every run it suspended is resumed (``resumed`` counts them)
        and goes on from its next step; runs paused one by one (``pause``) stay paused. A run
        suspending itself for the hold at this very moment is resumed by its own worker, which
        finds the hold lifted, and is not counted."""
        return await self._hold_request(agent, "unpause", "", timeout, by)

    async def agent_holds(self) -> list[AgentHold]:
        """The agents held now, by name."""
        await self._ensure()
        stored = await read_all(self.broker, self.names.agents_stream, self.names.holds_all)
        holds: list[AgentHold] = []
        for msg in stored:
            try:
                hold = decode_hold(msg.data)
            except msgspec.MsgspecError:
                continue
            if hold.paused:
                holds.append(hold)
        return sorted(holds, key=lambda x: x.agent)

    async def _hold_request(
        self, agent: str, action: HoldAction, reason: str, timeout: float, by: str | None
    ) -> HoldAnswer:
        validate_token(agent, "agent name")
        if len(reason) > HOLD_REASON_MAX:
            raise ValueError(f"a hold's reason is at most {HOLD_REASON_MAX} characters")
        await self._ensure()
        operator = self._operator(by)
        inbox = self.broker.new_inbox(operator if self.identity is not None else None)
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            headers = {h.REPLY_TO: inbox, h.MSG_ID: f"hold:{agent}:{uuid.uuid4().hex}"}
            body = encode(HoldRequest(action=action, reason=reason))
            await self._publish(self.names.hold_request(agent, operator), body, headers)
            try:
                msg = await sub.next_msg(timeout=timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no worker answered the {action} of agent {agent!r} within {timeout:g} s "
                    "(it stays queued: is a worker up?)"
                ) from None
        finally:
            await sub.unsubscribe()
        answer = decode_hold_answer(msg.data)
        if isinstance(answer, IntakeError):
            raise rejected(answer)
        return answer
