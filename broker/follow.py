"""Following a stream from a sequence on, by batched direct gets.

Projections (the watchdog's run model) read every message of a stream in order and then keep
up with new ones. A consumer would push them, but it is state on the server that must be
recreated after a restart or a gap; a follower that asks "the next N messages matching this
filter after sequence S" holds no server state at all, survives broker restarts without any
recovery code, and knows exactly how far behind it is (the answer says how many are pending).
"""

from __future__ import annotations

from .connection import Broker
from .delivery import StoredMessage

__all__ = ["StreamFollower", "read_all"]


class StreamFollower:
    """Reads ``subject_filter`` of ``stream`` in order, ``page`` messages per request.

    Attributes:
        last_seq: the stream sequence of the last message returned (0: none yet).
        pending: how many matching messages the last answer said were still to come.
        last_time: the stored time (unix seconds) of the last message returned.
    """

    def __init__(
        self,
        broker: Broker,
        stream: str,
        subject_filter: str,
        *,
        from_seq: int = 1,
        page: int = 512,
    ) -> None:
        self.broker = broker
        self.stream = stream
        self.subject_filter = subject_filter
        self.last_seq = from_seq - 1
        self.page = page
        self.pending = 0
        self.last_time = 0.0

    async def next_page(self) -> list[StoredMessage]:
        """The next page of messages (empty when caught up)."""
        msgs, pending = await self.broker.direct_get_batch(
            self.stream, self.subject_filter, self.last_seq + 1, self.page
        )
        if msgs:
            last = msgs[-1]
            self.last_seq = last.seq
            self.last_time = last.time
        self.pending = pending if msgs else 0
        return msgs


async def read_all(
    broker: Broker, stream: str, subject_filter: str, *, page: int = 1000
) -> list[StoredMessage]:
    """Every message of ``stream`` matching ``subject_filter`` now, in order (for small
    streams of one message per subject, such as the workers' heartbeats)."""
    follower = StreamFollower(broker, stream, subject_filter, page=page)
    out: list[StoredMessage] = []
    while True:
        msgs = await follower.next_page()
        out.extend(msgs)
        if not msgs or follower.pending <= 0:
            return out
