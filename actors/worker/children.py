"""A run's children and its parent: what an activation tells them, and asks of them.

How an ended run looks to its parent (``outcome_of``; ``child_outcome`` reads it from a child's
history), the end notice a child sends its parent (``tell_parent``) and the cancel that
cascades from a cancelled run to its live children (``cascade_cancel``). Each message has a
deterministic Msg-Id, so an activation that does them again changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from sojourn.broker.eventstore import EventStore
from sojourn.broker.headers import MSG_ID
from sojourn.schemas.codec import decode_events, encode, to_raw
from sojourn.schemas.events import RunCancelled, RunCompleted, RunFailed
from sojourn.schemas.wire import CancelBody, ChildOutcome, ErrorBody

from ..core.state import RunState
from ..core.steps import clip_text
from ..history.chain import current_run
from ..history.values import values_for

__all__ = ["cascade_cancel", "child_outcome", "outcome_of", "tell_parent"]

_NULL = to_raw(None)


async def cascade_cancel(
    store: EventStore, run_id: str, s: RunState, children: Iterable[str], sender: str
) -> None:
    """Cancel the children of the cancelled run ``run_id`` (its state ``s``) that have not
    ended, as one: a terminate cascades as a terminate."""
    for child in children:
        if await child_outcome(store, child) is None:
            await store.broker.publish(
                store.names.cancel(child, sender),
                encode(
                    CancelBody(
                        reason=f"parent {run_id} cancelled",
                        terminate=s.terminate_requested,  # a terminate cascades as one
                    )
                ),
                {MSG_ID: f"cascade:{child}"},
            )


async def tell_parent(store: EventStore, run_id: str, s: RunState, sender: str) -> None:
    """Send the parent of the ended run ``run_id`` (its state ``s``) its end notice, under the
    id the parent knows the chain by."""
    assert s.parent_run_id
    child = s.chain_root or run_id  # the id the parent knows the chain by
    outcome = outcome_of(child, s)
    await store.broker.publish(
        store.names.child_end(s.parent_run_id, child, sender),
        encode(outcome),
        {MSG_ID: f"child-end:{child}"},
    )


def _error_body(code: str, message: str) -> ErrorBody:
    """An error as a parent sees it, clipped: a child's end notice stays bounded."""
    return ErrorBody(code=clip_text(code, 200), message=clip_text(message))


def outcome_of(run_id: str, s: RunState) -> ChildOutcome:
    """How an ended run looks to its parent. Its size is at most ``Settings.max_child_notice``
    for a run whose output was checked against ``max_value``."""
    if not s.terminal:
        raise ValueError(f"run {run_id} has not ended ({s.status})")
    if s.status == "completed":
        return ChildOutcome(child_run_id=run_id, status="completed", output=s.output or _NULL)
    if s.status == "failed":
        err = s.error
        body = _error_body(err.type if err else "error", err.message if err else "")
        return ChildOutcome(child_run_id=run_id, status="failed", output=_NULL, error=body)
    return ChildOutcome(
        child_run_id=run_id,
        status="cancelled",
        output=_NULL,
        error=_error_body("cancelled", s.cancel_requested or ""),
    )


async def child_outcome(store: EventStore, child_id: str) -> ChildOutcome | None:
    """The outcome of ``child_id`` if its history says it ended, else ``None``: of its
    chain's last run, if it continued as new (with its output read back if it is stored by
    reference)."""
    _, last = await current_run(store.broker, store.names, child_id)
    if last is None:
        return None
    events = decode_events(last.data)
    for e in events:
        if isinstance(e, RunCompleted):
            if e.output_ref is not None:
                values = values_for(store.broker, store.names, store.settings)
                e = await values.resolve_one(e)
            return ChildOutcome(child_run_id=child_id, status="completed", output=e.output)
        if isinstance(e, RunFailed):
            return ChildOutcome(
                child_run_id=child_id,
                status="failed",
                output=_NULL,
                error=_error_body(e.error.type, e.error.message),
            )
        if isinstance(e, RunCancelled):
            return ChildOutcome(
                child_run_id=child_id,
                status="cancelled",
                output=_NULL,
                error=_error_body("cancelled", e.reason),
            )
    return None
