"""The events a run's history is made of.

Rules (docs/decisions/0001-events-and-schema-evolution.md): tags are explicit, stable and
versioned; a new field gets a default; a field never changes type; an event that ships is
decodable forever (tests/schemas/golden_events.jsonl holds samples of every tag). Events are
open-world: unknown fields are ignored, so an older worker can read a newer worker's history.

Payloads chosen by users (run input and output, step results, recorded values) are kept as raw
JSON (``msgspec.Raw``) so that history is decoded without knowing user types; the actor layer
converts them with the agent's annotations.
"""

from __future__ import annotations

import msgspec

from .fairness import Fairness
from .priority import PRIORITY_DEFAULT, Priority
from .vocabulary import WaitOutcome

__all__ = [
    "Budget",
    "BudgetChanged",
    "CancelRequested",
    "CancelTaken",
    "Carried",
    "ChildStarted",
    "ConcurrencyInfo",
    "ErrorInfo",
    "Event",
    "ForkOrigin",
    "HistoryEntry",
    "PauseLifted",
    "PauseRequested",
    "RunAdmitted",
    "RunCancelled",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunResumed",
    "RunStarted",
    "RunSuspended",
    "SignalReceived",
    "SpendValue",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "StepThrottled",
    "TriggerInfo",
    "UpdateCompleted",
    "UpdateRejected",
    "UpdateRequested",
    "Usage",
    "ValueRecorded",
    "ValueRef",
    "WaitCompleted",
    "WaitStarted",
]


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An exception recorded as data: never pickled, identical on replay."""

    type: str
    message: str
    traceback: str | None = None


class TriggerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run came from: the inbox message that started it (for idempotent intake)."""

    inbox_seq: int = 0
    msg_id: str | None = None
    received_at: float = 0.0
    sent_by: str | None = None
    """Who started the run: the ``as.<sender>`` token of the start's subject, as for signals
    (``SignalReceived.sent_by``): under authentication the broker's user, or a caller an HTTP
    gateway speaks for; a child run's, its parent's worker; ``None`` for an anonymous start,
    a schedule's fire or a continued run."""


BUDGET_LIMIT_MAX = 1e15
"""The largest value of any one budget limit: beyond any real budget, small enough that sums of
spending stay exact integers in a float."""


class Budget(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one run may use before it is suspended (reason ``budget``, the limit named).

    Every limit is optional; a run without any is unbounded. Set per agent
    (``@agent(budget=Budget(...))``), per run at start (``Client.start(..., budget=...)``, the
    start body's ``budget``: each limit given replaces the agent's), and raised while the run
    lives (``sojourn budget RUN --usd 5``: a ``BudgetChanged``). Checked before every step and
    model call; what a step charged is counted when it ends.
    """

    usd: float | None = None
    """Money: what model requests cost (``ctx.llm``, a price table) plus ``ctx.spend``."""
    tokens: int | None = None
    """Input plus output tokens of model requests, plus ``ctx.spend(tokens=...)``."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    steps: int | None = None
    """Step executions of any kind (attempts: a retried step counts each try)."""
    tool_calls: int | None = None
    """Step executions that are not model requests (kind ``step`` or ``tool``)."""
    polls: int | None = None
    """``ctx.poll`` checks (the agent's ``poll_cap`` when not given)."""
    wall_seconds: float | None = None
    """Seconds since the run started, parked time included."""

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if not (0 < value <= BUDGET_LIMIT_MAX):  # also refuses NaN
                raise ValueError(
                    f"budget {name} must be > 0 and <= {BUDGET_LIMIT_MAX:g}, not {value!r}"
                )

    def over(self, other: Budget | None) -> Budget:
        """This budget with every limit ``other`` sets replacing ours."""
        if other is None:
            return self
        mine = msgspec.structs.asdict(self)
        mine.update({k: v for k, v in msgspec.structs.asdict(other).items() if v is not None})
        return Budget(**mine)

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in self.__struct_fields__)


class Usage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one step attempt used, as it charged it (``current_step().charge``; ``ctx.llm``
    charges each model request): recorded in its ``StepCompleted``/``StepFailed`` and counted
    against the run's budget (a failed model request may cost money too)."""

    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    requests: int = 0
    """Model requests made."""
    model: str | None = None
    """The model that answered (the last one, if several)."""

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "usd", "requests"):
            value = getattr(self, name)
            if not (0 <= value <= BUDGET_LIMIT_MAX):
                raise ValueError(f"usage {name} must be >= 0 and finite, not {value!r}")
        if self.model is not None and len(self.model) > 200:
            raise ValueError("usage model names are at most 200 characters")

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            usd=self.usd + other.usd,
            requests=self.requests + other.requests,
            model=other.model or self.model,
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ValueRef(msgspec.Struct, frozen=True, kw_only=True):
    """A large value kept in the values bucket instead of inline (``Settings.value_inline_max``).

    The value's JSON is the concatenation of the pieces named by ``parts`` (SHA-256 hex of
    each piece), in order; with ``depth`` 1 that concatenation is itself a JSON array of the
    leaf pieces' digests (a value of many pieces keeps its reference small). ``sha256`` and
    ``size`` are the whole value's: a reader checks every piece and the whole against them.
    Pieces are content-addressed and shared by every value (and run) that holds them: a value
    that grows a little from step to step stores only its new pieces. See
    ``sojourn.actors.history.values``.
    """

    sha256: str
    size: int
    parts: tuple[str, ...]
    depth: int = 0


class Carried(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the earlier runs of a continue-as-new chain used, handed to the next run in its
    ``RunStarted``: a chain is held to one budget, not one per run."""

    usd: float = 0.0
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    model_calls: int = 0
    polls: int = 0
    started_at: float = 0.0
    """When the chain's first run started (``wall_seconds`` counts from there)."""


class ForkOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """Where a forked run comes from (``sojourn fork``, decision 0041): the run it was forked
    from and the position it re-executes from. Its history holds that run's decisions of
    every position before ``position``, copied (``copied`` events) after its ``RunStarted``."""

    run_id: str
    position: int
    copied: int = 0


class ConcurrencyInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``RunStarted.concurrency``: the run counts against ``limit`` live runs of its agent under
    ``key`` (decision 0048, ``sojourn.schemas.concurrency``). ``ticket`` 0: it took a slot at
    its start; else it was queued (``ticket`` is its queue entry's sequence, its place in the
    queue) and waits (``waiting_on`` ``queue:<key>``) until ``RunAdmitted``. The next run of a
    continue-as-new chain inherits the slot (``ticket`` 0)."""

    key: str
    limit: int
    ticket: int = 0


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every run event. ``at`` is the writer's wall clock (unix seconds)."""

    at: float = 0.0


class RunStarted(Event, tag="run.started.v1", frozen=True, kw_only=True):
    run_id: str
    agent: str
    input: msgspec.Raw
    code_version: str | None = None
    trigger: TriggerInfo = TriggerInfo()
    parent_run_id: str | None = None
    budget_usd: float | None = None
    """The agent's budget when the run started (``Agent(budget_usd=...)``), for read models:
    the code in effect decides, this records what it said."""
    budget_tokens: int | None = None
    budget: Budget | None = None
    """The run's budget in effect at its start: the agent's, with the limits the start asked
    for replacing its own. What the run machine enforces (``BudgetChanged`` replaces it)."""
    carried: Carried | None = None
    """For a run that continues a chain: what the chain's earlier runs used."""
    previous_run_id: str | None = None
    """Set on a run started by ``ctx.continue_as_new``: the run it continues."""
    chain_root: str | None = None
    """The first run of its continue-as-new chain (set with ``previous_run_id``): the id its
    parent, its handles and its signals know the whole chain by."""
    generation: int = 1
    """1 for a run started by a trigger; n + 1 for the run generation n continued as."""
    input_ref: ValueRef | None = None
    """``input`` is ``null`` and the value is in the values bucket (a large value)."""
    schedule: str | None = None
    """Set on a run a schedule started: the schedule's name (``ctx.schedule``)."""
    scheduled_at: float | None = None
    """With ``schedule``: the fire time that started the run, nominal (Unix seconds; the run
    id derives from it), ``ctx.scheduled_at``. For ``trigger``, when it was asked for."""
    traceparent: str | None = None
    """The W3C trace context the start carried (its ``traceparent`` header: a NATS header, the
    gateway's HTTP header, ``Client.start(traceparent=...)`` or the caller's current
    OpenTelemetry span), well formed or not recorded (``sojourn.schemas.tracing``): the run's
    span is its child, in the caller's trace, on every activation. ``None``: the run's trace
    is its own (its id derived from the run id). A child run's is its parent's child span."""
    tracestate: str | None = None
    """The start's W3C ``tracestate``, kept with ``traceparent``."""
    attributes: dict[str, str | int | float | bool] | None = None
    """The run's search attributes as its start gave them (``sojourn.schemas.attributes``);
    ``ctx.set_attributes`` upserts them later (a ``ValueRecorded`` of kind ``attributes``)."""
    forked_from: ForkOrigin | None = None
    """Set on a fork (``sojourn fork``): the run and position it was forked from."""
    concurrency: ConcurrencyInfo | None = None
    """Set on a run started under a concurrency key (decision 0048): queued at its start when
    its ``ticket`` is set."""
    priority: Priority = PRIORITY_DEFAULT
    """The lane its start came on, 1 (most urgent) to 5 (decision 0049): its wakes, timers and
    children travel on the same lane for the rest of its life."""
    fairness: Fairness | None = None
    """The fairness key and weight its start carried (decision 0049), carried by its wakes:
    a worker shares its slots between keys in weighted round-robin. ``None``: the default key."""


class BudgetChanged(Event, tag="run.budget_changed.v1", frozen=True, kw_only=True):
    """Written by the intake (``sojourn budget RUN --usd 5``): the limits given replace the
    run's own. A run suspended for its budget is resumed in the same decision."""

    budget: Budget
    by: str | None = None


class PauseRequested(Event, tag="run.pause_requested.v1", frozen=True, kw_only=True):
    """Written by the intake (``sojourn pause RUN``): an operator holds the run. It goes on to
    its next step (a step in flight finishes and is recorded; a wait keeps its timer), and
    there suspends itself (``RunSuspended``, reason ``manual``) until ``sojourn unpause``."""

    by: str | None = None
    reason: str = ""


class PauseLifted(Event, tag="run.pause_lifted.v1", frozen=True, kw_only=True):
    """Written by the intake (``sojourn unpause RUN``): the pause is over. A run it had already
    suspended is resumed in the same decision (``RunResumed``)."""

    by: str | None = None


class RunCompleted(Event, tag="run.completed.v1", frozen=True, kw_only=True):
    output: msgspec.Raw
    continued_as: str | None = None
    """The run ended by ``ctx.continue_as_new``: the id of the run that carries on (``output``
    is ``null``). Its chain's outcome is the outcome of the chain's last run."""
    output_ref: ValueRef | None = None
    """``output`` is ``null`` and the value is in the values bucket (a large value)."""


class RunFailed(Event, tag="run.failed.v1", frozen=True, kw_only=True):
    error: ErrorInfo


class CancelRequested(Event, tag="run.cancel_requested.v1", frozen=True, kw_only=True):
    """Written by the intake; the run's owner turns it into ``RunCancelled``."""

    reason: str = ""
    by: str | None = None
    terminate: bool = False
    """``sojourn terminate``: end the run without running its compensation (``on_cancel``)."""


class CancelTaken(Event, tag="run.cancel_taken.v1", frozen=True, kw_only=True):
    """Written by the run's owner when it stops the agent's code for a cancel (or the run's
    lifetime) and runs the agent's compensation (``on_cancel``) before ``RunCancelled``.

    Replay needs it: the agent's code is replayed up to where the cancel was taken, then the
    compensation, whose operations follow in the same position sequence.
    """

    reason: str = ""
    """What ``RunCancelled.reason`` will say (the cancel's reason, or the lifetime's)."""
    stopped_at: int = 0
    """The position at which the agent's code was stopped: replay raises the cancel into it
    when it reaches this operation (a step the cancel interrupted is recorded failed there)."""
    compensate_at: int = 0
    """The position of the compensation's first operation (``stopped_at``, or one more when
    the operation there is recorded)."""


class RunCancelled(Event, tag="run.cancelled.v1", frozen=True, kw_only=True):
    reason: str = ""
    terminated: bool = False
    """Ended by ``terminate`` (no compensation ran)."""
    compensation_error: ErrorInfo | None = None
    """The compensation (``on_cancel``) raised: the run is cancelled all the same."""


class RunSuspended(Event, tag="run.suspended.v1", frozen=True, kw_only=True):
    """The run is parked for a human: replay diverged, a cap was hit, a step is in doubt."""

    reason: str
    """A ``SuspendReason`` (``sojourn.schemas.vocabulary``): ``nondeterminism``, ``cap``,
    ``budget``, ``in_doubt``, ``crash_loop``; ``poison`` and ``manual`` are reserved. A plain
    string on purpose, not the Literal: a newer reason must never make an older reader fail
    (decision 0001 allows widening a set of strings, never narrowing one)."""
    detail: str
    limit: str | None = None
    """For ``budget``: the limit that was used up (a ``BudgetLimit``: ``usd``, ``steps``...)."""


class RunAdmitted(Event, tag="run.admitted.v1", frozen=True, kw_only=True):
    """A run queued on its concurrency key (``RunStarted.concurrency.ticket``) took a slot of
    it: it is no longer queued, and a worker replays it (decision 0048)."""

    key: str
    ticket: int = 0


class RunResumed(Event, tag="run.resumed.v1", frozen=True, kw_only=True):
    """A human (or a deploy) lifted a suspension; the run replays again."""

    by: str | None = None
    note: str = ""
    grant: bool = True
    """Whether lifting a ``cap`` or ``budget`` suspension grants the same allowance again
    (``sojourn resume``); ``False`` when the limit itself was changed (``BudgetChanged``)."""


class StepStarted(Event, tag="step.started.v1", frozen=True, kw_only=True):
    """Written before a step's function runs: the effect ledger's "may have happened" mark."""

    position: int
    name: str
    attempt: int = 1
    kind: str = "step"
    """A ``StepKind``: ``step``, ``llm`` (a model request) or ``tool``; a plain string like
    ``RunSuspended.reason``."""
    limit: str | None = None
    """The shared rate limit the attempt took a slot of (``@step(limit=...)``), if any."""
    slot: float | None = None
    """When that slot began (unix seconds): the attempt starts at or after it."""


class StepCompleted(Event, tag="step.completed.v1", frozen=True, kw_only=True):
    position: int
    name: str
    attempt: int = 1
    result: msgspec.Raw
    duration: float = 0.0
    usage: Usage | None = None
    """What the attempt charged (model tokens, money), if anything."""
    result_ref: ValueRef | None = None
    """``result`` is ``null`` and the value is in the values bucket (a large value)."""


class StepFailed(Event, tag="step.failed.v1", frozen=True, kw_only=True):
    """One failed attempt. ``retry_at`` set: another attempt is due then (a broker timer wakes
    the run); ``None``: the failure is final and the agent sees ``StepError``."""

    position: int
    name: str
    attempt: int = 1
    error: ErrorInfo
    duration: float = 0.0
    retry_at: float | None = None
    usage: Usage | None = None
    """What the failed attempt charged before it failed (a model request may cost money)."""


class StepThrottled(Event, tag="step.throttled.v1", frozen=True, kw_only=True):
    """Attempt ``attempt`` of a step must wait for capacity of the shared rate limit ``limit``:
    it was granted the slot beginning at ``slot`` (unix seconds) while the limit's block epoch
    was ``epoch``. The run waits (``waiting_on: limit:<limit>``) with no worker holding it and
    a timer wakes it at the slot; a block imposed after the grant that covers the slot (the
    limit's epoch went up) or a slot missed by more than the grace makes it ask again."""

    position: int
    name: str
    attempt: int = 1
    limit: str
    slot: float
    epoch: int = 0


class SpendValue(msgspec.Struct, frozen=True):
    """The value a ``ctx.spend`` call records: a ``ValueRecorded`` of kind ``spend``."""

    usd: float = 0.0
    tokens: int = 0


class ValueRecorded(Event, tag="value.recorded.v1", frozen=True, kw_only=True):
    """A non-deterministic value (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``) journaled."""

    position: int
    kind: str
    """A ``ValueKind`` (``now``, ``uuid``, ``random``, ``spend``); a plain string like
    ``RunSuspended.reason``, so a new kind never breaks an older reader."""
    value: msgspec.Raw
    value_ref: ValueRef | None = None
    """``value`` is ``null`` and the value is in the values bucket (a large value)."""


class WaitStarted(Event, tag="wait.started.v1", frozen=True, kw_only=True):
    """The run parks at ``position`` until one of ``signals`` arrives or ``deadline`` passes.

    ``key`` names the wait for replay checks (``sleep``, ``poll``, ``signal:docs.signed``,
    ``select:a|b``, ``child:<run>``): ``WaitKey(...).format()``, read with ``WaitKey.parse``
    (``sojourn.schemas.vocabulary``); stored as text, compared as text. A deadline is kept by
    the broker as a message schedule on ``<prefix>.timer.<run_id>.<position>`` that targets the
    run's wake subject.
    """

    position: int
    key: str
    signals: tuple[str, ...] = ()
    deadline: float | None = None
    children: tuple[str, ...] = ()


class WaitCompleted(Event, tag="wait.completed.v1", frozen=True, kw_only=True):
    """The wait at ``position`` ended: by a signal (which one: ``signal_id``), a timeout, or a
    child run ending. ``payload`` is what the code receives (JSON ``null`` on timeout)."""

    position: int
    key: str
    outcome: WaitOutcome
    payload: msgspec.Raw
    signal: str | None = None
    signal_id: str | None = None
    child_status: str | None = None
    """For ``outcome == "child"``: the child's ``ChildStatus`` (``completed``, ``failed`` or
    ``cancelled`` so far). A plain string, not the Literal: it was shipped as one, and a narrower
    type would make a newer status a poison history for older readers (decision 0001)."""
    sent_by: str | None = None
    """For ``outcome == "signal"``: the signal's ``SignalReceived.sent_by``, copied when the wait
    took it, so that a replay knows who sent what the code received (``ctx.approval`` decides
    by it)."""
    sender_verified: bool | None = None
    """For ``outcome == "signal"``: the signal's ``SignalReceived.sender_verified``, copied."""


class SignalReceived(Event, tag="signal.received.v1", frozen=True, kw_only=True):
    """Written by the intake: a signal for this run, buffered until a wait consumes it."""

    name: str
    payload: msgspec.Raw
    signal_id: str
    sent_by: str | None = None
    """The ``<sender>`` token of the subject the signal came on (``None``: the anonymous form)."""
    sender_verified: bool | None = None
    """Whether the broker authenticated ``sent_by``: ``True`` when the intake that recorded the
    signal connects with a user name (the deployment runs with users, and the broker lets each
    publish only under the sender names its permissions give it) and the subject names a
    sender; ``False`` when ``sent_by`` is a claim (no authentication, or no sender); ``None`` in
    histories written before sojourn recorded this (read as a claim, by the rules of then)."""
    traceparent: str | None = None
    """The W3C trace context the signal carried (its ``traceparent`` header), well formed or
    not recorded: the span of its delivery links to it."""


class ChildStarted(Event, tag="child.started.v1", frozen=True, kw_only=True):
    """The run started a child run (deterministic id ``<run_id>-c<position>``)."""

    position: int
    child_run_id: str
    agent: str


class UpdateRequested(Event, tag="update.requested.v1", frozen=True, kw_only=True):
    """Written by the intake: an update for this run (``client.update``), once per
    ``update_id``, pending until the run's code decides it at its next wait
    (``UpdateCompleted`` or ``UpdateRejected``; decision 0042)."""

    update_id: str
    name: str
    payload: msgspec.Raw
    sent_by: str | None = None
    """The ``<sender>`` token of the subject the update came on, as for signals."""
    sender_verified: bool = False
    """Whether the broker authenticated ``sent_by`` (``SignalReceived.sender_verified``)."""


class UpdateCompleted(Event, tag="update.completed.v1", frozen=True, kw_only=True):
    """The run applied the update ``update_id`` at the wait at ``position`` (its handler ran
    there, after its validator accepted it): a replay applies it again there. ``answer`` is
    the handler's return value, or ``error`` what it raised (its changes stand)."""

    update_id: str
    name: str
    position: int
    answer: msgspec.Raw
    """JSON ``null`` when ``error`` is set."""
    sent_by: str | None = None
    error: ErrorInfo | None = None


class UpdateRejected(Event, tag="update.rejected.v1", frozen=True, kw_only=True):
    """The run refused the update ``update_id`` without applying it: its validator raised
    (``code`` ``rejected``), or the code had no handler of that name (``unknown_update``).
    Nothing of the run changed. ``code`` is an ``UpdateRejectCode``, kept as text."""

    update_id: str
    name: str
    code: str
    message: str = ""
    sent_by: str | None = None


RunEvent = (
    RunStarted
    | RunCompleted
    | RunFailed
    | CancelRequested
    | CancelTaken
    | BudgetChanged
    | PauseRequested
    | PauseLifted
    | RunCancelled
    | RunSuspended
    | RunResumed
    | RunAdmitted
    | StepStarted
    | StepCompleted
    | StepFailed
    | StepThrottled
    | ValueRecorded
    | WaitStarted
    | WaitCompleted
    | SignalReceived
    | ChildStarted
    | UpdateRequested
    | UpdateCompleted
    | UpdateRejected
)
"""Every event that may appear in a run's history (a tagged union)."""


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One stored decision as ``sojourn history RUN --json`` prints it (a JSON array of
    these): what ``sojourn replay --from-file`` reads, so a team can keep golden histories."""

    seq: int
    writer: str
    events: list[RunEvent]
