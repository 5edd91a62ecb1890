"""The words sojourn uses about a run, each defined once: statuses, suspension reasons, child
outcomes, value and step kinds, budget limits, what a position of a run's history holds, why a
run is woken, and the typed forms of wait keys and of what a run waits on.

History stores these as plain strings (docs/wire.md "Run events"); nothing here changes a byte
on the wire. ``WaitKey`` and ``WaitingOn`` are the typed values behind two such strings: build
them with their constructors, store ``format()``, read with ``parse()`` (total: any text gives
a value, and ``parse(text).format() == text``).
"""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

import msgspec

__all__ = [
    "ATTRIBUTES_KIND",
    "BUDGET_LIMITS",
    "CHILD_STATUSES",
    "LLM_STEP",
    "OP_KINDS",
    "OP_STATUSES",
    "PATCH_KIND",
    "POLL_WAIT",
    "RUN_STATUSES",
    "SPEND_KIND",
    "STEP_KINDS",
    "SUSPEND_REASONS",
    "TERMINAL",
    "VALUE_KINDS",
    "WAITING_KINDS",
    "WAIT_KINDS",
    "WAIT_OUTCOMES",
    "WAKE_REASONS",
    "BudgetLimit",
    "ChildStatus",
    "OpKind",
    "OpStatus",
    "RunStatus",
    "StepKind",
    "SuspendReason",
    "TerminalStatus",
    "ValueKind",
    "WaitKey",
    "WaitKind",
    "WaitOutcome",
    "WaitingKind",
    "WaitingOn",
    "WakeReason",
    "is_terminal",
    "is_value_kind",
    "suspend_reason",
    "value_op",
    "wake_reason",
]

# --- statuses ---------------------------------------------------------------------------------

TerminalStatus = Literal["completed", "failed", "cancelled"]
"""How a run ended. A run has at most one of ``RunCompleted``, ``RunFailed``, ``RunCancelled``."""

RunStatus = Literal["new", "pending", "running", "waiting", "suspended", TerminalStatus]
"""A run's status, as folded from its history (``sojourn.schemas.lifecycle.next_status``).

- ``new``: no ``RunStarted`` yet; ``pending``: started or resumed, no worker has run it since;
- ``running``: a worker is executing it (a step, a wait that ended);
- ``waiting``: parked on a wait or a retry backoff; ``suspended``: parked for a human;
- ``completed``, ``failed``, ``cancelled``: ended (``TERMINAL``).
"""
RUN_STATUSES: tuple[RunStatus, ...] = (
    "new",
    "pending",
    "running",
    "waiting",
    "suspended",
    *get_args(TerminalStatus),
)

TERMINAL: frozenset[RunStatus] = frozenset(get_args(TerminalStatus))
"""The statuses of a run that has ended: nothing changes it any more."""


def is_terminal(status: str) -> TypeGuard[TerminalStatus]:
    """Whether ``status`` is one of an ended run."""
    return status in TERMINAL


# --- suspensions, child outcomes, values, wait outcomes ---------------------------------------

SuspendReason = Literal[
    "nondeterminism",
    "cap",
    "budget",
    "in_doubt",
    "crash_loop",
    "poison",
    "manual",
    "limit",
    "other",
]
"""Why a run is suspended (``RunSuspended.reason``). Written today: ``nondeterminism`` (replay
diverged), ``cap`` (the poll cap), ``budget`` (``ctx.spend`` over the agent's budget),
``in_doubt`` (a step with ``in_doubt="ask"`` whose end was never recorded), ``crash_loop`` (a
step cut off too often in a row), ``manual`` (an operator's pause), ``limit`` (a step names a
shared rate limit nobody declared). Reserved: ``poison``. ``other``: a reason no
writer of today makes. The event field stays a plain string (a newer reason must not make an
older reader fail); the folds read it with ``suspend_reason``, so their fields are typed."""
SUSPEND_REASONS: tuple[SuspendReason, ...] = get_args(SuspendReason)


def suspend_reason(text: str) -> SuspendReason:
    """A stored ``RunSuspended.reason`` as a ``SuspendReason``. Total: a reason this version
    does not know is ``other`` (the event keeps its text)."""
    return text if _is_suspend_reason(text) else "other"


def _is_suspend_reason(text: str) -> TypeGuard[SuspendReason]:
    return text in _SUSPEND_REASONS


_SUSPEND_REASONS = frozenset(SUSPEND_REASONS)

ChildStatus = Literal["completed", "failed", "cancelled", "rejected"]
"""How a child run ended as its parent learns it (``ChildOutcome.status``): a terminal status,
or ``rejected`` (the intake refused the child's trigger: it never ran)."""
CHILD_STATUSES: tuple[ChildStatus, ...] = get_args(ChildStatus)

ValueKind = Literal["now", "uuid", "random", "spend", "patch", "callback", "refusal", "attributes"]
"""What ``ValueRecorded.kind`` holds today: ``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``,
``ctx.spend()``, a ``ctx.patched`` marker (``patch``, the value is the change id), a
``ctx.callback`` token (``callback``, the value is the token), and a decision ``ctx.approval``
refused (``refusal``, the value is an ``ApprovalRefused``: who sent it, the approval, the stage
and why), and a ``ctx.set_attributes`` upsert (``attributes``, the value an object of keys to
values, ``null`` removing one). The event field stays a plain string, like
``RunSuspended.reason``."""
VALUE_KINDS: tuple[ValueKind, ...] = get_args(ValueKind)

PATCH_KIND: ValueKind = "patch"
"""The value kind of a ``ctx.patched`` marker: its value is the change id."""
ATTRIBUTES_KIND: ValueKind = "attributes"
"""The value kind of a ``ctx.set_attributes`` upsert: its value maps keys to values (``None``
removes a key; ``sojourn.schemas.attributes``)."""
SPEND_KIND: ValueKind = "spend"
"""The value kind of a ``ctx.spend`` call: its value is a ``Spend`` (usd and tokens)."""


def is_value_kind(text: str) -> TypeGuard[ValueKind]:
    """Whether ``text`` (a stored ``ValueRecorded.kind``) is a value kind this version knows."""
    return text in _VALUE_KINDS


_VALUE_KINDS = frozenset(VALUE_KINDS)

BudgetLimit = Literal[
    "usd", "tokens", "input_tokens", "output_tokens", "steps", "tool_calls", "polls", "wall_seconds"
]
"""The limits of a run's budget (the fields of ``sojourn.schemas.events.Budget``), named by
``RunSuspended.limit`` when one is used up and by ``sojourn_budget_breaches_total{limit}``."""
BUDGET_LIMITS: tuple[BudgetLimit, ...] = get_args(BudgetLimit)

StepKind = Literal["step", "llm", "tool"]
"""What a step is (``StepStarted.kind``): ``llm``, a model request (``ctx.llm``, an LLM
framework's model call); ``tool``, a tool a model asked for; ``step``, anything else. Budgets
count model requests and tool calls by it (a ``tool_calls`` limit counts every step that is not
a model request). A plain string in the event, like ``RunSuspended.reason``."""
STEP_KINDS: tuple[StepKind, ...] = get_args(StepKind)

LLM_STEP: StepKind = "llm"
"""The kind of a step that is a model request: budgets count it as a model call, a step of any
other kind as a tool call."""

WaitOutcome = Literal["signal", "timeout", "child"]
"""How a wait ended (``WaitCompleted.outcome``)."""
WAIT_OUTCOMES: tuple[WaitOutcome, ...] = get_args(WaitOutcome)


# --- operations -------------------------------------------------------------------------------

OpKind = Literal["step", "wait", "child", ValueKind, "other"]
"""What history recorded at one position of a run's code (``OpRecord.kind``): a step, a wait, a
child start, or a value of its ``ValueKind`` (``now``, ``uuid``, ``patch``...). ``other``: a
value of a kind this version does not know (``OpRecord.name`` keeps its text)."""
OP_KINDS: tuple[OpKind, ...] = get_args(OpKind)


def value_op(kind: str) -> OpKind:
    """The ``OpKind`` of a value recorded with ``ValueRecorded.kind`` ``kind``. Total: a kind
    this version does not know is ``other``."""
    return kind if is_value_kind(kind) else "other"


OpStatus = Literal["started", "completed", "failed", "recorded", "waiting", "throttled"]
"""Where an operation stands (``OpRecord.status``): a step ``started`` (in doubt: it may have
run), ``completed`` or ``failed``, or ``throttled`` (waiting for a slot of a shared limit); a
value ``recorded``; a wait ``waiting`` until it is ``completed`` (a child start is
``completed`` once recorded)."""
OP_STATUSES: tuple[OpStatus, ...] = get_args(OpStatus)


# --- wakes ------------------------------------------------------------------------------------

WakeReason = Literal["start", "signal", "cancel", "timer", "rewake", "takeover", "watchdog"]
"""Why a run is woken (header ``Sojourn-Wake-Reason`` on a wake or a timer; a hint, read by
nobody to decide anything): ``start``, a run started or continued that no worker runs yet;
``signal``, a signal or a resume arrived; ``cancel``, a cancel was recorded; ``timer``, a wait's
deadline or a retry is due; ``rewake``, a wake handed on to a worker that serves the run's
agent; ``takeover``, a run taken over from a worker that stopped or died; ``watchdog``, the
watchdog judged the run stuck (the header then names its judgement: ``wake_reason``)."""
WAKE_REASONS: tuple[WakeReason, ...] = get_args(WakeReason)


def wake_reason(reason: WakeReason, detail: str = "") -> str:
    """The text of the wake header: ``reason``, or ``reason:detail`` (``watchdog:stalled``)."""
    return f"{reason}:{detail}" if detail else reason


# --- wait keys --------------------------------------------------------------------------------

POLL_WAIT = "poll"
"""The wait key of the pause between two checks of ``ctx.poll``: one idle poll."""

WaitKind = Literal["sleep", "poll", "signal", "select", "child", "other"]
"""What a wait waits for, as its key says. ``other``: a key no writer of today makes (kept as
text, so reading never fails)."""
WAIT_KINDS: tuple[WaitKind, ...] = get_args(WaitKind)

_SELECT_SEP = "|"


class WaitKey(msgspec.Struct, frozen=True):
    """The typed form of ``WaitStarted.key`` / ``WaitCompleted.key``, which replay compares.

    ============================ ================================== ==========================
    stored text                  value                              written by
    ============================ ================================== ==========================
    ``sleep``                    ``WaitKey.sleep()``                ``ctx.sleep``
    ``poll``                     ``WaitKey.poll()``                 ``ctx.poll`` between checks
    ``signal:<name>``            ``WaitKey.signal(name)``           ``ctx.wait_for``
    ``select:<a>|<b>...``        ``WaitKey.select(a, b, ...)``      ``ctx.select``
    ``child:<run_id>``           ``WaitKey.child(run_id)``          awaiting a child run
    anything else                ``WaitKey(kind="other", target=)`` nobody today
    ============================ ================================== ==========================
    """

    kind: WaitKind
    names: tuple[str, ...] = ()
    """The signal names of a ``signal`` (one) or ``select`` (one or more) wait."""
    target: str = ""
    """The child run id of a ``child`` wait; the whole text of an ``other`` key."""

    @classmethod
    def sleep(cls) -> WaitKey:
        return _SLEEP

    @classmethod
    def poll(cls) -> WaitKey:
        return _POLL

    @classmethod
    def signal(cls, name: str) -> WaitKey:
        return cls("signal", (name,))

    @classmethod
    def select(cls, *names: str) -> WaitKey:
        """The first of ``names`` to arrive. Raises ``ValueError`` without a name or with a
        name holding ``|`` (no valid signal name does)."""
        if not names:
            raise ValueError("a select wait needs at least one signal name")
        if any(_SELECT_SEP in n for n in names):
            raise ValueError(f"signal names in a select wait cannot hold {_SELECT_SEP!r}")
        return cls("select", tuple(names))

    @classmethod
    def child(cls, run_id: str) -> WaitKey:
        return cls("child", target=run_id)

    def format(self) -> str:
        """The text stored in history (the same bytes as every writer before this type)."""
        match self.kind:
            case "sleep" | "poll":
                return self.kind
            case "signal":
                return f"signal:{self.names[0] if self.names else ''}"
            case "select":
                return "select:" + _SELECT_SEP.join(self.names)
            case "child":
                return f"child:{self.target}"
        return self.target

    @classmethod
    def parse(cls, text: str) -> WaitKey:
        """Read a stored key. Total: never raises; ``parse(text).format() == text``."""
        if text == "sleep":
            return _SLEEP
        if text == POLL_WAIT:
            return _POLL
        head, colon, rest = text.partition(":")
        if colon:
            if head == "signal":
                return cls("signal", (rest,))
            if head == "select":
                return cls("select", tuple(rest.split(_SELECT_SEP)))
            if head == "child":
                return cls("child", target=rest)
        return cls("other", target=text)

    @property
    def signals(self) -> tuple[str, ...]:
        """The signal names this key names (``signal`` and ``select`` keys)."""
        return self.names if self.kind in ("signal", "select") else ()


_SLEEP = WaitKey("sleep")
_POLL = WaitKey("poll")


# --- what a run waits on ----------------------------------------------------------------------

WaitingKind = Literal["signal", "run", "timer", "retry", "limit", "queue", "other"]
"""One thing a parked run waits on: a signal, a child run's end, its timer, a step's retry
backoff, a slot of a shared rate limit, a slot of its concurrency key (a queued run, decision
0048). ``other``: text no writer of today makes."""
WAITING_KINDS: tuple[WaitingKind, ...] = get_args(WaitingKind)


class WaitingOn(msgspec.Struct, frozen=True):
    """The typed form of an entry of ``RunState.waiting_on`` / ``RunSummary.waiting_on``
    (and ``Liveness.on``), which stay strings: ``signal:<name>``, ``run:<run_id>``, ``timer``,
    ``retry:<step>``, ``limit:<name>``."""

    kind: WaitingKind
    target: str = ""
    """The signal name, the child run id, the step name; the whole text of ``other``."""

    @classmethod
    def signal(cls, name: str) -> WaitingOn:
        return cls("signal", name)

    @classmethod
    def run(cls, run_id: str) -> WaitingOn:
        return cls("run", run_id)

    @classmethod
    def timer(cls) -> WaitingOn:
        return _TIMER

    @classmethod
    def retry(cls, step: str) -> WaitingOn:
        return cls("retry", step)

    @classmethod
    def limit(cls, name: str) -> WaitingOn:
        return cls("limit", name)

    @classmethod
    def queue(cls, key: str) -> WaitingOn:
        return cls("queue", key)

    def format(self) -> str:
        match self.kind:
            case "timer":
                return "timer"
            case "signal" | "run" | "retry" | "limit" | "queue":
                return f"{self.kind}:{self.target}"
        return self.target

    @classmethod
    def parse(cls, text: str) -> WaitingOn:
        """Read an entry. Total: never raises; ``parse(text).format() == text``."""
        if text == "timer":
            return _TIMER
        head, colon, rest = text.partition(":")
        if colon:
            if head == "signal":
                return cls("signal", rest)
            if head == "run":
                return cls("run", rest)
            if head == "retry":
                return cls("retry", rest)
            if head == "limit":
                return cls("limit", rest)
            if head == "queue":
                return cls("queue", rest)
        return cls("other", text)


_TIMER = WaitingOn("timer")
