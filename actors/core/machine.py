"""The run machine: what a run records and does next, decided without I/O.

``Context`` (the agent's handle) asks the machine at every journaled call; the machine answers
with an *action* (return this recorded result, start attempt n, back off until t, suspend for
this reason, park on this wait, start this child, look up these children) and with the events
to record, which it queues in ``pending``. The caller performs the action and reports what
happened (the step returned or raised, a reconcile function answered, a child's outcome was
found, a park let a signal in); the machine records that and answers again. ``Activation``
is the only code that turns those actions into broker I/O.

Everything here is a plain function of the folded history, the code's calls and the times
the caller passes in: no clock, no event loop, no broker. That is what lets retries, in-doubt
policies, crash loops, waits, select, cancel, children, budgets and caps be tested
exhaustively (tests/actors/core/test_machine.py), and what ``sojourn replay`` runs, with a journal
that stops at the first operation history has not recorded.
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from sojourn.schemas.codec import decode_decision, to_raw
from sojourn.schemas.errors import (
    NondeterminismError,
    PayloadTooLarge,
    RetryableError,
    StepError,
    TerminalError,
)
from sojourn.schemas.events import (
    Budget,
    CancelTaken,
    Carried,
    ChildStarted,
    ErrorInfo,
    RunCancelled,
    RunEvent,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    Usage,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.wire import InDoubtDecision, decide_signal

from .journal import (
    PATCH_KIND,
    Execute,
    Journal,
    OpenWait,
    Recorded,
    RecordedFailure,
    RecordedWait,
)
from .retry import DEFAULT_RETRYABLE, RetryPolicy
from .state import OpRecord, RunState, SignalRecord

__all__ = [
    "ERROR_TEXT_MAX",
    "PATCH_KIND",
    "Attempt",
    "Backoff",
    "ChildStart",
    "Limits",
    "LookupChildren",
    "Machine",
    "Park",
    "Parked",
    "Raise",
    "Reconcile",
    "Return",
    "RunCancelledInterrupt",
    "Spending",
    "StepTurn",
    "Suspend",
    "WaitTurn",
    "budget_suspension",
    "child_run_id",
    "clip_text",
    "error_info",
    "format_duration",
    "retry_delay",
]

ERROR_TEXT_MAX = 4000
"""Characters of an error message (and of a traceback's tail) kept in history: a failure
recorded as data stays small, and so does the end notice of a failed child."""

_NULL = to_raw(None)


class Parked(BaseException):
    """Unwinds agent code when the run parks on a wait (not catchable by ``except Exception``).

    The run's position and wake condition are recorded; no coroutine is kept anywhere.
    """


class RunCancelledInterrupt(BaseException):
    """Unwinds agent code when a cancel was requested (not catchable by ``except Exception``)."""


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


def _open(op: OpRecord) -> bool:
    """Whether an operation history recorded is not settled: a step started and never ended
    or with a retry due, a wait still waiting."""
    if op.kind == "wait":
        return op.status == "waiting"
    if op.kind != "step":
        return False
    return op.status == "started" or (op.status == "failed" and op.deadline is not None)


def clip_text(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text``, cut to ``limit`` characters with a note saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def error_info(e: BaseException) -> ErrorInfo:
    """An exception as recorded data: its type name, message (clipped) and traceback tail."""
    return ErrorInfo(
        type=clip_text(type(e).__name__, 200),
        message=clip_text(str(e)),
        traceback="".join(traceback.format_exception(e))[-ERROR_TEXT_MAX:],
    )


def failure_text(name: str, attempts: int, err: ErrorInfo) -> str:
    """The ``StepError`` message: built from recorded data only, so replay says the same."""
    return f"step '{name}' failed after {attempts} attempt(s): {err.type}: {err.message}"


def child_run_id(parent: str, position: int) -> str:
    """``<parent>-c<position>``; hashed when that would pass the 128-character id limit (deep
    nesting), so a child id is always valid and always the same for the same parent and call."""
    plain = f"{parent}-c{position}"
    if len(plain) <= 128:
        return plain
    digest = hashlib.blake2b(parent.encode(), digest_size=12).hexdigest()
    return f"{parent[:80]}-h{digest}-c{position}"


def retry_delay(e: BaseException, policy: RetryPolicy | None, attempt: int) -> float | None:
    """Seconds until the next attempt, or ``None`` when the failure is final."""
    if isinstance(e, TerminalError):
        return None
    if isinstance(e, RetryableError):
        p = policy or DEFAULT_RETRYABLE
        if attempt >= p.attempts:
            return None
        return e.retry_after if e.retry_after is not None else p.delay(attempt)
    if policy is None or attempt >= policy.attempts or not isinstance(e, policy.retry_on):
        return None
    return policy.delay(attempt)


@dataclass(slots=True)
class Spending:
    """What live operations used, summed: the activation's share of a run's spending (what
    history recorded before it is folded in ``RunState``)."""

    usd: float = 0.0
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    """Step executions started."""
    model_calls: int = 0
    """Of those, model requests (kind ``llm``)."""

    def add(self, usage: Usage) -> None:
        self.usd += usage.usd
        self.tokens += usage.tokens
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens


def budget_suspension(unit: str, used: float, limit: float, now: float) -> RunSuspended:
    """The suspension of a run that used up its ``unit`` limit, the limit named."""
    flag = unit.replace("_", "-")
    return RunSuspended(
        reason="budget",
        detail=f"budget {unit} used up: {used:g} of {limit:g}; "
        f"`sojourn budget RUN --{flag} N` raises it and resumes the run",
        limit=unit,
        at=now,
    )


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


# --- actions: what the caller does next ---------------------------------------------------


@dataclass(slots=True)
class Return:
    """The operation has its result (recorded before, or just now): decode it and go on."""

    result: msgspec.Raw


@dataclass(slots=True)
class Raise:
    """Raise ``error`` into the agent's code (a recorded or final failure)."""

    error: BaseException


@dataclass(slots=True)
class Attempt:
    """Append ``started`` (with whatever is pending), then run the step's function."""

    position: int
    attempt: int
    in_doubt: bool
    started: StepStarted


@dataclass(slots=True)
class Backoff:
    """A retry is due at ``retry_at``: set the timer, store the failure, wait or park."""

    position: int
    retry_at: float


@dataclass(slots=True)
class Suspend:
    """Append ``event`` and park: the run waits for a human (``sojourn resume``/``decide``)."""

    event: RunSuspended
    unit: str | None = None
    """For a budget: the limit that was reached (a ``BudgetLimit``: ``usd``, ``steps``...)."""


@dataclass(slots=True)
class ChildStart:
    """Publish the child's start, then tell the machine (``child_started``)."""

    position: int
    child_id: str


@dataclass(slots=True)
class Reconcile:
    """Ask the step's reconcile function whether its in-doubt attempt did the work."""

    position: int
    key: str


@dataclass(slots=True)
class Park:
    """Set the wait's timer (if ``deadline``), append ``event`` (if any), then ask again."""

    position: int
    deadline: float | None
    event: WaitStarted | None


@dataclass(slots=True)
class LookupChildren:
    """Read these children's histories: one may have ended without its notice reaching us."""

    children: tuple[str, ...]


StepAction = Return | Raise | Attempt | Backoff | Suspend | Reconcile
WaitAction = Park | LookupChildren
InDoubtPolicy = Literal["retry", "ask", "reconcile"]


# --- the machine -----------------------------------------------------------------------------


@dataclass(slots=True)
class Machine:
    """One activation's decisions, from the folded history onwards.

    ``state`` is the history as folded when the activation began plus what other parties
    appended since (cancel requests, signals: the driver folds them in when it rebases); the
    machine's own events go to ``pending`` until the driver stores them.
    """

    state: RunState
    run_id: str = ""
    """The run's id (``state.run_id`` when not given)."""
    limits: Limits = field(default_factory=Limits)
    stop_at_frontier: bool = False
    """Replay only: raise ``ReplayFrontier`` at the first operation history lacks."""
    on_record: Callable[[], None] | None = None
    """Called after events are queued (the driver arms its flush timer)."""
    journal: Journal = field(init=False)
    pending: list[RunEvent] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)
    """Ids of buffered signals taken by waits in this activation."""
    children: list[str] = field(default_factory=list)
    """Children started in this activation."""
    polls: int = 0
    live: Spending = field(default_factory=lambda: Spending())
    """What this activation's live operations spent (history's is in ``state``)."""
    nondeterminism: NondeterminismError | None = None
    fatal: PayloadTooLarge | None = None
    patches: dict[str, bool] = field(default_factory=dict)
    compensating: bool = False
    """The agent's code was stopped for a cancel and its compensation runs."""
    expired: str | None = None
    """Why the run is past its lifetime (``expire``), once it is."""
    stopped: tuple[int, int] | None = None
    """Where a cancel stopped the code live: (the position it stopped at, the position the
    compensation starts at)."""

    def __post_init__(self) -> None:
        self.run_id = self.run_id or self.state.run_id
        self.journal = Journal(self.state, stop_at_frontier=self.stop_at_frontier)

    @property
    def replaying(self) -> bool:
        return self.journal.replaying

    def record(self, *events: RunEvent) -> None:
        self.pending.extend(events)
        if self.on_record is not None:
            self.on_record()

    def check(self) -> None:
        """Before every journaled operation: stop if the run cannot go on."""
        if self.fatal is not None:
            raise self.fatal
        if self.cancel_due():
            self._stop(self.journal.position)
            raise RunCancelledInterrupt()

    # --- cancel, compensation, lifetime ------------------------------------------------------

    def cancel_reason(self) -> str | None:
        """Why the run is to end cancelled (a cancel request, or its lifetime), or ``None``."""
        s = self.state
        if s.cancel_requested is not None:
            return s.cancel_requested
        if s.cancel_taken is not None:
            return s.cancel_taken.reason
        return self.expired

    def cancel_due(self) -> bool:
        """Whether the code must stop before its next operation: a cancel (or the lifetime)
        ends the agent's code, a terminate also its compensation.

        The code of an agent with a compensation is stopped where the cancel was taken live
        (the recorded ``CancelTaken``, else the first operation history has not settled), so
        that a replay hands the compensation the same positions; any other run stops at once.
        """
        if self.compensating:
            return self.state.terminate_requested
        if self.cancel_reason() is None:
            return False
        if self.limits.compensates and not self.state.terminate_requested:
            return self.journal.position >= self._frontier()
        return True

    def _frontier(self) -> int:
        taken = self.state.cancel_taken
        if taken is not None:
            return taken.stopped_at
        ops = self.state.ops
        if ops and _open(ops[-1]):
            return len(ops) - 1
        return len(ops)

    def _stop(self, position: int, compensate_at: int | None = None) -> None:
        """The code stops at ``position`` (the first stop counts; a replay's is recorded)."""
        if self.stopped is not None:
            return
        taken = self.state.cancel_taken
        if taken is not None:
            self.stopped = (taken.stopped_at, taken.compensate_at)
            return
        if compensate_at is None:  # history holds an (open) operation here: after it
            compensate_at = position + 1 if position < len(self.state.ops) else position
        self.stopped = (position, compensate_at)

    def start_dropped(self, started: StepStarted) -> None:
        """A cancel came in as this step was to start: its start was not stored. The
        compensation takes its position, unless an earlier attempt is recorded there."""
        p = started.position
        self._stop(p, p + 1 if started.attempt > 1 else p)

    def take_cancel(self, now: float) -> bool:
        """The agent's code was stopped for a cancel: ``True`` if its compensation is to run
        now (recorded as ``CancelTaken``, or replayed from it), ``False`` if the run ends at
        once (no compensation, a terminate, or the compensation itself was stopped)."""
        if not self.limits.compensates or self.compensating or self.state.terminate_requested:
            return False
        taken = self.state.cancel_taken
        if taken is None:
            stop, at = self.stopped or (self.journal.position, self.journal.position)
            ops = self.state.ops
            if stop < len(ops) and ops[stop].kind == "step" and ops[stop].status == "started":
                # An attempt left in doubt by a worker that died: it is not run again.
                rec = ops[stop]
                self.record(
                    StepFailed(
                        position=stop,
                        name=rec.name,
                        attempt=rec.attempts,
                        error=ErrorInfo(
                            type="Cancelled",
                            message="the run was cancelled while this attempt was in doubt "
                            "(its worker stopped): it is not run again",
                        ),
                        at=now,
                    )
                )
            reason = self.cancel_reason() or ""
            self.record(CancelTaken(reason=reason, stopped_at=stop, compensate_at=at, at=now))
        else:
            at = taken.compensate_at
        self.journal.position = at
        self.compensating = True
        return True

    def cancelled(self, now: float, error: ErrorInfo | None = None) -> RunCancelled:
        """The run's end for a cancel: terminated, or cancelled (with what its compensation
        raised, if it did)."""
        reason = self.cancel_reason() or ""
        if self.state.terminate_requested:
            said = "" if reason in ("", "cancelled") else f": {reason}"
            return RunCancelled(reason=f"terminated{said}", terminated=True, at=now)
        return RunCancelled(reason=reason, compensation_error=error, at=now)

    def lifetime_ends(self) -> float | None:
        """When the run's lifetime ends (wall clock), or ``None`` without one."""
        life = self.limits.lifetime
        if life is None or not self.state.started_at:
            return None
        return self.state.started_at + life

    def expire(self, now: float) -> bool:
        """Whether the run is past its lifetime at ``now`` (then it is cancelled, reason
        naming the lifetime, at its next operation)."""
        if self.expired is None:
            ends = self.lifetime_ends()
            if ends is not None and now >= ends:
                life = self.limits.lifetime or 0.0
                self.expired = f"lifetime of {format_duration(life)} exceeded"
        return self.expired is not None

    def _diverged(self, e: NondeterminismError) -> None:
        """Keep the first divergence, even if the agent's code catches the exception."""
        if self.nondeterminism is None:
            self.nondeterminism = e

    def oversized(self, raw: bytes, what: str) -> PayloadTooLarge | None:
        """The error to record if ``raw`` is too large to store, else ``None``."""
        limit = self.limits.max_value
        if len(raw) <= limit:
            return None
        return PayloadTooLarge(
            f"{what} is {len(raw)} bytes; the limit for one stored value is {limit} bytes "
            f"({self.limits.max_value_why}): store large data elsewhere and pass a reference",
            run_id=self.run_id,
        )

    # --- steps ------------------------------------------------------------------------------

    def step(
        self,
        name: str,
        in_doubt: InDoubtPolicy,
        retry: RetryPolicy | None,
        kind: str = "step",
    ) -> Return | StepTurn:
        """A step call: its recorded result, or a turn that decides how to run it.

        Raises:
            StepError: history recorded the step as failed for good.
            NondeterminismError: history recorded another operation here.
        """
        self.check()
        try:
            plan = self.journal.step(name)
        except NondeterminismError as e:
            self._diverged(e)
            raise
        if isinstance(plan, Recorded):
            return Return(plan.result)
        if isinstance(plan, RecordedFailure):
            raise StepError(
                failure_text(name, plan.attempts, plan.error),
                error_type=plan.error.type,
                run_id=self.run_id,
                step=name,
            )
        return StepTurn(self, name, plan, in_doubt, retry or self.limits.retry, kind)

    def decision(self, position: int, attempt: int) -> InDoubtDecision | None:
        """An operator's decision about attempt ``attempt`` of the in-doubt step at
        ``position`` (signal ``sojourn-decide.<position>.<attempt>``: a later attempt in
        doubt asks again). A malformed one counts as none."""
        name = decide_signal(position, attempt)
        for rec in reversed(self.state.signals):
            if rec.name == name:
                try:
                    return decode_decision(bytes(rec.payload))
                except msgspec.MsgspecError:
                    return None
        return None

    # --- values, patches, spend and caps -------------------------------------------------------

    def value(self, kind: str, make: Callable[[], Any], now: float) -> Return:
        """``ctx.now()`` and the like: the recorded value, or ``make()`` recorded now.

        Raises:
            PayloadTooLarge: the value is too large to store (the run then fails with it).
        """
        self.check()
        try:
            plan = self.journal.value(kind)
        except NondeterminismError as e:
            self._diverged(e)
            raise
        if isinstance(plan, Recorded):
            return Return(plan.result)
        raw = to_raw(make())
        too_big = self.oversized(raw, f"the value of ctx.{kind}()")
        if too_big is not None:
            if self.fatal is None:
                self.fatal = too_big
            raise too_big
        self.record(ValueRecorded(position=plan.position, kind=kind, value=raw, at=now))
        return Return(raw)

    def patched(self, change_id: str, now: float) -> bool:
        """Whether this run takes the new branch of change ``change_id``: yes for code that
        reaches the change live (a marker is recorded), no for a run whose history went
        through that point before the change (nothing recorded there). The answer is the same
        for every call with the same id in one run, and the same on every replay."""
        self.check()
        known = self.patches.get(change_id)
        if known is not None:
            return known
        try:
            found = self.journal.patch(change_id)
        except NondeterminismError as e:
            self._diverged(e)
            raise
        if isinstance(found, Execute):
            self.record(
                ValueRecorded(
                    position=found.position, kind=PATCH_KIND, value=to_raw(change_id), at=now
                )
            )
        taken = found is not None
        self.patches[change_id] = taken
        return taken

    def deprecate_patch(self, change_id: str) -> None:
        """Code that only keeps the new branch of ``change_id``: step over the marker that runs
        started under ``patched`` have, record nothing for new runs."""
        self.check()
        self.journal.skip_patch(change_id)
        self.patches[change_id] = True

    def count_poll(self, what: str, now: float) -> Suspend | None:
        """One more ``ctx.poll`` check: past the run's allowance, suspend it (reason ``cap``)."""
        self.polls += 1
        if self.replaying:
            return None
        budget = self.budget()
        if budget is not None and budget.polls is not None:
            allowed = budget.polls * (1 + self.state.budget_resumes)
            polls = self.polls + (self.state.carried or Carried()).polls
            if polls > allowed:
                return Suspend(budget_suspension("polls", polls - 1, allowed, now), unit="polls")
        cap = self.limits.poll_cap
        allowance = cap * (1 + self.state.cap_resumes)
        if self.polls > allowance:
            return Suspend(
                RunSuspended(
                    reason="cap",
                    detail=f"poll cap of {cap} checks reached (polling {what}); "
                    f"`sojourn resume RUN` allows another {cap}",
                    at=now,
                )
            )
        return None

    def spend(self, usd: float, tokens: int, now: float) -> tuple[bool, Suspend | None]:
        """Record spending (journaled as a ``spend`` value). Returns whether it was live (not
        replayed), and the suspension due when the total reaches the run's budget."""
        live = not self.replaying
        self.value("spend", lambda: {"usd": usd, "tokens": tokens}, now)
        if not live:
            return live, None
        self.live.usd += usd
        self.live.tokens += tokens
        return live, self.over_budget(now)

    def charged(self, usage: Usage | None) -> None:
        """A live step attempt ended having charged ``usage``: count it."""
        if usage is not None:
            self.live.add(usage)

    def chain_spending(self) -> Carried:
        """What the run used (history, this activation's live steps) plus what its chain's
        earlier runs used: the run's budget holds it, and a continued run carries it on."""
        s, live = self.state, self.live
        c = s.carried or Carried()
        return Carried(
            usd=c.usd + s.spent_usd + live.usd,
            tokens=c.tokens + s.spent_tokens + live.tokens,
            input_tokens=c.input_tokens + s.spent_input_tokens + live.input_tokens,
            output_tokens=c.output_tokens + s.spent_output_tokens + live.output_tokens,
            steps=c.steps + s.step_attempts + live.steps,
            model_calls=c.model_calls + s.model_calls + live.model_calls,
            polls=c.polls + self.polls,
            started_at=c.started_at or s.started_at,
        )

    def budget(self) -> Budget | None:
        """The run's budget in effect: its own as recorded, else its agent's."""
        return self.state.budget or self.limits.budget

    def over_budget(self, now: float, kind: str | None = None) -> Suspend | None:
        """The suspension due now if the run has used up a limit of its budget, checked before
        a step of ``kind`` (``None``: after spending) and after every ``ctx.spend``.

        A limit is used up when what the run used reaches it (each resume of a ``budget``
        suspension grants the whole budget again). ``steps`` and ``tool_calls`` are counted
        before the execution they would allow: at 3 of 3 steps, the fourth does not start.
        """
        budget = self.budget()
        if budget is None:
            return None
        c = self.chain_spending()
        used: dict[str, float] = {
            "usd": c.usd,
            "tokens": c.tokens,
            "input_tokens": c.input_tokens,
            "output_tokens": c.output_tokens,
            "wall_seconds": now - c.started_at if c.started_at else 0.0,
        }
        if kind is not None:
            used["steps"] = c.steps
            if kind != "llm":
                used["tool_calls"] = c.steps - c.model_calls
        grants = 1 + self.state.budget_resumes
        for unit, spent in used.items():
            limit = getattr(budget, unit)
            if limit is not None and spent >= limit * grants:
                return Suspend(budget_suspension(unit, spent, limit * grants, now), unit=unit)
        return None

    # --- waits and children ------------------------------------------------------------------

    def wait(
        self,
        key: str,
        *,
        signals: tuple[str, ...] = (),
        deadline: Callable[[], float | None] = lambda: None,
        children: tuple[str, ...] = (),
    ) -> RecordedWait | WaitTurn | None:
        """A wait: how it ended (``None``: it timed out), or a turn that decides it now.

        ``deadline`` is asked only for a wait history has not recorded (a recorded one keeps
        its deadline).
        """
        self.check()
        try:
            plan = self.journal.wait(key)
        except NondeterminismError as e:
            self._diverged(e)
            raise
        if isinstance(plan, RecordedWait):
            return None if plan.outcome == "timeout" else plan
        assert isinstance(plan, OpenWait)
        due = plan.recorded.deadline if plan.recorded is not None else deadline()
        return WaitTurn(self, plan.position, key, signals, due, children, plan.recorded is None)

    def find_signal(self, names: tuple[str, ...]) -> SignalRecord | None:
        for rec in self.state.signals:
            if rec.name in names and rec.signal_id not in self.consumed:
                return rec
        return None

    def child(self, agent: str) -> Return | ChildStart:
        """A child start: its recorded run id, or the child to start now."""
        self.check()
        try:
            plan = self.journal.child(agent)
        except NondeterminismError as e:
            self._diverged(e)
            raise
        if isinstance(plan, Recorded):
            return Return(plan.result)
        return ChildStart(plan.position, child_run_id(self.run_id, plan.position))

    def child_started(self, start: ChildStart, agent: str, now: float) -> None:
        """The child's start was published: record it."""
        self.children.append(start.child_id)
        self.record(
            ChildStarted(position=start.position, child_run_id=start.child_id, agent=agent, at=now)
        )


class StepTurn:
    """How one step call is carried out: attempts, backoffs, in-doubt settlement."""

    __slots__ = ("_done", "_in_doubt", "_m", "_settled", "kind", "name", "plan", "policy")

    def __init__(
        self,
        machine: Machine,
        name: str,
        plan: Execute,
        in_doubt: InDoubtPolicy,
        policy: RetryPolicy | None,
        kind: str = "step",
    ) -> None:
        self._m = machine
        self.kind = kind
        self.name = name
        self.plan = plan
        self.policy = policy
        self._in_doubt = in_doubt
        self._settled = False  # the in-doubt policy of this plan has been applied
        self._done: Return | Raise | None = None

    @property
    def key(self) -> str:
        """The step's idempotency key: the same on every attempt, worker and restart."""
        return f"{self._m.run_id}/{self.plan.position}"

    @property
    def crash_loop(self) -> bool:
        limit = self._m.limits.crash_loop_limit
        return self.plan.in_doubt and 0 < limit <= self.plan.interrupted

    def next(self, now: float) -> StepAction:
        """What to do now: run an attempt, wait for a retry, settle an in-doubt attempt."""
        if self._done is not None:
            return self._done
        plan = self.plan
        if plan.retry_at is not None and plan.retry_at > now:
            self.plan = Execute(position=plan.position, attempt=plan.attempt, in_doubt=False)
            return Backoff(plan.position, plan.retry_at)
        if plan.in_doubt and not self._settled:
            self._settled = True
            settle = self._settle(now)
            if settle is not None:
                return settle
        over = self._m.over_budget(now, self.kind)
        if over is not None:
            return over
        m = self._m
        m.live.steps += 1
        m.live.model_calls += self.kind == "llm"
        started = StepStarted(
            position=plan.position, name=self.name, attempt=plan.attempt, kind=self.kind, at=now
        )
        return Attempt(plan.position, plan.attempt, plan.in_doubt, started)

    def _settle(self, now: float) -> StepAction | None:
        """Apply the in-doubt policy; ``None`` means run the step again.

        A step cut off ``crash_loop_limit`` times in a row is probably what kills its worker (a
        segfault, running out of memory): running it again would take down worker after
        worker. Whatever its policy, it then waits for a human, like ``in_doubt="ask"``.
        """
        m, plan = self._m, self.plan
        policy = "ask" if self.crash_loop else self._in_doubt
        if policy == "retry":
            return None
        if policy == "reconcile":
            return Reconcile(plan.position, self.key)
        decision = m.decision(plan.position, plan.attempt - 1)
        if decision is None:
            decide = (
                f"decide with `sojourn decide {m.run_id} {plan.position} "
                "retry|skip|fail [--result JSON]`"
            )
            where = f"step '{self.name}' at position {plan.position} (key {self.key})"
            if self.crash_loop:
                return Suspend(
                    RunSuspended(
                        reason="crash_loop",
                        detail=f"{where} was cut off {plan.interrupted} times in a row: it may "
                        "be what kills its worker; " + decide,
                        at=now,
                    )
                )
            return Suspend(
                RunSuspended(
                    reason="in_doubt",
                    detail=f"{where} started but its end was never recorded; " + decide,
                    at=now,
                )
            )
        if decision.action == "retry":
            return None
        if decision.action == "skip":
            return self._without_running(decision.result, now)
        err = ErrorInfo(
            type="InDoubtFailed", message=f"failed by decision of {decision.by or 'an operator'}"
        )
        return self._fail_in_doubt(err, now)

    def reconciled(self, found: msgspec.Raw | None, now: float) -> None:
        """The reconcile function's answer: the result the earlier attempt produced, or
        ``None`` (it did not do the work: run the step again)."""
        if found is not None:
            self._done = self._without_running(found, now)

    def _without_running(self, raw: msgspec.Raw, now: float) -> Return | Raise:
        """Settle an in-doubt step with a known result: its earlier attempt did the work."""
        too_big = self._m.oversized(raw, f"the result of step '{self.name}'")
        if too_big is not None:
            return self._fail_in_doubt(error_info(too_big), now, cause=too_big)
        plan = self.plan
        self._m.record(
            StepCompleted(
                position=plan.position, name=self.name, attempt=plan.attempt - 1, result=raw, at=now
            )
        )
        self._done = Return(raw)
        return self._done

    def _fail_in_doubt(
        self, err: ErrorInfo, now: float, cause: BaseException | None = None
    ) -> Raise:
        """Record the earlier, in-doubt attempt as failed with ``err``."""
        plan = self.plan
        self._m.record(
            StepFailed(
                position=plan.position, name=self.name, attempt=plan.attempt - 1, error=err, at=now
            )
        )
        error = StepError(
            failure_text(self.name, plan.attempt - 1, err),
            error_type=err.type,
            run_id=self._m.run_id,
            step=self.name,
        )
        error.__cause__ = cause
        self._done = Raise(error)
        return self._done

    def returned(
        self, raw: msgspec.Raw, duration: float, now: float, usage: Usage | None = None
    ) -> Return | Raise:
        """The attempt returned ``raw`` having charged ``usage``: record it (a result too
        large to store fails the step for good: another attempt would most likely return the
        same)."""
        self._m.charged(usage)
        too_big = self._m.oversized(raw, f"the result of step '{self.name}'")
        if too_big is not None:
            outcome = self._failed(too_big, None, duration, now, usage)
            assert outcome is not None
            return outcome
        plan = self.plan
        self._m.record(
            StepCompleted(
                position=plan.position,
                name=self.name,
                attempt=plan.attempt,
                result=raw,
                duration=duration,
                usage=usage,
                at=now,
            )
        )
        self._done = Return(raw)
        return self._done

    def interrupted(self, error: ErrorInfo, duration: float, now: float) -> None:
        """The attempt was interrupted by a cancel (cancelled, or abandoned in its thread):
        recorded as failed, never retried; the code stops here (``RunCancelledInterrupt``)."""
        plan = self.plan
        self._m.record(
            StepFailed(
                position=plan.position,
                name=self.name,
                attempt=plan.attempt,
                error=error,
                duration=duration,
                at=now,
            )
        )
        m = self._m
        m._stop(plan.position, max(plan.position + 1, m.journal.position))

    def raised(
        self, e: BaseException, duration: float, now: float, usage: Usage | None = None
    ) -> Raise | None:
        """The attempt raised ``e`` having charged ``usage``: record the failure; ``None``
        means a retry is due (ask ``next`` again), else the ``StepError`` for the code."""
        self._m.charged(usage)
        delay = retry_delay(e, self.policy, self.plan.attempt)
        return self._failed(e, delay, duration, now, usage)

    def _failed(
        self,
        e: BaseException,
        delay: float | None,
        duration: float,
        now: float,
        usage: Usage | None = None,
    ) -> Raise | None:
        plan = self.plan
        err = error_info(e)
        retry_at = None if delay is None else now + delay
        self._m.record(
            StepFailed(
                position=plan.position,
                name=self.name,
                attempt=plan.attempt,
                error=err,
                duration=duration,
                retry_at=retry_at,
                usage=usage,
                at=now,
            )
        )
        if retry_at is not None:
            self.plan = Execute(
                position=plan.position, attempt=plan.attempt + 1, in_doubt=False, retry_at=retry_at
            )
            return None
        error = StepError(
            failure_text(self.name, plan.attempt, err),
            error_type=err.type,
            run_id=self._m.run_id,
            step=self.name,
        )
        error.__cause__ = e
        self._done = Raise(error)
        return self._done


class WaitTurn:
    """How one open wait is decided: a buffered signal, a passed deadline, an ended child, or
    parking (recording the wait once, and looking again if a signal came in meanwhile)."""

    __slots__ = ("_m", "_record", "children", "deadline", "key", "position", "signals")

    def __init__(
        self,
        machine: Machine,
        position: int,
        key: str,
        signals: tuple[str, ...],
        deadline: float | None,
        children: tuple[str, ...],
        record: bool,
    ) -> None:
        self._m = machine
        self.position = position
        self.key = key
        self.signals = signals
        self.deadline = deadline
        self.children = children
        self._record = record  # the WaitStarted is still to be recorded

    def next(self, now: float, *, looked: bool = False) -> RecordedWait | WaitAction | None:
        """How the wait ends now (a ``RecordedWait``, or ``None`` for a timeout), or what to
        do: look up the children (unless ``looked``), or park.

        A signal taken here also wants the wait's timer cancelled: the caller does that when
        ``deadline`` is set and the outcome is a signal.
        """
        m, p = self._m, self.position
        sig = m.find_signal(self.signals)
        if sig is not None:
            m.consumed.add(sig.signal_id)
            m.record(
                WaitCompleted(
                    position=p,
                    key=self.key,
                    outcome="signal",
                    payload=sig.payload,
                    signal=sig.name,
                    signal_id=sig.signal_id,
                    sent_by=sig.sent_by,
                    sender_verified=sig.sender_verified,
                    at=now,
                )
            )
            return RecordedWait(
                position=p,
                outcome="signal",
                payload=sig.payload,
                signal=sig.name,
                sent_by=sig.sent_by,
                sender_verified=sig.sender_verified,
            )
        if self.deadline is not None and now >= self.deadline:
            m.record(
                WaitCompleted(position=p, key=self.key, outcome="timeout", payload=_NULL, at=now)
            )
            return None
        if self.children and not looked:
            return LookupChildren(self.children)
        event = None
        if self._record:
            self._record = False
            event = WaitStarted(
                position=p,
                key=self.key,
                signals=self.signals,
                deadline=self.deadline,
                children=self.children,
                at=now,
            )
        return Park(p, self.deadline, event)

    def child_ended(self, outcome_raw: msgspec.Raw, status: str, now: float) -> RecordedWait:
        """A child's history says it ended (its notice never reached us): record that."""
        self._m.record(
            WaitCompleted(
                position=self.position,
                key=self.key,
                outcome="child",
                payload=outcome_raw,
                child_status=status,
                at=now,
            )
        )
        return RecordedWait(
            position=self.position, outcome="child", payload=outcome_raw, signal=None
        )

    def signal_waiting(self) -> bool:
        """After parking: did a matching signal come in while the wait was being recorded?"""
        return self._m.find_signal(self.signals) is not None
