"""How one open wait is decided: a buffered signal, a passed deadline, an ended child, or parking.

``Machine.wait`` answers a wait history has not settled (``ctx.sleep``, ``ctx.wait_for``,
``ctx.select``, a child's end, a pause of ``ctx.poll``) with a ``WaitTurn``. A signal the wait
takes is consumed by id, once per activation; a wait is recorded (``WaitStarted``) once, then the
run parks and looks again for a signal that came in while it parked. Children are started here
too, under ids that are the same for the same parent and call (``child_run_id``). Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from sojourn.schemas.codec import to_raw
from sojourn.schemas.events import RunEvent, WaitCompleted, WaitStarted
from sojourn.schemas.vocabulary import ChildStatus

from .actions import LookupChildren, Park, WaitAction
from .journal import RecordedWait
from .state import SignalRecord

__all__ = ["WaitHost", "WaitTurn", "child_run_id"]

_NULL = to_raw(None)


def child_run_id(parent: str, position: int) -> str:
    """``<parent>-c<position>``; hashed when that would pass the 128-character id limit (deep
    nesting), so a child id is always valid and always the same for the same parent and call."""
    plain = f"{parent}-c{position}"
    if len(plain) <= 128:
        return plain
    digest = hashlib.blake2b(parent.encode(), digest_size=12).hexdigest()
    return f"{parent[:80]}-h{digest}-c{position}"


class WaitHost(Protocol):
    """What a ``WaitTurn`` asks of the run machine that made it (``Machine``): the buffered
    signals it may take, and the recording of how the wait went."""

    @property
    def consumed(self) -> set[str]:
        """Ids of the buffered signals taken by waits in this activation."""

    def find_signal(self, names: tuple[str, ...]) -> SignalRecord | None:
        """The first buffered signal named in ``names`` that no wait has taken yet."""

    def record(self, *events: RunEvent) -> None:
        """Queue ``events`` to be stored."""


@dataclass(slots=True, eq=False)
class WaitTurn:
    """How one open wait is decided: a buffered signal, a passed deadline, an ended child, or
    parking (recording the wait once, and looking again if a signal came in meanwhile)."""

    _m: WaitHost = field(repr=False)
    position: int
    key: str
    signals: tuple[str, ...]
    deadline: float | None
    children: tuple[str, ...]
    _record: bool
    """The ``WaitStarted`` is still to be recorded."""

    def next(self, now: float, *, looked: bool = False) -> RecordedWait | WaitAction | None:
        """How the wait ends now (a ``RecordedWait``, or ``None`` for a timeout), or what to
        do: look up the children (unless ``looked``), or park.

        A signal taken here also wants the wait's timer cancelled: the caller does that when
        ``deadline`` is set and the outcome is a signal.
        """
        m, p = self._m, self.position
        sig = m.find_signal(self.signals)
        if sig is not None:
            m.consumed.add(sig.signal_id)
            m.record(
                WaitCompleted(
                    position=p,
                    key=self.key,
                    outcome="signal",
                    payload=sig.payload,
                    signal=sig.name,
                    signal_id=sig.signal_id,
                    sent_by=sig.sent_by,
                    sender_verified=sig.sender_verified,
                    at=now,
                )
            )
            return RecordedWait(
                position=p,
                outcome="signal",
                payload=sig.payload,
                signal=sig.name,
                sent_by=sig.sent_by,
                sender_verified=sig.sender_verified,
            )
        if self.deadline is not None and now >= self.deadline:
            m.record(
                WaitCompleted(position=p, key=self.key, outcome="timeout", payload=_NULL, at=now)
            )
            return None
        if self.children and not looked:
            return LookupChildren(self.children)
        event = None
        if self._record:
            self._record = False
            event = WaitStarted(
                position=p,
                key=self.key,
                signals=self.signals,
                deadline=self.deadline,
                children=self.children,
                at=now,
            )
        return Park(p, self.deadline, event)

    def child_ended(
        self, outcome_raw: msgspec.Raw, status: ChildStatus, now: float
    ) -> RecordedWait:
        """A child's history says it ended (its notice never reached us): record that."""
        self._m.record(
            WaitCompleted(
                position=self.position,
                key=self.key,
                outcome="child",
                payload=outcome_raw,
                child_status=status,
                at=now,
            )
        )
        return RecordedWait(
            position=self.position, outcome="child", payload=outcome_raw, signal=None
        )

    def signal_waiting(self) -> bool:
        """After parking: did a matching signal come in while the wait was being recorded?"""
        return self._m.find_signal(self.signals) is not None
