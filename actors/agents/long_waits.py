"""``ctx.approval`` and ``ctx.poll``: the long waits of ``patterns.py``, written on the
primitives (steps, durable waits, journaled values) as a mixin of ``Context``.

The decision types, the errors and ``judge`` (what an answer to an approval is worth) stay in
``patterns.py``, which imports nothing of the context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, cast

from sojourn.schemas.codec import from_raw
from sojourn.schemas.vocabulary import WaitKey

from ..ops import metrics as _metrics
from .driver import Duration, seconds
from .patterns import ApprovalDecision, ApprovalRefused, ApprovalTimeout, PollTimeout, judge
from .step_calls import StepCalls
from .waits import Waits

__all__ = ["LongWaits"]

R = TypeVar("R")


class LongWaits(StepCalls, Waits):
    """``Context``'s long waits: ``approval``, ``poll``."""

    async def approval(
        self,
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
        """Wait for a human decision, with reminders, an escalation chain and a final policy.

        Each approver in turn gets ``timeout`` to answer; ``remind(approver, name)`` runs as a
        step when the approver is asked and every ``remind_every`` after that;
        ``escalate(approver, next_approver_or_None, name)`` runs as a step when an approver's
        time is up. After the last approver, ``on_timeout`` decides: ``deny``, ``approve`` or
        ``fail`` (raises ``ApprovalTimeout``). A decision is the signal
        ``approval.<name>`` with payload ``{"approve": bool, "by": "...", "note": "..."}``;
        the returned ``ApprovalDecision`` says who decided and when, and the history keeps the
        whole audit (requests, reminders, escalations, the decision).

        Who decided: on a deployment with authentication, the signal's sender as the broker
        authenticated it (the payload's ``by`` is ignored), and a decision from anyone but the
        approver asked now, or one of ``allowed`` (names that may decide at any stage), is
        refused: recorded in the history (a ``refusal`` value naming the sender) while the
        wait goes on to the same deadline. Without authentication ``by`` is the payload's claim
        (else the signal's ``sent_by``), unchecked: ``ApprovalDecision.verified`` tells which.
        """
        if not approvers:
            raise ValueError("an approval needs at least one approver")
        if isinstance(allowed, str):
            raise TypeError("allowed is a sequence of names, not one string")
        anyone = frozenset(allowed)
        signal = f"approval.{name}"
        for stage, approver in enumerate(approvers):
            if remind is not None:
                await self.step(remind, approver, name)  # the request itself
            stage_deadline = self.now() + timedelta(seconds=seconds(timeout))
            next_remind: datetime | None = None  # kept when an answer is ignored or refused
            while True:
                now = self.now()
                until = stage_deadline
                if remind_every is not None and remind is not None:
                    if next_remind is None:
                        next_remind = now + timedelta(seconds=seconds(remind_every))
                    until = min(until, next_remind)
                got = await self._receive(signal, timeout=max((until - now).total_seconds(), 0.0))
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
                        self._journal_refusal(verdict)
                        continue  # keep waiting, to the same deadline
                    return ApprovalDecision(
                        approved=verdict.approve,
                        by=verdict.by,
                        at=self.now(),
                        note=verdict.note,
                        via="decision",
                        stage=stage,
                        verified=verdict.verified,
                    )
                if self.now() >= stage_deadline:
                    break
                assert remind is not None
                await self.step(remind, approver, name)  # a reminder
                next_remind = None
            nxt = approvers[stage + 1] if stage + 1 < len(approvers) else None
            if escalate is not None:
                await self.step(escalate, approver, nxt, name)
        if on_timeout == "fail":
            raise ApprovalTimeout(
                f"approval '{name}' got no decision from {list(approvers)}", run_id=self.run_id
            )
        return ApprovalDecision(
            approved=on_timeout == "approve",
            by="policy",
            at=self.now(),
            note=f"no decision before the last deadline: {on_timeout}",
            via="policy",
            stage=len(approvers) - 1,
        )

    async def poll(
        self,
        check: Callable[..., Awaitable[R | None]] | Callable[..., R | None],
        /,
        *args: Any,
        every: Duration,
        backoff: float = 2.0,
        max_interval: Duration | None = None,
        timeout: Duration | None = None,
        **kwargs: Any,
    ) -> R:
        """Poll an external job: run ``check(*args, **kwargs)`` as a step until it returns
        something other than ``None``, pausing ``every`` (times ``backoff`` after each check,
        at most ``max_interval``) on a broker timer between checks, never in a process.

        Every check counts against the run's poll cap (``@agent(..., poll_cap=N)``, default
        1000): a run that reaches it is *suspended* (visible in ``sojourn status``), not failed
        and not left polling; ``sojourn resume RUN`` grants it another ``N`` checks.

        Raises:
            PollTimeout: ``timeout`` passed before the job finished.
        """
        if backoff < 1.0:
            raise ValueError("backoff must be >= 1.0")
        interval = seconds(every)
        cap_interval = None if max_interval is None else seconds(max_interval)
        deadline = None if timeout is None else self.now() + timedelta(seconds=seconds(timeout))
        while True:
            await self._count_poll(getattr(check, "__name__", "check"))
            result: Any = await self.step(check, *args, **kwargs)
            if result is not None:
                return cast(R, result)
            if not self.replaying:
                _metrics.IDLE_POLLS.labels(_metrics.agent_label(self.agent)).inc()
            if deadline is not None:
                left = (deadline - self.now()).total_seconds()
                if left <= 0:
                    raise PollTimeout(
                        f"poll of {getattr(check, '__name__', 'check')} timed out",
                        run_id=self.run_id,
                    )
                pause = min(interval, left)
            else:
                pause = interval
            # Its own wait key, so that history (and the watchdog) can count idle polls.
            await self._wait(WaitKey.poll(), timeout=pause)
            interval *= backoff
            if cap_interval is not None:
                interval = min(interval, cap_interval)

    def _journal_refusal(self, refused: ApprovalRefused) -> None:
        """Record a refused decision in the run's history (a ``refusal`` value), for the audit."""
        self._value("refusal", lambda: refused, ApprovalRefused)

    async def _count_poll(self, what: str) -> None:
        suspend = self._m.count_poll(what, self._driver.time())
        if suspend is not None:
            if suspend.unit is not None:
                _metrics.BUDGET_BREACHES.labels(self._driver.metric_agent, suspend.unit).inc()
            await self._driver.suspend(suspend.event)
