"""A run's step list and its spend per budget kind, folded event by event (pure; decision 0040).

``summarize`` (``summary.py``) keeps the list in the run's summary with these functions, and
``steps_of`` makes the read side's record (``sojourn.schemas.steps.RunSteps``) from it. The
list holds the latest ``STEPS_KEPT`` step positions: a step's record is made at its first
``StepStarted`` and updated by each later attempt and end; a position older than every kept
one, once the list is full, is not taken back (the machine starts positions in order, so only
a history no worker wrote does that). The console's timeline folds the same steps from the
whole history (``actors/console/timeline.py``); tests/projections/test_steplist.py checks the
two agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from sojourn.schemas import events as ev
from sojourn.schemas.codec import from_raw
from sojourn.schemas.steps import (
    STEP_ERROR_MAX,
    STEP_NAME_MAX,
    STEPS_KEPT,
    BudgetSpend,
    RunSteps,
    StepRecord,
)
from sojourn.schemas.views import ViewError
from sojourn.schemas.vocabulary import BUDGET_LIMITS, LLM_STEP, StepKind
from sojourn.schemas.wire import DECIDE_SIGNAL, InDoubtDecision

if TYPE_CHECKING:
    from .summary import RunSummary

__all__ = [
    "clip",
    "decided",
    "spend_of",
    "step_ended",
    "step_kind",
    "step_started",
    "steps_of",
]

Steps = tuple[StepRecord, ...]
_DECIDE = DECIDE_SIGNAL + "."


def clip(text: str | None, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when cut."""
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_kind(text: str) -> StepKind:
    """A ``StepStarted.kind`` read total: a kind this code does not know is a ``step``."""
    return "llm" if text == LLM_STEP else "tool" if text == "tool" else "step"


def _find(steps: Steps, position: int) -> int:
    """The index of ``position`` in ``steps`` (kept in position order), or -1."""
    for i in range(len(steps) - 1, -1, -1):  # the latest positions are at the end
        p = steps[i].position
        if p == position:
            return i
        if p < position:
            return -1
    return -1


def _plus(a: ev.Usage | None, b: ev.Usage | None) -> ev.Usage | None:
    if b is None:
        return a
    if a is None:
        return b
    return ev.Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        usd=a.usd + b.usd,
        requests=a.requests + b.requests,
        model=b.model or a.model,
    )


def step_started(steps: Steps, total: int, e: ev.StepStarted) -> tuple[Steps, int]:
    """The list (and the count of all positions) after ``e``."""
    i = _find(steps, e.position)
    if i >= 0:
        r = steps[i]
        r = msgspec.structs.replace(
            r,
            attempts=r.attempts + 1,
            retries=r.retries + (r.outcome == "failed"),
            in_doubt=r.in_doubt + (r.outcome == "running"),
            outcome="running",
            ended_at=None,
            duration=None,
            retry_at=None,
            attempt=e.attempt,
            attempt_started_at=e.at,
        )
        return (*steps[:i], r, *steps[i + 1 :]), total
    if len(steps) >= STEPS_KEPT and e.position < steps[0].position:
        return steps, total  # fell out of the kept window before: not taken back
    r = StepRecord(
        position=e.position,
        name=clip(e.name, STEP_NAME_MAX),
        kind=step_kind(e.kind),
        started_at=e.at,
        attempts=1,
        attempt=e.attempt,
    )
    if not steps or steps[-1].position < e.position:
        out = (*steps, r)
    else:  # out of order: kept sorted by position
        out = tuple(sorted((*steps, r), key=lambda x: x.position))
    return (out[-STEPS_KEPT:] if len(out) > STEPS_KEPT else out), total + 1


def step_ended(steps: Steps, e: ev.StepCompleted | ev.StepFailed) -> Steps:
    """The list after an attempt's end (an end whose step is not kept changes nothing)."""
    i = _find(steps, e.position)
    if i < 0:
        return steps
    r = steps[i]
    changes: dict[str, object] = {"ended_at": e.at, "usage": _plus(r.usage, e.usage)}
    if e.attempt == r.attempt:  # an end of another attempt settles only the step's end
        failed = isinstance(e, ev.StepFailed)
        changes["outcome"] = "failed" if failed else "completed"
        began = r.started_at if r.attempt_started_at is None else r.attempt_started_at
        changes["duration"] = e.duration or max(e.at - began, 0.0)
        if isinstance(e, ev.StepFailed):
            changes["error"] = ViewError(
                type=clip(e.error.type, STEP_NAME_MAX),
                message=clip(e.error.message, STEP_ERROR_MAX),
            )
            changes["retry_at"] = e.retry_at
    return (*steps[:i], msgspec.structs.replace(r, **changes), *steps[i + 1 :])


def decided(steps: Steps, e: ev.SignalReceived) -> Steps:
    """The list after an operator's decision on an in-doubt step (the reserved signal
    ``sojourn-decide.<position>.<attempt>``); any other signal changes nothing."""
    if not e.name.startswith(_DECIDE):
        return steps
    position, _, _attempt = e.name[len(_DECIDE) :].partition(".")
    if not position.isdigit() or len(position) > 12:
        return steps
    i = _find(steps, int(position))
    if i < 0:
        return steps
    try:
        d: InDoubtDecision = from_raw(e.payload, InDoubtDecision)
    except msgspec.MsgspecError:
        return steps
    by = clip(e.sent_by or d.by, STEP_NAME_MAX) or None
    r = msgspec.structs.replace(steps[i], decision=d.action, decided_by=by)
    return (*steps[:i], r, *steps[i + 1 :])


def spend_of(
    used: dict[str, float], budget: ev.Budget | None, grants: int
) -> tuple[BudgetSpend, ...]:
    """One entry per budget kind: what was ``used`` and the limit of ``budget`` granted
    ``grants`` times."""
    out = []
    for b in BUDGET_LIMITS:
        limit = None if budget is None else getattr(budget, b)
        out.append(
            BudgetSpend(limit=b, used=used[b], granted=None if limit is None else limit * grants)
        )
    return tuple(out)


def steps_of(s: RunSummary) -> RunSteps:
    """The read side's step record of a run whose history folds to ``s``."""
    c = s.carried or ev.Carried()
    steps = c.steps + s.step_attempts
    model_calls = c.model_calls + s.model_calls
    started = c.started_at or s.started_at
    end = s.ended_at if s.ended_at is not None else s.last_event_at
    used: dict[str, float] = {
        "usd": c.usd + s.spent_usd,
        "tokens": c.tokens + s.spent_tokens,
        "input_tokens": c.input_tokens + s.spent_input_tokens,
        "output_tokens": c.output_tokens + s.spent_output_tokens,
        "wall_seconds": max(end - started, 0.0) if started else 0.0,
        "steps": steps,
        "tool_calls": steps - model_calls,
        "polls": c.polls + s.idle_polls,
    }
    return RunSteps(
        run_id=s.run_id,
        last_seq=s.last_seq,
        updated_at=s.last_event_at,
        steps_total=s.steps_total,
        steps=s.step_list,
        model_calls=s.model_calls,
        tool_calls=s.step_attempts - s.model_calls,
        spend=spend_of(used, s.budget, s.budget_grants),
        chain_started_at=started,
    )
