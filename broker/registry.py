"""The agent registry: which agent names this deployment knows.

A worker records every agent it serves before it takes work. The intake rejects a trigger for
a name nobody ever registered as ``unknown_agent``; a trigger for a known agent that this worker
does not serve is left for a worker that does. Registrations are kept (one message per agent),
so a trigger published while every worker is down is still accepted later.
"""

from __future__ import annotations

import re
import time

import msgspec

from sojourn.schemas.codec import encode

from .connection import Broker
from .names import TOKEN_PATTERN, Names

__all__ = ["AgentRecord", "AgentRegistry"]

_AGENT = re.compile(TOKEN_PATTERN)


class AgentRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    input_schema: dict[str, object] = {}
    code_version: str | None = None
    registered_at: float = 0.0


class AgentRegistry:
    def __init__(self, broker: Broker, names: Names) -> None:
        self.broker = broker
        self.names = names
        self._known: set[str] = set()

    async def register(self, record: AgentRecord) -> None:
        rec = msgspec.structs.replace(record, registered_at=time.time())
        await self.broker.publish(self.names.agent(record.name), encode(rec))
        self._known.add(record.name)

    async def is_known(self, name: str) -> bool:
        if name in self._known:
            return True
        m = await self.broker.direct_get_last(self.names.agents_stream, self.names.agent(name))
        if m is not None:
            self._known.add(name)
        return m is not None

    async def known(self, limit: int = 10_000) -> list[str]:
        """The names of every agent registered so far (at most ``limit``), sorted; names that
        are not valid tokens are skipped (they name nothing anyone could start)."""
        names: set[str] = set()
        seq = 1
        head = f"{self.names.prefix}.agent."
        while len(names) < limit:
            msgs, more = await self.broker.direct_get_batch(
                self.names.agents_stream, self.names.agent("*"), seq, 1000
            )
            for m in msgs:
                name = m.subject[len(head) :]
                if _AGENT.fullmatch(name):
                    names.add(name)
            if not msgs or more <= 0:
                break
            seq = msgs[-1].seq + 1
        self._known |= names
        return sorted(names)[:limit]
