"""Long waits built from the durable primitives: human approvals and polling external jobs.

Both are plain agent code on top of ``ctx.step``, ``ctx.wait_for`` and ``ctx.sleep``: every
reminder, escalation and check is a journaled step, and every pause is a broker timer, so an
approval that takes a week or a job polled for a day hold no process, survive restarts, and
leave their whole audit trail in the run's history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import msgspec

from sojourn.schemas.errors import SojournError
from sojourn.schemas.vocabulary import WaitKey

from ._metrics import IDLE_POLLS, agent_label

if TYPE_CHECKING:
    from ._context import Context, Duration

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalTimeout",
    "PollTimeout",
    "approval",
    "poll",
]

R = TypeVar("R")


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an approver sends: ``sojourn signal RUN approval.<name> --payload '{...}'``."""

    approve: bool
    by: str
    note: str = ""


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True):
    """How an approval ended. ``via`` is ``decision`` (someone decided) or ``policy`` (the
    final deadline passed and the policy decided); ``stage`` is the index of the approver that
    was asked when it ended (> 0 means it was escalated)."""

    approved: bool
    by: str
    at: datetime
    note: str = ""
    via: Literal["decision", "policy"] = "decision"
    stage: int = 0


class ApprovalTimeout(SojournError):
    """The last approver's deadline passed and the policy is ``fail``."""


class PollTimeout(SojournError):
    """``ctx.poll`` did not see the job finish within its ``timeout``."""


def _seconds(d: Duration) -> float:
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


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
) -> ApprovalDecision:
    """Ask ``approvers`` in turn; see ``Context.approval``."""
    if not approvers:
        raise ValueError("an approval needs at least one approver")
    signal = f"approval.{name}"
    for stage, approver in enumerate(approvers):
        if remind is not None:
            await ctx.step(remind, approver, name)  # the request itself
        stage_deadline = ctx.now() + timedelta(seconds=_seconds(timeout))
        while True:
            now = ctx.now()
            until = stage_deadline
            if remind_every is not None and remind is not None:
                until = min(until, now + timedelta(seconds=_seconds(remind_every)))
            got = await ctx.wait_for(signal, timeout=max((until - now).total_seconds(), 0.0))
            if got is not None:
                try:
                    req = msgspec.convert(got, ApprovalRequest)
                except msgspec.ValidationError:
                    continue  # malformed answers stay in history as audit; keep waiting
                return ApprovalDecision(
                    approved=req.approve,
                    by=req.by,
                    at=ctx.now(),
                    note=req.note,
                    via="decision",
                    stage=stage,
                )
            if ctx.now() >= stage_deadline:
                break
            assert remind is not None
            await ctx.step(remind, approver, name)  # a reminder
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
