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

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec

from sojourn.schemas.errors import SojournError

__all__ = [
    "Accepted",
    "ApprovalDecision",
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalTimeout",
    "PollTimeout",
    "judge",
]


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
