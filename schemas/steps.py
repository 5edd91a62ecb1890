"""A run's step list and its spend against every budget kind: the read side's second record of
a run (decision 0040).

The projector keeps it beside the run's ``RunView``, as the runs bucket's key
``<run_id>.steps`` (``RunSteps``), and rewrites it with the run's view: a view stays small for
the KV and the change subjects, and the step list, which grows with the run, lives here,
bounded. The gateway serves it as ``GET /v1/runs/{id}/steps`` and ``Client.steps`` reads it
(docs/wire.md, "The read side"); ``sojourn.schemas.codec.decode_run_steps`` reads it.

Open for readers like the views (unknown fields are ignored) and bounded: at most
``STEPS_KEPT`` steps, the latest positions (``steps_total`` counts them all), names and errors
cut, so a run of 100,000 steps holds a record of the same bounded size as one of 100.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from .events import Usage
from .views import ViewError
from .vocabulary import BudgetLimit, StepKind

__all__ = [
    "ATTEMPT_OUTCOMES",
    "DECISION_ACTIONS",
    "STEPS_KEPT",
    "STEPS_RECORD_MAX",
    "STEP_ERROR_MAX",
    "STEP_NAME_MAX",
    "AttemptOutcome",
    "BudgetSpend",
    "DecisionAction",
    "RunSteps",
    "StepRecord",
]

STEPS_KEPT: Final = 100
"""Steps one record keeps: the latest positions (``RunSteps.steps_total`` counts them all)."""

STEP_NAME_MAX: Final = 200
"""Characters of a step name (and of an error type, a decider's name) a record keeps."""

STEP_ERROR_MAX: Final = 512
"""Characters of a step's last error message a record keeps (the history keeps it whole)."""

STEPS_RECORD_MAX: Final = 256 * 1024
"""The largest record a reader decodes, in bytes: what the bounds above allow, with room."""

AttemptOutcome = Literal["running", "completed", "failed", "in_doubt"]
"""Where a step attempt stands: started and not settled (``running``), ``completed``,
``failed`` (retried at ``retry_at``, or not), or ``in_doubt``: it started, never ended, and a
later attempt began (its worker was lost mid-step)."""

ATTEMPT_OUTCOMES: tuple[AttemptOutcome, ...] = ("running", "completed", "failed", "in_doubt")

DecisionAction = Literal["retry", "skip", "fail"]
"""What an operator decided for an in-doubt step (``InDoubtDecision.action``)."""

DECISION_ACTIONS: tuple[DecisionAction, ...] = ("retry", "skip", "fail")


class StepRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One step position of a run, over all its attempts.

    Attributes:
        started_at: its first attempt's start; ``ended_at`` the end of its last attempt that
            ended (``None`` while an attempt is open); ``duration`` that attempt's duration.
        attempts: attempts started; ``retries`` those started after a failed one (not after
            one in doubt); ``in_doubt`` attempts that never ended before the next began.
        outcome: its last attempt's (``AttemptOutcome``).
        error: the last failed attempt's error (kept when a later attempt succeeds: what the
            retries were about); ``retry_at`` when the next attempt is due, while one is.
        usage: what its attempts charged, summed.
        decision / decided_by: an operator's decision on it while in doubt (``sojourn
            decide``), the last one recorded.
    """

    position: int
    name: str
    kind: StepKind = "step"
    started_at: float = 0.0
    ended_at: float | None = None
    duration: float | None = None
    attempts: int = 0
    retries: int = 0
    in_doubt: int = 0
    outcome: AttemptOutcome = "running"
    error: ViewError | None = None
    retry_at: float | None = None
    usage: Usage | None = None
    decision: DecisionAction | None = None
    decided_by: str | None = None
    attempt: int = 1
    """The number of its last attempt (``StepStarted.attempt``)."""
    attempt_started_at: float | None = None
    """When its last attempt started; absent while that is the first (``started_at``)."""


class BudgetSpend(msgspec.Struct, frozen=True, kw_only=True):
    """What the run (with its continue-as-new chain's earlier runs) used of one budget kind,
    and the limit in effect (every grant counted; ``None``: no limit). ``wall_seconds`` is
    counted up to the run's end, or to its last event while it lives (``RunSteps.chain_started_at``
    gives the live figure)."""

    limit: BudgetLimit
    used: float
    granted: float | None = None


class RunSteps(msgspec.Struct, frozen=True, kw_only=True):
    """A run's step list and spend: the runs bucket's value at key ``<run_id>.steps``.

    Attributes:
        last_seq: the events-stream sequence of the last decision it holds (as the run's
            ``RunView.last_seq``): a reader can tell whether the two describe the same point.
        steps_total: step positions the run has started; ``steps`` the latest
            ``STEPS_KEPT`` of them, in position order.
        model_calls / tool_calls: this run's step attempts that were model requests, and the
            rest (its chain's earlier runs are counted in ``spend``, not here).
        spend: one entry per budget kind, every kind, in ``BUDGET_LIMITS`` order.
        chain_started_at: when the run's chain began (``wall_seconds`` counts from there).
    """

    run_id: str
    last_seq: int = 0
    updated_at: float = 0.0
    steps_total: int = 0
    steps: tuple[StepRecord, ...] = ()
    model_calls: int = 0
    tool_calls: int = 0
    spend: tuple[BudgetSpend, ...] = ()
    chain_started_at: float = 0.0
