"""Whether a keyed start's record is still needed (decisions 0047, 0053): read by the intake
(a singleton start attaches to its key's live run) and by retention (which removes the records
nothing needs any more). Reads only."""

from __future__ import annotations

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_events
from sojourn.schemas.errors import HistoryError
from sojourn.schemas.flow import SingletonRecord
from sojourn.schemas.lifecycle import TERMINAL_EVENTS

from .chain import current_run

__all__ = ["recorded_pending", "singleton_run"]


async def singleton_run(
    broker: Broker, names: Names, rec: SingletonRecord
) -> tuple[str | None, StoredMessage | None]:
    """The run ``rec`` stands for if it is live (its chain's current run), else ``None``: it
    ended, or it never will exist; and the last message of that chain (``None``: no history,
    the run was never created or has left the hot streams)."""
    try:
        rid, last = await current_run(broker, names, rec.run_id)
    except HistoryError:
        return rec.run_id, None  # a chain too long to follow now is not an ended one
    if last is None:
        pending = await recorded_pending(broker, names, (rec.inbox_seq,))
        return (rec.run_id if pending else None), None
    try:
        events = decode_events(last.data)
    except msgspec.MsgspecError:
        return None, last  # a poison history is not a live run
    if events and isinstance(events[-1], TERMINAL_EVENTS):
        return None, last
    return rid, last


async def recorded_pending(broker: Broker, names: Names, seqs: tuple[int, ...]) -> bool:
    """Whether a start at one of the inbox sequences ``seqs`` may still be in the inbox (a work
    queue: a start is removed once acknowledged). Exact for one sequence; for several, any
    message stored between the first and the last counts (a start among them may be)."""
    if not seqs:
        return False
    first, last = min(seqs), max(seqs)
    stored = await broker.direct_get_next(names.inbox_stream, f"{names.prefix}.>", first)
    return stored is not None and stored.seq <= last
