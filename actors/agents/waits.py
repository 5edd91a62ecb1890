"""Durable waits: ``ctx.sleep``, ``ctx.wait_for``, ``ctx.select``, and the one wait primitive
under them (and under child results and the pause of ``ctx.poll``).

A wait is recorded, then the run parks: a broker timer or a signal wakes it, and the wait's
end is recorded before the code goes on, so a replay takes the same way. No process waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, overload

from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.names import validate_signal_name
from sojourn.schemas.vocabulary import WaitKey

from ..core.actions import LookupChildren
from ..core.journal import RecordedWait
from ..core.waits import WaitTurn
from .driver import Duration, seconds
from .updates import Updates

__all__ = ["Selected", "Waits"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Selected:
    """Which of several awaited signals arrived first, and its payload."""

    name: str
    payload: Any


class Waits(Updates):
    """``Context``'s durable waits: ``sleep``, ``wait_for``, ``select``; updates
    (``on_update``, ``updates.py``) are decided at them."""

    async def sleep(
        self, duration: Duration | None = None, *, until: datetime | None = None
    ) -> None:
        """Sleep durably: the run parks and a broker-kept timer wakes it (no process waits).

        Args:
            duration: seconds (number) or a ``timedelta``.
            until: an aware ``datetime`` instead of a duration. A time in the past returns now.
        """
        if (duration is None) == (until is None):
            raise ValueError("ctx.sleep takes a duration or until=, not both")
        if until is not None and until.tzinfo is None:
            raise ValueError("ctx.sleep(until=...) needs a timezone-aware datetime")
        await self._wait(WaitKey.sleep(), timeout=duration, until=until)

    @overload
    async def wait_for(self, name: str, *, timeout: Duration | None = None) -> Any: ...

    @overload
    async def wait_for(self, name: str, *, type: type[T]) -> T: ...

    @overload
    async def wait_for(self, name: str, *, timeout: Duration | None, type: type[T]) -> T | None: ...

    async def wait_for(
        self, name: str, *, timeout: Duration | None = None, type: Any = None
    ) -> Any:
        """Wait for the signal ``name`` and return its payload (decoded as ``type``), or
        ``None`` when ``timeout`` passes first.

        A signal that arrived before this call is buffered in the run's history and consumed
        here, oldest first: none is lost.
        """
        got = await self._receive(name, timeout=timeout)
        return None if got is None else from_raw(got.payload, Any if type is None else type)

    async def _receive(self, name: str, *, timeout: Duration | None = None) -> RecordedWait | None:
        """``wait_for`` for sojourn's own patterns, which need to know who sent the signal: its
        payload (raw) with ``sent_by`` and ``sender_verified``, or ``None`` on timeout. The
        same wait as ``wait_for`` (key ``signal:<name>``): either replays the other's history."""
        validate_signal_name(name)
        return await self._wait(WaitKey.signal(name), signals=(name,), timeout=timeout)

    async def select(self, *names: str, timeout: Duration | None = None) -> Selected | None:
        """Wait for the first of several signals (and optionally a timeout).

        Returns ``Selected(name, payload)`` for the signal that came first (oldest first if
        several were already buffered), or ``None`` on timeout.
        """
        if not names:
            raise ValueError("ctx.select needs at least one signal name")
        for n in names:
            validate_signal_name(n)
        got = await self._wait(WaitKey.select(*names), signals=names, timeout=timeout)
        if got is None:
            return None
        return Selected(name=got.signal or "", payload=from_raw(got.payload, Any))

    async def _wait(
        self,
        key: WaitKey,
        *,
        signals: tuple[str, ...] = (),
        timeout: Duration | None = None,
        until: datetime | None = None,
        children: tuple[str, ...] = (),
    ) -> RecordedWait | None:
        """The one wait primitive: returns how the wait ended (``None``: timed out) or parks."""
        self._driver.check_live()

        def deadline() -> float | None:
            if until is not None:
                return until.timestamp()
            return None if timeout is None else self._driver.time() + seconds(timeout)

        position = self._m.journal.position  # the wait's (no await before it takes it)
        turn = self._m.wait(key.format(), signals=signals, deadline=deadline, children=children)
        await self._replay_updates(position)  # those applied here before: again, in order
        if not isinstance(turn, WaitTurn):
            return turn
        return await self._decide(turn)

    async def _decide(self, turn: WaitTurn) -> RecordedWait | None:
        looked = False
        while True:
            await self._take_updates(turn.position)  # updates not decided yet: decided here
            action = turn.next(self._driver.time(), looked=looked)
            if action is None:
                return None
            if isinstance(action, RecordedWait):
                if action.outcome == "signal" and turn.deadline is not None:
                    self._driver.cancel_timer(turn.position)
                return action
            if isinstance(action, LookupChildren):
                looked = True
                for child in action.children:
                    outcome = await self._driver.child_outcome(child)
                    if outcome is not None:
                        return turn.child_ended(
                            to_raw(outcome), outcome.status, self._driver.time()
                        )
                continue
            await self._driver.park(action)
            if not turn.signal_waiting():
                # Unwinds (``Parked``), or rests here while the worker keeps the run, and
                # returns once it resumed it with what others appended: look again, as a new
                # activation would (``worker/sticky.py``).
                await self._driver.rest()
                looked = False
            # a signal arrived while the wait was being recorded: take it now
