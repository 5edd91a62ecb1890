"""What bounds a run and what it used: ``Limits``, and the budget rules that suspend a run when
it has used up a limit.

A run is held to its budget across its continue-as-new chain: what the chain's earlier runs
used (``RunStarted.carried``), what the run's history recorded (folded in ``RunState``) and what
the activation's live operations used since (a ``Carried`` too, counted with ``with_usage`` and
``with_attempt``) add up to what the budget holds (``chain_spending``). Pure: the caller passes
the time in.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from sojourn.schemas.events import Budget, Carried, RunSuspended, Usage
from sojourn.schemas.vocabulary import LLM_STEP, BudgetLimit, StepKind

from .actions import Suspend
from .retry import RetryPolicy
from .state import RunState

__all__ = [
    "Limits",
    "budget_suspension",
    "chain_spending",
    "format_duration",
    "spent",
    "used_up",
    "with_attempt",
    "with_usage",
]


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds a run, from its agent and the deployment's settings."""

    max_value: int = 1024 * 1024
    """Bytes of JSON one stored value may take."""
    max_value_why: str = "Settings.max_value"
    crash_loop_limit: int = 3
    """In-doubt attempts in a row after which a step waits for a human (0: never)."""
    poll_cap: int = 1000
    budget: Budget | None = None
    """The agent's budget: what a run whose start recorded none is held to (a run's own
    ``RunStarted.budget``, and every ``BudgetChanged`` since, win)."""
    retry: RetryPolicy | None = None
    """The agent's default retry policy (a step's own ``@step(retry=...)`` wins)."""
    compensates: bool = False
    """The agent has a compensation (``on_cancel``): a cancel stops its code where it was
    taken live, and replay runs the code up to that point again before the compensation."""
    lifetime: float | None = None
    """Seconds a run may live from its start (the agent's ``lifetime``); ``None``: forever."""


def with_usage(used: Carried, usage: Usage) -> Carried:
    """``used`` plus what a step attempt charged."""
    return msgspec.structs.replace(
        used,
        usd=used.usd + usage.usd,
        tokens=used.tokens + usage.tokens,
        input_tokens=used.input_tokens + usage.input_tokens,
        output_tokens=used.output_tokens + usage.output_tokens,
    )


def with_attempt(used: Carried, kind: StepKind) -> Carried:
    """``used`` plus a step execution of ``kind`` started (a model request if ``llm``)."""
    return msgspec.structs.replace(
        used, steps=used.steps + 1, model_calls=used.model_calls + (kind == LLM_STEP)
    )


def chain_spending(state: RunState, live: Carried, polls: int) -> Carried:
    """What the run used (history, then ``live``, what the activation's live operations used,
    and its ``polls``) plus what its chain's earlier runs used: the run's budget holds it, and a
    continued run carries it on."""
    s = state
    c = s.carried or Carried()
    return Carried(
        usd=c.usd + s.spent_usd + live.usd,
        tokens=c.tokens + s.spent_tokens + live.tokens,
        input_tokens=c.input_tokens + s.spent_input_tokens + live.input_tokens,
        output_tokens=c.output_tokens + s.spent_output_tokens + live.output_tokens,
        steps=c.steps + s.step_attempts + live.steps,
        model_calls=c.model_calls + s.model_calls + live.model_calls,
        polls=c.polls + polls,
        started_at=c.started_at or s.started_at,
    )


def spent(used: Carried, now: float) -> dict[BudgetLimit, float]:
    """What ``used`` amounts to in each budget kind, its wall time counted up to ``now``."""
    return {
        "usd": used.usd,
        "tokens": used.tokens,
        "input_tokens": used.input_tokens,
        "output_tokens": used.output_tokens,
        "wall_seconds": max(now - used.started_at, 0.0) if used.started_at else 0.0,
        "steps": used.steps,
        "tool_calls": used.steps - used.model_calls,
        "polls": used.polls,
    }


def used_up(
    budget: Budget, used: Carried, grants: int, now: float, kind: StepKind | None = None
) -> Suspend | None:
    """The suspension due now if ``used`` has reached a limit of ``budget`` granted ``grants``
    times, checked before a step of ``kind`` (``None``: after spending).

    Each resume of a ``budget`` suspension grants the whole budget again. ``steps`` and
    ``tool_calls`` are counted before the execution they would allow: at 3 of 3 steps, the
    fourth does not start. ``polls`` are checked by the poll count, not here.
    """
    counts = spent(used, now)
    del counts["polls"]  # checked by the poll count
    if kind is None:
        del counts["steps"], counts["tool_calls"]
    elif kind == LLM_STEP:
        del counts["tool_calls"]
    for unit, amount in counts.items():
        limit = getattr(budget, unit)
        if limit is not None and amount >= limit * grants:
            return Suspend(budget_suspension(unit, amount, limit * grants, now), unit=unit)
    return None


def budget_suspension(unit: BudgetLimit, used: float, limit: float, now: float) -> RunSuspended:
    """The suspension of a run that used up its ``unit`` limit, the limit named."""
    flag = unit.replace("_", "-")
    return RunSuspended(
        reason="budget",
        detail=f"budget {unit} used up: {used:g} of {limit:g}; "
        f"`sojourn budget RUN --{flag} N` raises it and resumes the run",
        limit=unit,
        at=now,
    )


def format_duration(seconds: float) -> str:
    """``90061`` as ``1d1h1m1s`` (``1.5`` as ``1.5s``): a lifetime in a reason people read."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
