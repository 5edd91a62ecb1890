"""The JSON reports of a run that the CLI prints (``sojourn status --json``, ``sojourn history
--json``) and the HTTP gateway answers with: one definition, so both always say the same."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from sojourn.broker.eventstore import Decision
from sojourn.schemas.concurrency import queued_detail
from sojourn.schemas.errors import RunNotFound

from ..core.state import RunState
from ..history.pending import PendingRun

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "history_report",
    "iso",
    "lookup",
    "pending_json",
    "public_status",
    "status_json",
    "status_report",
]


def iso(at: float | None) -> str | None:
    """ISO 8601 (UTC, milliseconds) of a unix time, ``None`` for none."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds") if at else None


def public_status(state: RunState) -> str:
    return "pending" if state.status == "new" else state.status


def status_json(state: RunState, run_id: str) -> dict[str, Any]:
    """``sojourn status --json`` without its ``liveness`` member."""
    error = state.error
    return {
        "run_id": state.run_id or run_id,
        "agent": state.agent,
        "status": public_status(state),
        "steps_completed": state.steps_completed,
        "step_attempts": state.step_attempts,
        "events": state.events,
        "output": state.output,
        "error": None
        if error is None
        else {"type": error.type, "message": error.message, "traceback": error.traceback},
        "started_at": iso(state.started_at),
        "ended_at": iso(state.ended_at),
        "updated_at": iso(state.updated_at),
        "code_version": state.code_version,
        "cancel_requested": state.cancel_requested,
        "waiting_on": list(state.waiting_on),
        "deadline": iso(state.deadline),
        "buffered_signals": [r.name for r in state.signals],
        "children": list(state.children),
        "continued_as": state.continued_as,
        "chain_root": state.chain_root,
        "generation": state.generation,
        "forked_from": None
        if state.forked_from is None
        else {"run_id": state.forked_from.run_id, "position": state.forked_from.position},
        "parent_run_id": state.parent_run_id,
        "suspended_reason": state.suspended_reason,
        "suspended_detail": state.suspended_detail,
        "spent_usd": state.spent_usd,
        "spent_tokens": state.spent_tokens,
        "budget_usd": state.granted_usd,
        "budget_tokens": state.granted_tokens,
        "spent_input_tokens": state.spent_input_tokens,
        "spent_output_tokens": state.spent_output_tokens,
        "model_calls": state.model_calls,
        "tool_calls": state.tool_calls,
        "budget": None
        if state.budget is None
        else {k: v for k, v in msgspec.structs.asdict(state.budget).items() if v is not None},
        "queued_at": None,
        "anomalies": list(state.anomalies),
        "priority": state.priority,
        "fairness": None
        if state.fairness is None
        else {"key": state.fairness.key, "weight": state.fairness.weight},
    }


def pending_json(pending: PendingRun) -> dict[str, Any]:
    """``sojourn status --json`` of a pending run (its start stored, not yet taken): the keys
    of any run's, empty where nothing is known yet, and ``queued_at``."""
    state = RunState(run_id=pending.run_id, agent=pending.agent, priority=pending.priority)
    body = status_json(state, pending.run_id)
    body["status"] = "pending"
    body["queued_at"] = iso(pending.queued_at)
    return body


async def lookup(client: Client, run_id: str) -> RunState | PendingRun:
    """The run's state, or its stored start while it is pending (no worker took it yet).

    Raises:
        RunNotFound: neither a history nor a stored start.
    """
    for _ in range(2):  # a start taken between the two looks: the run has a history now
        try:
            return await client.state(run_id)
        except RunNotFound:
            pending = await client.pending(run_id)
            if pending is not None:
                return pending
    raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)


async def status_report(client: Client, run_id: str) -> dict[str, Any]:
    """``sojourn status RUN --json``: the run's state (or its pending start) and liveness.

    Raises:
        RunNotFound: neither a history nor a stored start.
    """
    state = await lookup(client, run_id)
    if isinstance(state, PendingRun):
        body = pending_json(state)
        body["liveness"] = None
        return body
    body = status_json(state, run_id)
    body["liveness"] = msgspec.to_builtins(await client.liveness(run_id))
    where = await client.queued(state)  # queued on its concurrency key (decision 0048)
    if where is not None:
        body["detail"] = queued_detail(*where)
        body["queue"] = {"key": where[0], "position": where[1]}
    return body


def history_report(history: list[Decision]) -> list[dict[str, Any]]:
    """``sojourn history RUN --json``: every decision, its sequence, writer and events."""
    return [{"seq": d.seq, "writer": d.writer, "events": list(d.events)} for d in history]
