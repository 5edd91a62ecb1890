"""Long waits built from the durable primitives: human approvals and polling external jobs.

Both are plain agent code on top of ``ctx.step``, ``ctx.wait_for`` and ``ctx.sleep``: every
reminder, escalation and check is a journaled step, and every pause is a broker timer, so an
approval that takes a week or a job polled for a day hold no process, survive restarts, and
leave their whole audit trail in the run's history.

Who decides an approval is the signal's sender as the broker authenticated it, where it does
(``SignalReceived.sender_verified``, recorded by the intake and copied into the wait's
completion, so a replay decides alike): a decision from anyone other than the approver asked is
refused and journaled as a ``refusal`` value. Without authentication the payload's ``by`` is a
claim, taken as it stands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import msgspec

from sojourn.schemas.codec import from_raw
from sojourn.schemas.errors import SojournError
from sojourn.schemas.vocabulary import WaitKey

from ..ops.metrics import IDLE_POLLS, agent_label

if TYPE_CHECKING:
    from .context import Context, Duration

__all__ = [
    "Accepted",
    "ApprovalDecision",
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalTimeout",
    "PollTimeout",
    "approval",
    "judge",
    "poll",
]

R = TypeVar("R")


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an approver sends: ``sojourn signal RUN approval.<name> --payload '{...}'``.

    ``by`` is who the sender says it is. It counts only where the broker does not authenticate
    senders, as a claim (and without it the signal's ``sent_by``, a claim too); under
    authentication the decider is the signal's sender and ``by`` is ignored."""

    approve: bool
    by: str | None = None
    note: str = ""


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True):
    """How an approval ended. ``via`` is ``decision`` (someone decided) or ``policy`` (the
    final deadline passed and the policy decided); ``stage`` is the index of the approver that
    was asked when it ended (> 0 means it was escalated). ``verified``: ``by`` is the sender the
    broker authenticated (a deployment with users), not a claim in the payload; ``False`` for
    a claim and for ``policy``."""

    approved: bool
    by: str
    at: datetime
    note: str = ""
    via: Literal["decision", "policy"] = "decision"
    stage: int = 0
    verified: bool = False


class ApprovalRefused(msgspec.Struct, frozen=True, kw_only=True):
    """A decision ``ctx.approval`` did not take, as the run's history records it (a
    ``value.recorded.v1`` of kind ``refusal``): ``by`` sent it (authenticated by the broker)
    but is neither the approver asked at ``stage`` nor one of the approval's ``allowed``."""

    by: str
    approval: str
    stage: int
    reason: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """A decision ``judge`` takes: who made it, and whether the broker authenticated them."""

    approve: bool
    by: str
    note: str
    verified: bool


class ApprovalTimeout(SojournError):
    """The last approver's deadline passed and the policy is ``fail``."""


class PollTimeout(SojournError):
    """``ctx.poll`` did not see the job finish within its ``timeout``."""


def _seconds(d: Duration) -> float:
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


def judge(
    payload: Any,
    sent_by: str | None,
    sender_verified: bool | None,
    *,
    name: str,
    stage: int,
    approver: str,
    allowed: Collection[str] = (),
) -> Accepted | ApprovalRefused | None:
    """What an answer to the approval ``name`` is worth while ``approver`` (stage ``stage``) is
    asked: a decision, a refusal, or ``None`` (malformed: ignored). Pure.

    - The sender is authenticated (``sender_verified``): it decides if it is ``approver`` or one
      of ``allowed``, else it is refused, whatever the payload says; ``by`` is ignored.
    - It is not (``False``: no authentication): the payload's ``by`` is a claim and stands
      unchecked; without one, the signal's ``sent_by`` (a claim too); without either, ignored.
    - Not recorded (``None``: a history written before senders were verified): as sojourn
      decided then, so that such histories replay: the payload's ``by`` stands, and a payload
      without one is ignored.
    """
    if sender_verified and sent_by is not None:
        if sent_by != approver and sent_by not in allowed:
            reason = f"not the approver asked ({approver})"
            return ApprovalRefused(
                by=sent_by,
                approval=name,
                stage=stage,
                reason=reason + (" nor one allowed at any stage" if allowed else ""),
            )
    try:
        req = msgspec.convert(payload, ApprovalRequest)
    except msgspec.ValidationError:
        return None  # malformed answers stay in history as audit
    if sender_verified and sent_by is not None:
        return Accepted(approve=req.approve, by=sent_by, note=req.note, verified=True)
    by = req.by if sender_verified is None else (req.by or sent_by)
    if by is None:
        return None
    return Accepted(approve=req.approve, by=by, note=req.note, verified=False)


def _journal_refusal(ctx: Context, refused: ApprovalRefused) -> None:
    """Record a refused decision in the run's history (a ``refusal`` value), for the audit."""
    ctx._value("refusal", lambda: refused, ApprovalRefused)


async def approval(
    ctx: Context,
    name: str,
    *,
    approvers: Sequence[str],
    timeout: Duration,
    remind: Callable[[str, str], Any] | None = None,
    remind_every: Duration | None = None,
    escalate: Callable[[str, str | None, str], Any] | None = None,
    on_timeout: Literal["deny", "approve", "fail"] = "deny",
    allowed: Sequence[str] = (),
) -> ApprovalDecision:
    """Ask ``approvers`` in turn; see ``Context.approval``."""
    if not approvers:
        raise ValueError("an approval needs at least one approver")
    if isinstance(allowed, str):
        raise TypeError("allowed is a sequence of names, not one string")
    anyone = frozenset(allowed)
    signal = f"approval.{name}"
    for stage, approver in enumerate(approvers):
        if remind is not None:
            await ctx.step(remind, approver, name)  # the request itself
        stage_deadline = ctx.now() + timedelta(seconds=_seconds(timeout))
        next_remind: datetime | None = None  # kept when an answer is ignored or refused
        while True:
            now = ctx.now()
            until = stage_deadline
            if remind_every is not None and remind is not None:
                if next_remind is None:
                    next_remind = now + timedelta(seconds=_seconds(remind_every))
                until = min(until, next_remind)
            got = await ctx._receive(signal, timeout=max((until - now).total_seconds(), 0.0))
            if got is not None:
                verdict = judge(
                    from_raw(got.payload, Any),
                    got.sent_by,
                    got.sender_verified,
                    name=name,
                    stage=stage,
                    approver=approver,
                    allowed=anyone,
                )
                if verdict is None:
                    continue  # keep waiting, to the same deadline
                if isinstance(verdict, ApprovalRefused):
                    _journal_refusal(ctx, verdict)
                    continue  # keep waiting, to the same deadline
                return ApprovalDecision(
                    approved=verdict.approve,
                    by=verdict.by,
                    at=ctx.now(),
                    note=verdict.note,
                    via="decision",
                    stage=stage,
                    verified=verdict.verified,
                )
            if ctx.now() >= stage_deadline:
                break
            assert remind is not None
            await ctx.step(remind, approver, name)  # a reminder
            next_remind = None
        nxt = approvers[stage + 1] if stage + 1 < len(approvers) else None
        if escalate is not None:
            await ctx.step(escalate, approver, nxt, name)
    if on_timeout == "fail":
        raise ApprovalTimeout(
            f"approval '{name}' got no decision from {list(approvers)}", run_id=ctx.run_id
        )
    return ApprovalDecision(
        approved=on_timeout == "approve",
        by="policy",
        at=ctx.now(),
        note=f"no decision before the last deadline: {on_timeout}",
        via="policy",
        stage=len(approvers) - 1,
    )


async def poll(
    ctx: Context,
    check: Callable[..., Awaitable[R | None]] | Callable[..., R | None],
    *args: Any,
    every: Duration,
    backoff: float = 2.0,
    max_interval: Duration | None = None,
    timeout: Duration | None = None,
    **kwargs: Any,
) -> R:
    """Check until done; see ``Context.poll``."""
    if backoff < 1.0:
        raise ValueError("backoff must be >= 1.0")
    interval = _seconds(every)
    cap_interval = None if max_interval is None else _seconds(max_interval)
    deadline = None if timeout is None else ctx.now() + timedelta(seconds=_seconds(timeout))
    while True:
        await ctx._count_poll(getattr(check, "__name__", "check"))
        result: Any = await ctx.step(check, *args, **kwargs)
        if result is not None:
            return cast(R, result)
        if not ctx.replaying:
            IDLE_POLLS.labels(agent_label(ctx.agent)).inc()
        if deadline is not None:
            left = (deadline - ctx.now()).total_seconds()
            if left <= 0:
                raise PollTimeout(
                    f"poll of {getattr(check, '__name__', 'check')} timed out", run_id=ctx.run_id
                )
            pause = min(interval, left)
        else:
            pause = interval
        # Its own wait key, so that history (and the watchdog) can count idle polls.
        await ctx._wait(WaitKey.poll(), timeout=pause)
        interval *= backoff
        if cap_interval is not None:
            interval = min(interval, cap_interval)
