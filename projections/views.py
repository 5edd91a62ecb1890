"""Run views: what the read side shows of a run, made from its summary (pure).

The projector writes one ``RunView`` (``sojourn.schemas.views``) per decision to the runs KV
bucket and to the run's change subject. A view is a function of the run's summary after that
decision and of the liveness judged for it, nothing else, so the view of a decision is the same
whether the projector folded the history in one pass or rebuilt its fold from the start after
a restart (tests/projections/test_views.py checks exactly that).
"""

from __future__ import annotations

from sojourn.schemas.concurrency import queued_detail
from sojourn.schemas.health import LivenessState
from sojourn.schemas.lifecycle import queued_on
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.views import RunView

from .summary import RunSummary

__all__ = ["pending_view", "view_of"]


def view_of(s: RunSummary, liveness: LivenessState | None) -> RunView:
    """The view of a run whose history folds to ``s``; ``liveness`` as last judged (``None``
    before the projector has judged it; an ended run is always ``ended``)."""
    return RunView(
        run_id=s.run_id,
        agent=s.agent,
        status=s.status,
        liveness="ended" if s.terminal else liveness,
        parent_run_id=s.parent_run_id,
        schedule=s.schedule,
        scheduled_at=s.scheduled_at,
        forked_from=s.forked_from,
        forked_at=s.forked_at,
        attributes=s.attributes,
        children=s.children,
        children_count=s.children_count,
        waiting_on=s.waiting_on,
        waiting_since=s.waiting_since,
        deadline=s.deadline,
        step=s.step,
        step_position=s.step_position,
        step_attempt=s.step_attempt,
        steps_done=s.steps_done,
        attempts=s.step_attempts,
        retries=s.retries,
        signals_buffered=len(s.signals),
        cancel_requested=s.cancel_requested,
        suspended_reason=s.suspended_reason,
        suspended_detail=s.suspended_detail,
        spent_usd=s.spent_usd,
        spent_tokens=s.spent_tokens,
        budget_usd=None if s.budget_usd is None else s.budget_usd * s.budget_grants,
        budget_tokens=None if s.budget_tokens is None else s.budget_tokens * s.budget_grants,
        error=s.error,
        code_version=s.code_version,
        started_at=s.started_at,
        updated_at=s.last_event_at,
        ended_at=s.ended_at,
        last_seq=s.last_seq,
        events=s.events,
        priority=s.priority,
        fairness=s.fairness,
        detail=None if (q := queued_on(s.waiting_on)) is None else queued_detail(q, None),
    )


def pending_view(
    run_id: str, agent: str, at: float, priority: Priority = PRIORITY_DEFAULT
) -> RunView:
    """The view of a run whose start is stored in the inbox and that no worker has taken yet
    (``last_seq`` 0: any view made from its history supersedes it); ``priority``: its start's
    lane."""
    return RunView(
        run_id=run_id,
        agent=agent,
        status="pending",
        liveness="pending",
        started_at=at,
        updated_at=at,
        priority=priority,
    )
