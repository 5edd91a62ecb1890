"""A run's timeline for the console (docs/console.md): its stored decisions folded into what a
person reads, pure.

Every step with its attempts (start, end, duration, outcome, the error of a failed one, when a
retry is due, which worker wrote it: an attempt that started and never ended is ``in_doubt``,
its worker lost mid-step, and the next attempt is the restart), waits with their deadlines and
what ended them, signals with the sender the intake recorded, child runs, model calls with
their tokens and cost, suspensions with the limit or reason named, resumes, budget changes,
cancels and the end; the spend against each budget kind; the continue-as-new links. The
console draws it; the history stays the truth (``GET /v1/runs/{id}/history``).

Bounded: at most ``ITEMS_MAX`` items, the latest (``omitted`` counts the rest). Callback
tokens recorded in a history are live credentials and are never copied into a timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from sojourn.broker.eventstore import Decision
from sojourn.schemas import events as ev
from sojourn.schemas.codec import decode_spend, from_raw
from sojourn.schemas.events import Carried, Usage
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.health import LivenessState
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.steps import ATTEMPT_OUTCOMES, AttemptOutcome
from sojourn.schemas.views import ERROR_MESSAGE_MAX, ViewError
from sojourn.schemas.vocabulary import (
    BUDGET_LIMITS,
    LLM_STEP,
    SPEND_KIND,
    BudgetLimit,
    RunStatus,
    StepKind,
    SuspendReason,
    WaitOutcome,
    suspend_reason,
)

from ..core.limits import chain_spending, spent
from ..core.state import RunState, fold

__all__ = [
    "ATTEMPT_OUTCOMES",
    "ITEMS_MAX",
    "ITEM_KINDS",
    "Attempt",
    "AttemptOutcome",
    "Item",
    "ItemKind",
    "Spend",
    "Timeline",
    "timeline_of",
]

ITEMS_MAX: Final = 5000
"""Items one timeline holds (the latest); a longer run says how many it left out."""

_TEXT_MAX: Final = 512
"""Characters of a reason, note or detail a timeline item keeps."""

ItemKind = Literal[
    "start",
    "step",
    "wait",
    "signal",
    "child",
    "suspended",
    "resumed",
    "budget",
    "cancel",
    "refusal",
    "spend",
    "end",
]
"""What a timeline item is: the run's start, a step (its attempts), a wait, a signal received,
a child run started, a suspension, a resume, a budget change, a cancel request, an approval
decision refused, a ``ctx.spend``, the run's end."""

ITEM_KINDS: tuple[ItemKind, ...] = (
    "start", "step", "wait", "signal", "child", "suspended", "resumed", "budget", "cancel",
    "refusal", "spend", "end",
)  # fmt: skip


class Attempt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One execution of a step."""

    attempt: int
    outcome: AttemptOutcome
    started_at: float
    ended_at: float | None = None
    duration: float | None = None
    error: ViewError | None = None
    retry_at: float | None = None
    writer: str = ""
    """Who appended its start (``<worker>.<n>``): a restart shows another writer."""
    usage: Usage | None = None


class Item(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One line of the timeline. Which fields are set depends on ``kind``."""

    kind: ItemKind
    at: float
    end: float | None = None
    seq: int = 0
    position: int | None = None
    name: str = ""
    step_kind: StepKind | None = None
    attempts: tuple[Attempt, ...] = ()
    usage: Usage | None = None
    """A step's usage over its attempts (tokens, cost, model)."""
    waits_for: tuple[str, ...] = ()
    deadline: float | None = None
    outcome: WaitOutcome | None = None
    signal: str | None = None
    signal_id: str | None = None
    sent_by: str | None = None
    sender_verified: bool | None = None
    child_run_id: str | None = None
    agent: str | None = None
    reason: SuspendReason | None = None
    limit: BudgetLimit | None = None
    detail: str = ""
    by: str | None = None
    status: RunStatus | None = None
    terminate: bool = False
    usd: float = 0.0
    tokens: int = 0


class Spend(msgspec.Struct, frozen=True, kw_only=True):
    """What the run (with its chain's earlier runs) used of one budget kind, and the limit in
    effect (every grant counted; ``None``: no limit)."""

    limit: BudgetLimit
    used: float
    granted: float | None = None


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /ui/api/runs/{id}/timeline``."""

    run_id: str
    agent: str
    status: RunStatus
    started_at: float
    updated_at: float
    ended_at: float | None = None
    last_seq: int = 0
    decisions: int = 0
    events: int = 0
    liveness: LivenessState | None = None
    parent_run_id: str | None = None
    previous_run_id: str | None = None
    continued_as: str | None = None
    chain_root: str | None = None
    generation: int = 1
    schedule: str | None = None
    priority: Priority = PRIORITY_DEFAULT
    fairness: Fairness | None = None
    forked_from: ev.ForkOrigin | None = None
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    waiting_on: tuple[str, ...] = ()
    deadline: float | None = None
    suspended_reason: SuspendReason | None = None
    suspended_detail: str | None = None
    cancel_requested: bool = False
    error: ViewError | None = None
    children: tuple[str, ...] = ()
    model_calls: int = 0
    tool_calls: int = 0
    spend: tuple[Spend, ...] = ()
    items: tuple[Item, ...] = ()
    omitted: int = 0


def _clip(text: str | None, limit: int = _TEXT_MAX) -> str:
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error(info: ev.ErrorInfo | None) -> ViewError | None:
    if info is None:
        return None
    return ViewError(type=_clip(info.type, 200), message=_clip(info.message, ERROR_MESSAGE_MAX))


def _plus(a: Usage | None, b: Usage | None) -> Usage | None:
    if b is None:
        return a
    if a is None:
        return b
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        usd=a.usd + b.usd,
        requests=a.requests + b.requests,
        model=b.model or a.model,
    )


def _step_kind(text: str) -> StepKind:
    return "llm" if text == LLM_STEP else "tool" if text == "tool" else "step"


def _budget_limit(text: str | None) -> BudgetLimit | None:
    return next((b for b in BUDGET_LIMITS if b == text), None)


class _Builder:
    """The items of one history, in the order their decisions were stored."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.steps: dict[int, int] = {}  # position -> index of its item
        self.waits: dict[int, int] = {}
        self.slots: dict[int, int] = {}
        """Steps waiting for a slot of a shared limit: their position -> the wait's item."""

    def add(self, item: Item) -> None:
        self.items.append(item)

    def throttled(self, e: ev.StepThrottled, seq: int) -> None:
        """A step waiting for its slot of a shared rate limit: drawn as a wait until the slot
        (its deadline), ended by the step's start."""
        on = f"limit:{_clip(e.limit, 64)}"
        self.slots[e.position] = len(self.items)
        item = Item(kind="wait", at=e.at, seq=seq, position=e.position, name=on, waits_for=(on,))
        self.add(msgspec.structs.replace(item, deadline=e.slot))

    def step_started(self, e: ev.StepStarted, seq: int, writer: str) -> None:
        slot = self.slots.pop(e.position, None)
        if slot is not None:
            self.items[slot] = msgspec.structs.replace(self.items[slot], end=e.at)
        attempt = Attempt(attempt=e.attempt, outcome="running", started_at=e.at, writer=writer)
        index = self.steps.get(e.position)
        if index is None:
            self.steps[e.position] = len(self.items)
            self.add(
                Item(
                    kind="step",
                    at=e.at,
                    seq=seq,
                    position=e.position,
                    name=_clip(e.name, 200),
                    step_kind=_step_kind(e.kind),
                    attempts=(attempt,),
                )
            )
            return
        item = self.items[index]
        earlier = tuple(
            msgspec.structs.replace(a, outcome="in_doubt") if a.outcome == "running" else a
            for a in item.attempts
        )
        self.items[index] = msgspec.structs.replace(
            item, attempts=(*earlier, attempt), end=None, seq=seq
        )

    def step_ended(self, e: ev.StepCompleted | ev.StepFailed) -> None:
        index = self.steps.get(e.position)
        if index is None:
            return  # an end without a start: an anomaly the fold reports; nothing to draw
        item = self.items[index]
        failed = isinstance(e, ev.StepFailed)
        attempts = list(item.attempts)
        for i in range(len(attempts) - 1, -1, -1):
            a = attempts[i]
            if a.attempt == e.attempt:
                attempts[i] = msgspec.structs.replace(
                    a,
                    outcome="failed" if failed else "completed",
                    ended_at=e.at,
                    duration=e.duration or max(e.at - a.started_at, 0.0),
                    error=_error(e.error) if isinstance(e, ev.StepFailed) else None,
                    retry_at=e.retry_at if isinstance(e, ev.StepFailed) else None,
                    usage=e.usage,
                )
                break
        self.items[index] = msgspec.structs.replace(
            item, attempts=tuple(attempts), end=e.at, usage=_plus(item.usage, e.usage)
        )

    def wait_started(self, e: ev.WaitStarted, seq: int) -> None:
        waits_for = tuple(_clip(s, 200) for s in (*e.signals, *e.children)) or (_clip(e.key, 200),)
        self.waits[e.position] = len(self.items)
        self.add(
            Item(
                kind="wait",
                at=e.at,
                seq=seq,
                position=e.position,
                name=_clip(e.key, 200),
                waits_for=waits_for,
                deadline=e.deadline,
            )
        )

    def wait_completed(self, e: ev.WaitCompleted, seq: int) -> None:
        index = self.waits.get(e.position)
        started = (
            Item(kind="wait", at=e.at, seq=seq, position=e.position, name=_clip(e.key, 200))
            if index is None  # resolved without parking: no WaitStarted was stored
            else self.items[index]
        )
        ended = msgspec.structs.replace(
            started,
            end=e.at,
            outcome=e.outcome,
            signal=e.signal,
            signal_id=e.signal_id,
            sent_by=e.sent_by,
            sender_verified=e.sender_verified,
        )
        if index is None:
            self.add(ended)
        else:
            self.items[index] = ended

    def event(self, e: ev.RunEvent, seq: int, writer: str) -> None:
        match e:
            case ev.RunStarted():
                by = e.trigger.sent_by
                self.add(
                    Item(kind="start", at=e.at, seq=seq, agent=e.agent, by=by, detail=_started(e))
                )
            case ev.StepStarted():
                self.step_started(e, seq, writer)
            case ev.StepCompleted() | ev.StepFailed():
                self.step_ended(e)
            case ev.StepThrottled():
                self.throttled(e, seq)
            case ev.WaitStarted():
                self.wait_started(e, seq)
            case ev.WaitCompleted():
                self.wait_completed(e, seq)
            case ev.SignalReceived():
                self.add(
                    Item(
                        kind="signal",
                        at=e.at,
                        seq=seq,
                        name=_clip(e.name, 200),
                        signal_id=_clip(e.signal_id, 200),
                        sent_by=e.sent_by,
                        sender_verified=e.sender_verified,
                    )
                )
            case ev.ChildStarted():
                self.add(
                    Item(
                        kind="child",
                        at=e.at,
                        seq=seq,
                        position=e.position,
                        child_run_id=e.child_run_id,
                        agent=e.agent,
                    )
                )
            case ev.RunSuspended():
                self.add(
                    Item(
                        kind="suspended",
                        at=e.at,
                        seq=seq,
                        reason=suspend_reason(e.reason),
                        limit=_budget_limit(e.limit),
                        detail=_clip(e.detail),
                    )
                )
            case ev.RunResumed():
                self.add(Item(kind="resumed", at=e.at, seq=seq, by=e.by, detail=_clip(e.note)))
            case ev.BudgetChanged():
                self.add(Item(kind="budget", at=e.at, seq=seq, by=e.by, detail=_limits(e.budget)))
            case ev.CancelRequested():
                self.add(
                    Item(
                        kind="cancel",
                        at=e.at,
                        seq=seq,
                        by=e.by,
                        detail=_clip(e.reason),
                        terminate=e.terminate,
                    )
                )
            case ev.ValueRecorded():
                self.value(e, seq)
            case ev.RunCompleted():
                self.add(Item(kind="end", at=e.at, seq=seq, status="completed"))
            case ev.RunFailed():
                detail = _clip(f"{e.error.type}: {e.error.message}")
                self.add(Item(kind="end", at=e.at, seq=seq, status="failed", detail=detail))
            case ev.RunCancelled():
                self.add(
                    Item(
                        kind="end",
                        at=e.at,
                        seq=seq,
                        status="cancelled",
                        detail=_clip(e.reason),
                        terminate=e.terminated,
                    )
                )
            case _:
                pass  # CancelTaken and kinds of a newer writer: the history shows them

    def value(self, e: ev.ValueRecorded, seq: int) -> None:
        """Spends and refused approval decisions; never a callback token (a credential)."""
        if e.kind == SPEND_KIND:
            spent = decode_spend(e.value)
            if spent is None:
                return
            self.add(Item(kind="spend", at=e.at, seq=seq, usd=spent.usd, tokens=spent.tokens))
        elif e.kind == "refusal":
            try:
                refused: _Refusal = from_raw(e.value, _Refusal)
            except (msgspec.ValidationError, msgspec.DecodeError):
                return
            self.add(
                Item(
                    kind="refusal",
                    at=e.at,
                    seq=seq,
                    name=_clip(refused.approval, 200),
                    by=_clip(refused.by, 128) or None,
                    detail=_clip(refused.reason),
                )
            )


class _Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of an ``ApprovalRefused`` value the timeline shows."""

    by: str = ""
    approval: str = ""
    reason: str = ""


def _started(e: ev.RunStarted) -> str:
    if e.schedule:
        return f"by schedule {e.schedule}"
    if e.previous_run_id:
        return f"continues {e.previous_run_id}"
    if e.parent_run_id:
        return f"child of {e.parent_run_id}"
    return ""


def _limits(budget: ev.Budget) -> str:
    return ", ".join(
        f"{b} {v:g}" for b in BUDGET_LIMITS if (v := getattr(budget, b, None)) is not None
    )


def _spend(state: RunState, polls: int, now: float) -> tuple[Spend, ...]:
    used: Carried = chain_spending(state, Carried(), polls)
    budget = state.budget or ev.Budget(usd=state.budget_usd, tokens=state.budget_tokens)
    counts = spent(used, state.ended_at or now)
    spend = []
    for b in BUDGET_LIMITS:
        limit = getattr(budget, b, None)
        spend.append(
            Spend(limit=b, used=counts[b], granted=None if limit is None else limit * state.grants)
        )
    return tuple(spend)


def timeline_of(
    run_id: str,
    decisions: Sequence[Decision],
    now: float,
    liveness: LivenessState | None = None,
) -> Timeline:
    """The timeline of a run's stored decisions (oldest first); ``now`` ends the wall-clock
    spend of a run that has not ended."""
    b = _Builder()
    events: list[ev.RunEvent] = []
    polls = 0
    for d in decisions:
        events.extend(d.events)
        for e in d.events:
            b.event(e, d.seq, d.writer)
            if isinstance(e, ev.WaitStarted) and e.key == "poll":
                polls += 1
    state = fold(events)
    items = b.items
    omitted = max(len(items) - ITEMS_MAX, 0)
    return Timeline(
        run_id=state.run_id or run_id,
        agent=state.agent,
        status="pending" if state.status == "new" else state.status,
        started_at=state.started_at,
        updated_at=state.updated_at,
        ended_at=state.ended_at,
        last_seq=decisions[-1].seq if decisions else 0,
        decisions=len(decisions),
        events=len(events),
        liveness=liveness,
        parent_run_id=state.parent_run_id,
        previous_run_id=state.previous_run_id,
        continued_as=state.continued_as,
        chain_root=state.chain_root,
        generation=state.generation,
        schedule=state.schedule,
        priority=state.priority,
        fairness=state.fairness,
        forked_from=state.forked_from,
        attributes=state.attributes,
        waiting_on=state.waiting_on,
        deadline=state.deadline,
        suspended_reason=state.suspended_reason,
        suspended_detail=_clip(state.suspended_detail) or None,
        cancel_requested=state.cancel_requested is not None,
        error=_error(state.error),
        children=state.children[:1000],
        model_calls=state.model_calls,
        tool_calls=state.tool_calls,
        spend=_spend(state, polls, now),
        items=tuple(items[omitted:]),
        omitted=omitted,
    )
