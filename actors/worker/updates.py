"""The intake's side of an update (``client.update``, decision 0042): the message's body
checked, and the ``UpdateRequested`` it records, once per update id.

The run's code decides the update later, at its next wait (``actors/agents/updates.py``);
the caller reads the answer from the run's history. Pure but for the clock the caller passes.
"""

from __future__ import annotations

import msgspec

from sojourn.broker.names import InboxSubject
from sojourn.schemas.codec import decode_update
from sojourn.schemas.config import Settings
from sojourn.schemas.events import UpdateRequested
from sojourn.schemas.updates import UPDATE_ID_MAX, UpdateBody, valid_update_id

from ..core.state import RunState, UpdateRecord
from .refusals import Rejected

__all__ = ["known_update", "update_body", "update_requested"]


def update_body(data: bytes) -> UpdateBody:
    """An update message's body, checked.

    Raises:
        Rejected: ``invalid_json`` (not JSON) or ``invalid_trigger`` (not an update body, or
            an update id that is not 1 to 128 of ``[A-Za-z0-9_.:-]``).
    """
    shape = 'update body must be {"update_id": "...", "payload": ...}'
    if not data.strip():
        raise Rejected("invalid_trigger", f"{shape}: the body is empty")
    try:
        body = decode_update(data)
    except msgspec.ValidationError as e:
        raise Rejected("invalid_trigger", f"{shape}: {e}") from e
    except msgspec.DecodeError as e:
        raise Rejected("invalid_json", f"update body is not valid JSON: {e}") from e
    if not valid_update_id(body.update_id):
        raise Rejected(
            "invalid_trigger",
            f"an update id is 1 to {UPDATE_ID_MAX} characters of letters, digits and -_.:",
        )
    return body


def known_update(state: RunState, update_id: str) -> UpdateRecord | None:
    """The run's record of the update ``update_id``, if it received one."""
    return next((u for u in state.updates if u.update_id == update_id), None)


def update_requested(
    body: UpdateBody,
    inbox: InboxSubject,
    state: RunState,
    *,
    settings: Settings,
    authenticated: bool,
    now: float,
) -> UpdateRequested:
    """The event an update records in a live run that has not received it yet.

    Raises:
        Rejected: ``too_many_signals``: the run holds ``Settings.max_buffered_signals``
            updates it has not decided yet.
    """
    pending = sum(1 for u in state.updates if u.outcome == "pending")
    if pending >= settings.max_buffered_signals:
        raise Rejected(
            "too_many_signals",
            f"run holds {pending} undecided updates (the limit is "
            f"{settings.max_buffered_signals}, Settings.max_buffered_signals)",
        )
    return UpdateRequested(
        update_id=body.update_id,
        name=inbox.name,
        payload=body.payload,
        sent_by=inbox.sender,
        sender_verified=inbox.sender is not None and authenticated,
        at=now,
    )
