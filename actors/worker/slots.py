"""What an ``Activation`` does for steps with a shared rate limit (decision 0046): ask the
worker's ``SharedLimits`` for a slot, wait for it (in the activation when it is near, else
parked on a timer with no worker holding the run), block the limit for everyone on a
provider's 429, and charge the tokens a request used."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sojourn.schemas.errors import UnknownLimit
from sojourn.schemas.events import RunEvent

from ..core.actions import Parked
from ..core.ratelimit import Grant
from .appends import Appender
from .clock import Clock
from .limits import SharedLimits
from .run_timers import RunTimers

__all__ = ["SlotWaits"]


class SlotWaits:
    """The shared-limit part of an ``Activation`` (a mixin: it uses the activation's clock,
    timers and appends)."""

    limits: SharedLimits | None
    clock: Clock
    timers: RunTimers
    log: Appender
    commit: Callable[[list[RunEvent]], Awaitable[None]]
    _set_lifetime_timer: Callable[[float | None], Awaitable[None]]

    async def reserve(self, limit: str) -> Grant:
        """A slot of ``limit`` for the next attempt of a step.

        Raises:
            UnknownLimit: nobody declared or set ``limit``.
        """
        if self.limits is None:
            raise UnknownLimit(f"no shared limits here: the step's limit {limit!r} is unknown")
        return await self.limits.reserve(limit)

    async def await_slot(self, position: int, slot: float, park: bool) -> None:
        """Wait for the slot at ``slot``: here when it is near, else set the step's timer (kept
        in process, the broker's copy a backstop, like a wait's), store what is pending (its
        ``StepThrottled``) and park (raises ``Parked``)."""
        if not park:
            await self.clock.sleep_until(slot)
            return
        await self.timers.for_wait(position, slot, self.log.decisions)
        await self._set_lifetime_timer(slot)
        await self.commit([])
        raise Parked()

    async def block_limit(self, limit: str, seconds: float | None) -> None:
        """A provider answered 429 to a step of ``limit``: block it for everyone."""
        if self.limits is not None:
            await self.limits.block(limit, seconds)

    def charge_limit(self, limit: str, tokens: int) -> None:
        """A request of ``limit`` used ``tokens``: charge them (in the background)."""
        if self.limits is not None:
            self.limits.charge(limit, tokens)
