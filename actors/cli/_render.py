"""What the CLI prints: event timelines, times, one-line texts, a run's status and liveness.

Pure functions of their arguments (and, for "N s ago", of the clock), shared by the commands
and by ``sojourn demo``; nothing here talks to the broker.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from sojourn.schemas import events
from sojourn.schemas.health import Liveness
from sojourn.schemas.vocabulary import BUDGET_LIMITS, BudgetLimit, ValueKind

from ..client.reports import iso, pending_json, public_status, status_json
from ..core.state import RunState
from ..history.pending import PendingRun

__all__ = [
    "clock",
    "describe_event",
    "iso",
    "liveness_line",
    "one_line",
    "out",
    "pending_json",
    "pending_rows",
    "public_status",
    "short",
    "spend_text",
    "stamp",
    "status_json",
    "status_rows",
]


_REFUSAL: ValueKind = "refusal"
"""The value kind of a decision ``ctx.approval`` refused."""

_ALWAYS_SPENT: tuple[BudgetLimit, ...] = ("usd", "tokens")
"""The spending ``sojourn status`` shows without a limit on it."""


def out(*parts: object) -> None:
    print(*parts, flush=True)


def clock(at: float) -> str:
    """``HH:MM:SS.mmm`` (UTC) of a unix time."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def stamp(at: float | None) -> str:
    """``YYYY-MM-DD HH:MM:SS.mmm UTC`` of a unix time, ``-`` for none."""
    if not at:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def short(raw: Any, limit: int = 60) -> str:
    """A stored JSON value as text, cut to ``limit`` characters."""
    text = bytes(raw).decode(errors="replace") if raw is not None else "null"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def describe_event(e: events.RunEvent) -> tuple[str, str]:
    """An event's type name and its key fields, for timelines."""
    match e:
        case events.RunStarted():
            version = f" version={e.code_version}" if e.code_version else ""
            by = f" by={e.trigger.sent_by}" if e.trigger.sent_by else ""
            detail = f"agent={e.agent}{version}{by} input={short(e.input)}"
            if e.previous_run_id:
                detail += f" continues={e.previous_run_id} generation={e.generation}"
            if e.forked_from is not None:
                detail += f" forked_from={e.forked_from.run_id} pos={e.forked_from.position}"
        case events.StepStarted():
            detail = f"{e.name} pos={e.position} attempt={e.attempt}"
            if e.limit is not None:
                detail += f" limit={e.limit} slot={stamp(e.slot)}"
        case events.StepThrottled():
            detail = (
                f"{e.name} pos={e.position} attempt={e.attempt} waits for limit {e.limit} "
                f"until {stamp(e.slot)}"
            )
        case events.StepCompleted():
            detail = (
                f"{e.name} pos={e.position} attempt={e.attempt} took={e.duration:.3f}s"
                f" -> {short(e.result, 40)}"
            )
        case events.StepFailed():
            detail = (
                f"{e.name} pos={e.position} attempt={e.attempt} took={e.duration:.3f}s"
                f" error={e.error.type}: {one_line(e.error.message)}"
            )
        case events.ValueRecorded() if e.kind == _REFUSAL:  # a decision ctx.approval refused
            detail = f"refused pos={e.position}: {short(e.value, 160)}"
        case events.ValueRecorded():
            detail = f"ctx.{e.kind}() pos={e.position} = {short(e.value, 40)}"
        case events.RunCompleted():
            detail = f"output={short(e.output)}"
            if e.continued_as:
                detail = f"continued as {e.continued_as}"
        case events.RunFailed():
            detail = f"error={e.error.type}: {one_line(e.error.message)}"
        case events.CancelRequested():
            detail = f"reason={e.reason!r}" + (f" by={e.by}" if e.by else "")
            detail += " terminate" if e.terminate else ""
        case events.RunCancelled():
            detail = f"reason={e.reason!r}" + (" terminated" if e.terminated else "")
            if e.compensation_error is not None:
                err = e.compensation_error
                detail += f" compensation_error={err.type}: {one_line(err.message)}"
        case events.RunSuspended():
            detail = f"reason={e.reason}: {one_line(e.detail)}"
        case events.RunResumed():
            detail = (f"by={e.by} " if e.by else "") + (f"note={e.note!r}" if e.note else "")
        case _:  # waits, signals, children and any later event type: its fields
            detail = _fields(e)
    return type(e).__name__, detail.strip()


def _fields(e: events.RunEvent) -> str:
    """``key=value`` of an event's non-empty fields (JSON payloads shortened)."""
    parts = []
    for name in e.__struct_fields__:
        value = getattr(e, name)
        if name == "at" or value is None or value == ():
            continue
        if isinstance(value, msgspec.Raw):
            text = short(value, 40)
        elif isinstance(value, float) and name in ("deadline",):
            text = clock(value)
        elif isinstance(value, tuple):
            text = ",".join(map(str, value))
        else:
            text = str(value)
        parts.append(f"{'pos' if name == 'position' else name}={text}")
    return " ".join(parts)


def pending_rows(pending: PendingRun) -> list[tuple[str, str]]:
    """The rows of ``sojourn status`` for a pending run."""
    queued = stamp(pending.queued_at)
    if pending.queued_at:
        queued += f" ({max(time.time() - pending.queued_at, 0.0):.1f}s ago)"
    return [
        ("run", pending.run_id),
        ("agent", pending.agent),
        ("status", "pending"),
        ("queued", queued),
        ("note", f"its start is stored; it runs when a worker serving {pending.agent} takes it"),
    ]


def spending(state: RunState) -> dict[BudgetLimit, float]:
    """What a run used, per budget limit (as its run machine counts it)."""
    return {
        "usd": state.spent_usd,
        "tokens": state.spent_tokens,
        "input_tokens": state.spent_input_tokens,
        "output_tokens": state.spent_output_tokens,
        "steps": state.step_attempts,
        "tool_calls": state.tool_calls,
    }


def spend_text(state: RunState) -> str | None:
    """What the run used against its budget in effect, ``None`` when it spent nothing and has
    no budget: ``0.8 usd of 1, 300 tokens, 12 steps of 50``."""
    used = spending(state)
    budget = state.budget
    parts = []
    for unit in BUDGET_LIMITS:
        limit = None if budget is None else getattr(budget, unit)
        spent = used.get(unit)
        if limit is None and not (unit in _ALWAYS_SPENT and spent):
            continue
        name = unit.replace("_", " ")
        if spent is None:  # polls, wall time: counted by the run as it goes
            assert limit is not None
            parts.append(f"{name} limit {limit * state.grants:g}")
        elif limit is None:
            parts.append(f"{spent:g} {name}")
        else:
            parts.append(f"{spent:g} {name} of {limit * state.grants:g}")
    if not parts:
        return None
    text = ", ".join(parts)
    if state.grants > 1 and budget is not None:
        text += f" (budget granted {state.grants} times)"
    return text


def status_rows(state: RunState, liv: Liveness, run_id: str) -> list[tuple[str, str]]:
    """The rows of ``sojourn status``: (label, value), in display order."""
    live = liv.state + (f": {one_line(liv.reason)}" if liv.reason else "")
    if liv.owner:
        live += f" (owner {liv.owner}"
        if liv.last_heartbeat:
            live += f", last heartbeat {time.time() - liv.last_heartbeat:.1f}s ago"
        live += ")"
    rows: list[tuple[str, str]] = [
        ("run", state.run_id or run_id),
        ("agent", state.agent + (f" (version {state.code_version})" if state.code_version else "")),
        ("status", public_status(state)),
        ("liveness", live),
        ("steps", f"{state.steps_completed} completed, {state.step_attempts} attempts"),
    ]
    spend = spend_text(state)
    if spend is not None:
        rows.append(("spend", spend))
    last = state.ops[-1] if state.ops else None
    if state.status == "running" and last is not None and last.status == "started":
        rows.append(("executing", f"{last.name} pos={last.position} attempt={last.attempts}"))
    if liv.details is not None:
        rows.append(("progress", short(liv.details, 200)))
    if state.status == "waiting":
        rows.append(("waiting on", ", ".join(state.waiting_on) or "-"))
        if state.deadline is not None:
            left = state.deadline - time.time()
            rows.append(("deadline", f"{stamp(state.deadline)} (in {max(left, 0.0):.1f}s)"))
    if state.signals:
        rows.append(("signals", "buffered: " + ", ".join(r.name for r in state.signals)))
    if state.children:
        rows.append(("children", ", ".join(state.children)))
    if state.parent_run_id:
        rows.append(("parent", state.parent_run_id))
    if state.continued_as:
        rows.append(("continued as", f"{state.continued_as} (ended by ctx.continue_as_new)"))
    if state.forked_from is not None:
        origin = state.forked_from
        rows.append(("forked from", f"{origin.run_id} at pos={origin.position}"))
    if state.chain_root:
        chain = f"generation {state.generation} of {state.chain_root}"
        rows.append(("chain", chain + f", continuing {state.previous_run_id}"))
    rows.append(("started", stamp(state.started_at)))
    ended = stamp(state.ended_at)
    if state.ended_at and state.started_at:
        ended += f" (after {state.ended_at - state.started_at:.3f}s)"
    rows.append(("ended", ended))
    if state.cancel_requested is not None and state.status != "cancelled":
        rows.append(("cancel", f"requested: {state.cancel_requested}"))
    if state.suspended_reason:
        rows.append(
            ("suspended", f"{state.suspended_reason}: {one_line(state.suspended_detail or '')}")
        )
    rows.append(
        ("error", f"{state.error.type}: {one_line(state.error.message)}" if state.error else "-")
    )
    rows.append(("output", bytes(state.output).decode() if state.output is not None else "-"))
    return rows


def liveness_line(liv: Liveness) -> str:
    """One line of ``sojourn watchdog``: a run's liveness, owner, step and reason."""
    parts = [f"{liv.run_id:<24} {liv.agent or '?':<16} {liv.state:<9}"]
    if liv.owner:
        beat = (
            f", last heartbeat {time.time() - liv.last_heartbeat:.1f}s ago"
            if (liv.last_heartbeat)
            else ""
        )
        parts.append(f"owner {liv.owner}{beat}")
    if liv.step:
        parts.append(f"step {liv.step}")
    if liv.on:
        parts.append("on " + ", ".join(liv.on))
    if liv.reason:
        parts.append(one_line(liv.reason))
    return "  ".join(parts)
