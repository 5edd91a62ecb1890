"""Which projector writes the views: the leader record, and what a follower keeps meanwhile.

Leadership is a record (``LeaderRecord``) on ``<prefix>.leader.projector`` taken and renewed by
compare-and-set. It also says how far the leader got: every view up to ``position`` is written,
and writes after ``horizon`` have not begun (the leader moves the horizon forward before each
batch that passes it). The others keep folding, and keep what the leader has not written yet
(``Backlog``), so they can take over at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import PublishAck
from sojourn.broker.names import Names
from sojourn.schemas.codec import encode, from_raw
from sojourn.schemas.health import LeaderRecord

from .sink import Applied
from .viewstore import EXPECT

__all__ = ["ROLE", "Backlog", "Leadership"]

log = logging.getLogger("sojourn.projector")

ROLE = "projector"
_BACKLOG_MAX = 200_000
"""Unwritten views a follower keeps for a take-over; past this it re-folds instead."""


class Leadership:
    """One projector's side of the leader record.

    Attributes:
        leading: whether this projector leads (as of its last look at the record).
        horizon: as leader, how far writes may have begun (the record's ``horizon``).
        recover_to: the horizon of the record this projector took over: decisions up to it
            may have been written in part by the previous leader.
    """

    def __init__(
        self, broker: Callable[[], Broker], names: Names, projector_id: str, ttl: float
    ) -> None:
        self._broker = broker
        self._subject = names.leader(ROLE)
        self._stream = names.health_stream
        self.projector_id = projector_id
        self.ttl = ttl
        self.leading = False
        self.horizon = 0
        self.recover_to = 0
        self._seq = 0

    async def read(self) -> tuple[int, LeaderRecord | None]:
        """The stored record's sequence (0: none) and the record (``None``: none or
        unreadable)."""
        m = await self._broker().direct_get_last(self._stream, self._subject)
        if m is None:
            return 0, None
        return m.seq, _decode_record(m.data)

    async def cas(self, expected: int, position: int, horizon: int) -> bool:
        """Write this projector's record over the one at sequence ``expected``; ``False``
        when another was written meanwhile."""
        now = time.time()
        record = LeaderRecord(
            owner=self.projector_id,
            expires_at=now + self.ttl,
            position=position,
            horizon=horizon,
            at=now,
        )
        return await self._put(record, expected)

    async def renew(self, position: int) -> bool:
        """As leader, write the record again (``position``: every view up to it is written)."""
        return await self.cas(self._seq, position, self.horizon)

    async def extend(self, position: int, horizon: int) -> bool:
        """Move the horizon before writing past it; ``False``: leadership was lost."""
        if await self.cas(self._seq, position, horizon):
            self.horizon = horizon
            return True
        log.warning("projector %s: lost the leadership", self.projector_id)
        self.leading = False
        return False

    def took(self, horizon: int) -> None:
        """This projector leads now, after a leader whose writes may have begun up to
        ``horizon``."""
        self.leading = True
        self.horizon = horizon
        self.recover_to = horizon

    async def resign(self, position: int) -> None:
        """Hand the leadership over at once: an expired record any projector may take."""
        record = LeaderRecord(
            owner=self.projector_id,
            expires_at=0.0,
            position=position,
            horizon=self.horizon,
            at=time.time(),
        )
        await self._put(record, self._seq)
        self.leading = False

    async def _put(self, record: LeaderRecord, expected: int) -> bool:
        ack = await self._broker().try_publish(
            self._subject, encode(record), {EXPECT: str(expected)}
        )
        if isinstance(ack, PublishAck):
            self._seq = ack.seq
            return True
        return False


class Backlog:
    """What a follower folded and the leader has not written yet, kept for a take-over: a
    new leader writes it at once instead of folding the events stream again."""

    def __init__(self) -> None:
        self._items: list[Applied] = []
        self._from = 0
        """Every view up to this sequence is written (by the leader, or by us)."""
        self._lost = False
        """More was unwritten than ``_BACKLOG_MAX``: a take-over folds again."""
        self._leader_position = 0

    def reset(self) -> None:
        """Empty, for a fold from its start."""
        self._items.clear()
        self._lost = False
        self._from = 0

    def keep(self, batch: Sequence[Applied]) -> None:
        """Keep what the leader has not written yet."""
        if self._lost:
            return
        self._items.extend(a for a in batch if a.seq > self._leader_position)
        if len(self._items) > _BACKLOG_MAX:
            self._items.clear()
            self._lost = True

    def follow(self, position: int) -> None:
        """The leader's record says every view up to ``position`` is written."""
        self._leader_position = max(self._leader_position, position)
        self._items = [a for a in self._items if a.seq > self._leader_position]
        self._from = self._leader_position

    def lost_lead(self, written: int, items: Sequence[Applied]) -> None:
        """The leadership was lost before ``items`` were written: what was written up to
        ``written`` is written; ``items`` are kept."""
        self._from = written
        self.keep(items)

    def take(self, position: int) -> list[Applied] | None:
        """What remains to write after ``position`` for a take-over from there, emptying the
        backlog; ``None`` when it does not cover everything from ``position`` on."""
        covered = not self._lost and self._from <= position
        items, self._items = self._items, []
        if not covered:
            return None
        return [a for a in items if a.seq > position]


def _decode_record(data: bytes) -> LeaderRecord | None:
    try:
        rec: LeaderRecord = from_raw(data, LeaderRecord)
    except msgspec.MsgspecError:
        return None
    return rec
