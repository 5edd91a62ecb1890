"""Updates: ``@ctx.on_update(name)`` handlers, which answer ``client.update`` (decision 0042).

A run's code registers a handler (and, optionally, a validator) by name; an update the intake
recorded (``UpdateRequested``) is decided at the run's next wait: the code parked there (or
reaching it) looks at the updates it has not decided, oldest first. Each is validated (a
validator that raises rejects it: ``UpdateRejected``, nothing changed), then applied (the
handler runs, in the wait's place) and its answer recorded (``UpdateCompleted`` with the wait's
position), stored at once: that stored event is the caller's answer. A replay applies every
update recorded at a wait's position again there, in the order they were applied, before the
code goes past the wait, so what the handlers changed is rebuilt like everything else.

Handlers and validators run in the run's code: they must be deterministic, and must not call
``ctx`` operations (steps, waits, values): an update is applied between two of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.errors import NondeterminismError, PayloadTooLarge
from sojourn.schemas.events import ErrorInfo, UpdateCompleted, UpdateRejected
from sojourn.schemas.names import validate_signal_name
from sojourn.schemas.updates import UPDATE_ANSWER_MAX, UPDATE_MESSAGE_MAX

from ..core.state import UpdateRecord
from ..core.steps import clip_text, error_info
from ..worker.faults import fault
from .driver import ContextBase

__all__ = ["UpdateHandler", "Updates"]

H = TypeVar("H", bound=Callable[..., Any])

_NULL = msgspec.Raw(b"null")


@dataclass(frozen=True, slots=True)
class UpdateHandler:
    """A registered handler: the function, its validator, and the payload's type."""

    handler: Callable[[Any], Any]
    validate: Callable[[Any], Any] | None
    type: Any


async def _call(fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, awaited when it is a coroutine function or returns an awaitable."""
    out = fn(arg)
    return await out if inspect.isawaitable(out) else out


class Updates(ContextBase):
    """``Context``'s updates: ``on_update``, and their decision at the run's waits."""

    _update_handlers: dict[str, UpdateHandler] | None = None
    _updates_decided: set[str] | None = None
    """Ids of the updates this activation decided (its state shows them once stored)."""
    _reapplying: bool = False

    @property
    def replaying(self) -> bool:
        """True while the code re-executes recorded history, an update handler applied again
        from history included (e.g. to skip logging)."""
        return self._reapplying or self._m.replaying

    def on_update(
        self,
        name: str,
        *,
        validate: Callable[[Any], Any] | None = None,
        type: Any = None,
    ) -> Callable[[H], H]:
        """Register the handler of the update ``name`` (a decorator)::

            items: list[str] = []

            def not_empty(item: str) -> None:
                if not item:
                    raise ValueError("an empty item")

            @ctx.on_update("add", validate=not_empty, type=str)
            def add(item: str) -> int:
                items.append(item)
                return len(items)

            await ctx.wait_for("done")   # updates are decided at the run's waits

        The handler gets the update's payload (decoded as ``type``) and returns the answer
        (JSON, at most 64 KiB); ``validate`` (optional) gets the same payload and rejects the
        update by raising: then nothing changes and the caller gets the rejection. Either may
        be ``async``; neither may call ``ctx`` operations. Registering a name again replaces
        its handler from there on. A handler must be registered again on every replay, at the
        same point of the code (it is code like any other).

        Raises:
            InvalidName: ``name`` is not a valid signal-style name.
        """
        validate_signal_name(name)

        def register(fn: H) -> H:
            if self._update_handlers is None:
                self._update_handlers = {}
            self._update_handlers[name] = UpdateHandler(fn, validate, Any if type is None else type)
            return fn

        return register

    # --- decided at waits --------------------------------------------------------------------

    async def _replay_updates(self, position: int) -> None:
        """Apply again the updates history says were applied at the wait at ``position``,
        in the order they were (answers and failures are in the history already)."""
        for u in self._m.state.updates:
            if u.outcome != "completed" or u.position != position:
                continue
            entry = (self._update_handlers or {}).get(u.name)
            if entry is None:
                raise NondeterminismError(
                    f"update {u.update_id!r} ({u.name!r}) was applied at position {position}, "
                    "but the code registers no handler of that name there",
                    run_id=self.run_id,
                )
            self._reapplying = True
            try:
                await self._apply(entry, from_raw(u.payload, entry.type))
            except NondeterminismError:
                raise
            except Exception:
                pass  # it raised when it was applied: recorded as the update's failure
            finally:
                self._reapplying = False

    async def _take_updates(self, position: int) -> None:
        """Decide the updates the run received and has not decided, oldest first, at the
        open wait at ``position``; store the decisions at once (the callers' answers)."""
        decided = self._updates_decided
        if decided is None:
            decided = self._updates_decided = set()
        fresh = [
            u
            for u in self._m.state.updates
            if u.outcome == "pending" and u.update_id not in decided
        ]
        if not fresh:
            return
        for u in fresh:
            decided.add(u.update_id)
            self._m.record(await self._decide_update(u, position))
        self._driver.check_live()
        await self._driver.commit([])
        fault("update_applied", self.run_id)

    async def _decide_update(
        self, u: UpdateRecord, position: int
    ) -> UpdateCompleted | UpdateRejected:
        at = self._driver.time()
        entry = (self._update_handlers or {}).get(u.name)
        if entry is None:
            return UpdateRejected(
                update_id=u.update_id,
                name=u.name,
                code="unknown_update",
                message=f"the run has no handler for the update {u.name!r} where it waits",
                sent_by=u.sent_by,
                at=at,
            )
        try:
            payload = from_raw(u.payload, entry.type)
            if entry.validate is not None:
                await _call(entry.validate, payload)
        except NondeterminismError:
            raise
        except Exception as e:
            return UpdateRejected(
                update_id=u.update_id,
                name=u.name,
                code="rejected",
                message=clip_text(f"{type(e).__name__}: {e}", UPDATE_MESSAGE_MAX),
                sent_by=u.sent_by,
                at=at,
            )
        answer, error = _NULL, None
        try:
            raw = to_raw(await self._apply(entry, payload))
            if len(raw) > UPDATE_ANSWER_MAX:
                raise PayloadTooLarge(
                    f"the answer is {len(raw)} bytes; the limit is {UPDATE_ANSWER_MAX}",
                    run_id=self.run_id,
                )
            answer = raw
        except NondeterminismError:
            raise
        except Exception as e:
            info = error_info(e)
            error = ErrorInfo(type=info.type, message=clip_text(info.message, UPDATE_MESSAGE_MAX))
        return UpdateCompleted(
            update_id=u.update_id,
            name=u.name,
            position=position,
            answer=answer,
            sent_by=u.sent_by,
            error=error,
            at=self._driver.time(),
        )

    async def _apply(self, entry: UpdateHandler, payload: Any) -> Any:
        """Run a handler; one that took a journal position (called a ``ctx`` operation)
        breaks every replay after it, so that ends the run's code with an error."""
        before = self._m.journal.position
        out = await _call(entry.handler, payload)
        if self._m.journal.position != before:
            raise NondeterminismError(
                "an update handler called a ctx operation: handlers must not",
                run_id=self.run_id,
            )
        return out
