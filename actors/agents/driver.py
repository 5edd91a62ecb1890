"""What a run's ``Context`` stands on: the ``Driver`` that does its I/O, and ``ContextBase``.

``ContextBase`` holds the run machine and the driver, and what every part of the context uses:
the run's facts (its id, agent, schedule, whether it replays), ``heartbeat``, and the journaled
values (``now``, ``uuid``, ``random``). The parts built on it (steps, waits, children, long
waits) are mixins of ``Context`` (``context.py``), each in a module of its own.
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgspec

from sojourn.schemas.attributes import (
    ATTRIBUTES_MAX,
    InvalidAttributes,
    merge_attributes,
    validate_attributes,
)
from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.errors import PayloadTooLarge
from sojourn.schemas.events import RunEvent, RunSuspended
from sojourn.schemas.vocabulary import ValueKind
from sojourn.schemas.wire import ChildOutcome

from ..client.output import StepOutput
from ..core.actions import Park
from ..core.machine import Machine
from ..core.ratelimit import Grant
from ..ops import metrics as _metrics
from ..worker.interrupt import StepGuard
from .callbacks import CallbackKeys

__all__ = ["HEARTBEAT_DETAILS_MAX", "ContextBase", "Driver", "Duration", "OpenOutput", "seconds"]


HEARTBEAT_DETAILS_MAX = 8 * 1024
"""Largest ``ctx.heartbeat(details)`` in bytes of JSON: it rides on every lease renewal."""


Duration = float | int | timedelta
"""Seconds as a number, or a ``timedelta``."""

OpenOutput = Callable[[int, int], StepOutput]
"""Makes the output writer of the step execution whose ``StepStarted`` was just stored, from
its position and attempt (an ``Activation`` knows the rest: the broker, the run, and the
events-stream sequence of that start, which names the execution)."""


def seconds(d: Duration) -> float:
    """A ``Duration`` in seconds."""
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


class Driver(Protocol):
    """The I/O a ``Context`` needs, done by an ``Activation`` (or refused by ``sojourn
    replay``, whose journal stops before any of it is needed)."""

    @property
    def agent_name(self) -> str: ...

    @property
    def metric_agent(self) -> str: ...

    @property
    def tool_calls(self) -> _metrics.Incrementable:
        """This agent's ``sojourn_tool_calls`` series."""

    def time(self) -> float:
        """Now, on the runs' clock, in wall seconds: what the run records and waits against
        (the worker's ``Clock``; virtual in a test environment)."""

    def check_live(self) -> None:
        """Raise if the activation cannot write any more (fenced, an append refused)."""

    def report(self, details: msgspec.Raw) -> None:
        """A step's progress details (thread-safe)."""

    def running(self, step: str | None) -> None:
        """The step now running (shown by liveness and ``sojourn status``), or none."""

    async def commit(self, events: list[RunEvent]) -> None:
        """Store what the machine has pending plus ``events``, as one decision."""

    async def backoff(self, position: int, retry_at: float) -> None:
        """Set the retry's timer, store the failure, then sleep briefly or park."""

    async def park(self, action: Park) -> None:
        """Set the wait's timer, then store the wait (and what is pending)."""

    async def reserve(self, limit: str) -> Grant:
        """A slot of the shared rate limit ``limit`` (``UnknownLimit`` if nobody declared it)."""

    async def await_slot(self, position: int, slot: float, park: bool) -> None:
        """Wait for a step's slot: here, or (``park``) on its timer, the run parked."""

    async def block_limit(self, limit: str, seconds: float | None) -> None:
        """A provider's 429 to a step of ``limit``: block the limit for everyone."""

    def charge_limit(self, limit: str, tokens: int) -> None:
        """Charge the tokens a request of ``limit`` used."""

    async def rest(self) -> None:
        """The code parked on a wait (recorded): raise ``Parked``, or suspend the code
        until the run is resumed in this process (then return: the wait looks again). Only
        called when all of the code is parked (nothing else of it is running)."""

    async def suspend(self, event: RunSuspended) -> None:
        """Store ``event`` and park (raises ``Parked``)."""

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        """Publish a child's start (idempotent by its run id)."""

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        """The outcome of a child if its history says it ended."""

    def cancel_timer(self, position: int) -> None:
        """Drop the timer of the wait at ``position`` (in the background)."""


class ContextBase:
    """The run machine and the driver of one run's ``Context``, and what all its parts use."""

    def __init__(
        self,
        machine: Machine,
        driver: Driver,
        max_payload: int = 1024 * 1024,
        *,
        output: OpenOutput | None = None,
        guard: StepGuard | None = None,
        callback_keys: CallbackKeys | None = None,
    ) -> None:
        self._m = machine
        self._driver = driver
        self._max_payload = max_payload
        self._open_output = output
        self._guard = guard
        """Interrupts the activation's running steps for a cancel (``worker/interrupt.py``)."""
        self._callback_keys = callback_keys
        """The worker's keyring, which signs ``ctx.callback`` tokens (none: it refuses)."""

    @property
    def run_id(self) -> str:
        return self._m.run_id

    @property
    def agent(self) -> str:
        return self._driver.agent_name

    @property
    def replaying(self) -> bool:
        """True while the code re-executes recorded history (e.g. to skip logging)."""
        return self._m.replaying

    @property
    def schedule(self) -> str | None:
        """The name of the schedule that started this run, or ``None``."""
        return self._m.state.schedule

    @property
    def scheduled_at(self) -> datetime | None:
        """For a run a schedule started: the fire time that started it (UTC; nominal, so
        the same however late the fire was handled, and without its jitter). ``None``
        otherwise. Recorded in the run's history: replays see the same value."""
        at = self._m.state.scheduled_at
        return None if at is None else datetime.fromtimestamp(at, UTC)

    @property
    def offline(self) -> bool:
        """True under ``sojourn replay`` (and the golden-history tests): the code is checked
        against a stored history with no broker, and stops at the first operation the history
        lacks. Integrations that need a live event loop of their own look at this."""
        return self._m.stop_at_frontier

    def heartbeat(self, details: Any = None) -> None:
        """Report progress (``details``: JSON, at most 8 KiB): shown by ``sojourn status`` and
        sent with the run's next heartbeat, within a second. Safe to call from any thread and
        as often as you like (heartbeats are coalesced); it is not journaled.

        Raises:
            PayloadTooLarge: ``details`` encodes to more than 8 KiB.
            TypeError: ``details`` is not JSON-encodable.
        """
        try:
            raw = to_raw(details)
        except msgspec.EncodeError as e:
            raise TypeError(f"ctx.heartbeat details must be JSON-encodable: {e}") from e
        if len(raw) > HEARTBEAT_DETAILS_MAX:
            raise PayloadTooLarge(
                f"heartbeat details are {len(raw)} bytes; the limit is {HEARTBEAT_DETAILS_MAX}",
                run_id=self.run_id,
            )
        self._driver.report(raw)

    # --- journaled values --------------------------------------------------------------------

    def _value(self, kind: ValueKind, make: Callable[[], Any], tp: Any) -> Any:
        self._driver.check_live()
        return from_raw(self._m.value(kind, make, self._driver.time()).result, tp)

    def now(self) -> datetime:
        """The current time (UTC), journaled: replay returns the recorded instant."""
        value: datetime = self._value(
            "now", lambda: datetime.fromtimestamp(self._driver.time(), UTC), datetime
        )
        return value

    def uuid(self) -> _uuid.UUID:
        """A random UUID4, journaled."""
        value: _uuid.UUID = self._value("uuid", _uuid.uuid4, _uuid.UUID)
        return value

    def random(self) -> float:
        """A float in [0, 1), journaled."""
        value: float = self._value("random", _random.random, float)
        return value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Upsert the run's search attributes (``sojourn.schemas.attributes``): each value
        given is set (a ``str``, ``int``, ``float``, ``bool`` or an aware ``datetime``, kept
        as RFC 3339 text), a ``None`` removes its key. Journaled (a recorded value of kind
        ``attributes``): a replay records nothing again, and the read side lists the run by
        them once the projector has seen the decision.

        Raises:
            InvalidAttributes: a malformed key or value, or more than ``ATTRIBUTES_MAX`` keys
                on the run after the upsert (nothing is recorded).
        """
        checked = validate_attributes(attributes, removals=True)

        def upsert() -> dict[str, Any]:
            merged = merge_attributes(self._m.state.attributes, checked)
            wanted = {k for k, v in checked.items() if v is not None}
            if not wanted <= merged.keys():
                raise InvalidAttributes(f"a run has at most {ATTRIBUTES_MAX} attributes")
            return checked

        self._value("attributes", upsert, dict)
