"""The agent registry: which agent names this deployment knows.

A worker records every agent it serves before it takes work. The intake rejects a trigger for
a name nobody ever registered as ``unknown_agent``; a trigger for a known agent that this worker
does not serve is left for a worker that does. Registrations are kept (one message per agent),
so a trigger published while every worker is down is still accepted later.
"""

from __future__ import annotations

import time

import msgspec

from sojourn.schemas.codec import encode

from .connection import Broker
from .names import Names

__all__ = ["AgentRecord", "AgentRegistry"]


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
