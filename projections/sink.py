"""What the projector hands a read model: ``Applied``, one decision of its fold, and ``ViewSink``,
the read model fed with them (the SQLite model, ``projections/sqlite.py``, is one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from sojourn.schemas.events import RunEvent
from sojourn.schemas.health import LivenessState
from sojourn.schemas.views import RunView

from .summary import RunSummary

__all__ = ["Applied", "ViewSink"]


class Applied(NamedTuple):
    """One decision as the projector applied it."""

    seq: int
    """The events-stream sequence of the decision."""
    view: RunView
    """The run's view after it."""
    events: tuple[RunEvent, ...]
    """The decision's events (for the step rows)."""
    summary: RunSummary | None = None
    """The run's summary after it: the leader makes the run's step record
    (``steplist.steps_of``) from the last one of each run in a batch it writes."""


class ViewSink(Protocol):
    """A read model fed from the projector's fold (the SQLite model, ``projections/sqlite.py``).

    ``apply`` writes a batch in one transaction, skipping decisions at or below ``position``,
    and returns the rows written; each ``Applied`` is one decision: its events-stream
    sequence, the run's view after it, and its events.
    """

    @property
    def position(self) -> int: ...

    async def apply(self, batch: Sequence[Applied]) -> int: ...
    async def put_pending(self, view: RunView) -> bool: ...
    async def drop_pending(self, run_id: str) -> bool: ...
    async def set_liveness(self, changes: Sequence[tuple[str, LivenessState]]) -> None: ...
    async def reset(self) -> None: ...
    async def close(self) -> None: ...
