"""Which ended runs leave the hot streams (retention, ``Settings.retain_ended``): pure.

Two questions, answered without I/O so they can be tested on their own:

- ``select``: from the read side's views (the runs KV bucket), the runs worth a look: ended
  (``TERMINAL``), not archived yet, and ended before the cutoff, oldest first. A view is only a
  hint: it may be stale or wrong.
- ``judge``: from the run's own history, folded (``RunSummary``), right before anything is
  removed: the run has ended, its last event and the stored time of its last message are both
  before the cutoff, and, for a child run, its parent has ended too (a live parent may still
  read its child's end from the child's history, and cancels children it does not see ended).

The cutoff is ``now - retain_ended``; ``now`` is a parameter (a simulated clock in tests,
``time.time()`` otherwise). Both times count, the writer's (the event's ``at``) and the
server's (when the stream stored the message), so a writer whose clock runs behind cannot get
a run archived early.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from sojourn.schemas.views import RunView
from sojourn.schemas.vocabulary import TERMINAL

from .summary import RunSummary

__all__ = ["VERDICTS", "Verdict", "cutoff", "ended_at", "judge", "select"]

Verdict = Literal["archive", "empty", "live", "young", "parent_live"]
"""What ``judge`` says of a run: ``archive`` it, or why not: no history (``empty``), not ended
(``live``), ended after the cutoff (``young``), a child whose parent has not ended
(``parent_live``)."""
VERDICTS: Final[tuple[Verdict, ...]] = ("archive", "empty", "live", "young", "parent_live")


def cutoff(now: float, retain_ended: float) -> float:
    """Runs that ended at or before this time (unix seconds) are due to leave."""
    return now - retain_ended


def ended_at(view: RunView) -> float:
    """When a view says its run ended: ``ended_at``, else the time of its last event."""
    return view.ended_at if view.ended_at is not None else view.updated_at


def select(
    views: Iterable[RunView], *, now: float, retain_ended: float, limit: int | None = None
) -> list[str]:
    """The run ids whose view says they ended at or before the cutoff and are not archived,
    oldest end first (ties by run id), at most ``limit`` of them."""
    cut = cutoff(now, retain_ended)
    due = [
        (ended_at(v), v.run_id)
        for v in views
        if v.status in TERMINAL and not v.archived and ended_at(v) <= cut
    ]
    due.sort()
    ids = [run_id for _, run_id in due]
    return ids if limit is None else ids[: max(0, limit)]


def judge(
    summary: RunSummary,
    *,
    last_stored_at: float,
    now: float,
    retain_ended: float,
    parent_ended: bool | None = None,
) -> Verdict:
    """Whether the run whose history folds to ``summary`` may leave the hot streams now.

    Args:
        summary: the fold of the run's whole history.
        last_stored_at: when the stream stored the run's last message (unix seconds).
        now: the time to judge at.
        retain_ended: seconds an ended run stays.
        parent_ended: for a child run, whether its parent has ended (its history ends in a
            terminal event, or it is archived itself); ``None`` when not known, which keeps
            a child run in place.
    """
    if summary.events == 0:
        return "empty"
    if summary.status not in TERMINAL:
        return "live"
    end = max(summary.ended_at or 0.0, summary.last_event_at, last_stored_at)
    if end > cutoff(now, retain_ended):
        return "young"
    if summary.parent_run_id is not None and parent_ended is not True:
        return "parent_live"
    return "archive"
