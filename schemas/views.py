"""The read side's wire bodies: run summaries, run listings and resumable output chunks.

Workers write run histories; the projector (``sojourn projector``) folds them into these views
for everyone else. They are the contract for dashboards and clients in any language
(docs/wire.md, "The read side"; JSON Schemas from ``sojourn schemas``):

- ``RunView`` is the value of a run's key in the runs KV bucket and the body of each change
  message on ``<prefix>.runs.<agent>.<run_id>``;
- ``RunsQuery`` / ``RunsPage`` are the request and answer of the run listing service;
- ``Chunk`` is one message of a run's output stream (``ctx.stream`` / ``ctx.progress``).

Like the events they are open for readers (unknown fields are ignored, so a newer projector's
view still decodes) and grow only by fields with defaults. A query is a command, hence closed.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from .fairness import Fairness
from .health import LivenessState
from .priority import PRIORITY_DEFAULT, Priority
from .vocabulary import RunStatus, SuspendReason

__all__ = [
    "CHILDREN_SHOWN",
    "CHUNK_KINDS",
    "ERROR_MESSAGE_MAX",
    "QUERY_LIMIT_MAX",
    "Chunk",
    "ChunkKind",
    "RunView",
    "RunsPage",
    "RunsQuery",
    "ViewError",
]

CHILDREN_SHOWN: Final = 100
"""Child run ids a view lists (``children_count`` counts them all): a view stays small."""

ERROR_MESSAGE_MAX: Final = 4096
"""Characters of an error message a view keeps (the history keeps it whole)."""

QUERY_LIMIT_MAX: Final = 1000
"""Most runs one listing answer holds; page on with ``RunsPage.next``."""


class ViewError(msgspec.Struct, frozen=True, kw_only=True):
    """Why a run failed, or why its current step's last attempt failed: type and message."""

    type: str
    message: str


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """A run as the read side shows it: the KV value of key ``<run_id>`` and a change body.

    Attributes:
        status: ``pending`` (its start is stored, no worker has taken it yet), ``running``,
            ``waiting``, ``suspended``, ``completed``, ``failed`` or ``cancelled``.
        liveness: the watchdog's judgement (``sojourn.schemas.health.LivenessState``) as the
            projector last made it: it changes with time, not only with events.
        waiting_on: what a waiting run waits for (``WaitingOn`` entries, formatted:
            ``signal:docs.signed``, ``timer``, ``child:<run_id>``, ``retry:<step>``...).
        step: the step started and not yet settled; ``step_attempt`` its attempt.
        suspended_reason: why a suspended run is (a ``SuspendReason``; ``other`` for a reason
            the projector does not know), ``suspended_detail`` in words.
        steps_done: steps completed; ``attempts``: step attempts started, retries included.
        spent_usd / spent_tokens: what ``ctx.spend`` recorded; ``budget_usd`` /
            ``budget_tokens`` the agent's budget in effect (grants from resumes included),
            ``None`` without one.
        children: child run ids, the first ``CHILDREN_SHOWN``; ``children_count`` all.
        updated_at: the time of the last event applied (unix seconds).
        last_seq: the events-stream sequence of the last decision applied (0 while pending):
            views of one run only ever move forward in it.
        archived: the run ended long ago and left the hot streams (retention,
            ``Settings.retain_ended``): its history is read from the archive (or, archived
            with the ``discard`` policy, is gone). Written by the archiver, never by the
            projector; absent (``false``) in views written before retention existed.
    """

    run_id: str
    agent: str
    status: RunStatus
    liveness: LivenessState | None = None
    parent_run_id: str | None = None
    children: tuple[str, ...] = ()
    children_count: int = 0
    waiting_on: tuple[str, ...] = ()
    waiting_since: float | None = None
    deadline: float | None = None
    step: str | None = None
    step_position: int | None = None
    step_attempt: int = 0
    steps_done: int = 0
    attempts: int = 0
    retries: int = 0
    signals_buffered: int = 0
    cancel_requested: bool = False
    suspended_reason: SuspendReason | None = None
    suspended_detail: str | None = None
    spent_usd: float = 0.0
    spent_tokens: int = 0
    budget_usd: float | None = None
    budget_tokens: int | None = None
    error: ViewError | None = None
    code_version: str | None = None
    started_at: float = 0.0
    updated_at: float = 0.0
    ended_at: float | None = None
    last_seq: int = 0
    events: int = 0
    archived: bool = False
    schedule: str | None = None
    scheduled_at: float | None = None
    """For a run a schedule started: the schedule and the fire time (``RunStarted``)."""
    forked_from: str | None = None
    forked_at: int | None = None
    """For a fork (``sojourn fork``): the run it was forked from and the position it
    re-executed from (``RunStarted.forked_from``)."""
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    """The run's search attributes (``sojourn.schemas.attributes``): given at its start,
    upserted by ``ctx.set_attributes``; ``{}`` in views written before they existed."""
    detail: str | None = None
    """A pending run queued on its concurrency key (decision 0048): ``queued on key K,
    position P`` (``queued on key K`` until the projector has counted its place)."""
    queue_position: int | None = None
    """Its place in its key's queue (1: next to take a slot) as the projector last counted
    it, on its periodic pass (``sojourn status`` counts it live)."""
    priority: Priority = PRIORITY_DEFAULT
    """The run's priority, 1 (most urgent) to 5 (bulk): the lane of its start and wakes
    (``RunStarted.priority``, decision 0049); for a pending run, its start's lane."""
    fairness: Fairness | None = None
    """Its fairness key and weight (``RunStarted.fairness``), if it was started with one."""


class RunsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A run listing request (``<prefix>.query.runs``): runs matching every filter given,
    most recently updated first.

    Attributes:
        since: only runs updated at or after this time (unix seconds).
        after: the ``next`` cursor of the previous page.
        limit: at most this many runs (1 to ``QUERY_LIMIT_MAX``).
    """

    agent: str | None = None
    status: tuple[RunStatus, ...] = ()
    liveness: tuple[LivenessState, ...] = ()
    parent_run_id: str | None = None
    schedule: str | None = None
    """Only the runs this schedule started."""
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    """Only the runs whose attributes have each of these keys with a value of this text
    (``sojourn.schemas.attributes.attribute_text``: ``"42"``, ``"true"``, ``"gold"``)."""
    since: float | None = None
    after: str | None = None
    limit: int = 100


class RunsPage(msgspec.Struct, frozen=True, kw_only=True):
    """A listing answer: the runs, and ``next`` (pass it as ``after``) when there are more.
    ``position`` is how far into the events stream the answering read model is."""

    runs: tuple[RunView, ...] = ()
    next: str | None = None
    position: int = 0


ChunkKind = Literal["text", "progress"]
CHUNK_KINDS: tuple[ChunkKind, ...] = ("text", "progress")


class Chunk(msgspec.Struct, frozen=True, kw_only=True):
    """One piece of a run's output stream (``<prefix>.out.<run_id>``).

    A reader's offset is the message's stream sequence (``Client.stream(after=...)``).
    ``position`` and ``attempt`` name the step execution that wrote it, and ``execution`` the
    events-stream sequence of that execution's start: a step executed again after a crash
    writes under a new ``execution`` (restarting ``index`` at 0), so a reader that sees one
    knows the earlier chunks of that step were superseded.

    Attributes:
        kind: ``text`` (``ctx.stream(text)``: tokens, to be concatenated) or ``progress``
            (``ctx.progress(...)``: a JSON value, each superseding the last).
        index: 0, 1, 2... within one execution.
        value: a progress chunk's JSON value; ``null`` on a text chunk. (Not ``Raw | None``:
            msgspec cannot decode a ``Raw`` inside a union, so that type refused every
            progress chunk. The wire form is the same.)
    """

    run_id: str
    position: int
    attempt: int
    execution: int
    index: int
    kind: ChunkKind = "text"
    text: str = ""
    value: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    at: float = 0.0
