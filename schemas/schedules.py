"""Recurring schedules: what a client asks for, what the broker keeps, what the intake answers.

A schedule is broker-kept state (docs/wire.md "Schedules"): one ``ScheduleRecord`` per name on
``<prefix>.schedule.rec.<name>``, rewritten (compare-and-set on the subject's sequence) by every
change and every fire, and one pending one-shot message schedule, its next fire. Requests travel
through the inbox on ``<prefix>.as.<sender>.schedule.<name>`` as a ``ScheduleRequest``; the
intake answers each with a ``ScheduleAnswer`` (or an ``IntakeError``).
"""

from __future__ import annotations

import typing
from typing import Literal

import msgspec

from .wire import BudgetBody

__all__ = [
    "CATCH_UPS",
    "FIRE_OUTCOMES",
    "OVERLAPS",
    "SCHEDULE_ACTIONS",
    "CatchUp",
    "FireOutcome",
    "Overlap",
    "ScheduleAction",
    "ScheduleAnswer",
    "ScheduleCounts",
    "ScheduleRecord",
    "ScheduleRequest",
    "ScheduleSpec",
]

Overlap = Literal["skip", "allow", "cancel-previous"]
"""What a fire does while the schedule's previous run is still live: ``skip`` starts nothing
(the fire is counted skipped), ``allow`` starts another run, ``cancel-previous`` asks for the
live run to be cancelled, then starts the new one."""
OVERLAPS: tuple[Overlap, ...] = typing.get_args(Overlap)

CatchUp = Literal["latest", "none", "all"]
"""What a fire handled late does with the fire times that passed meanwhile (the broker or every
worker was down): ``latest`` starts one run, for the most recent of them; ``all`` one run for each
(at most ``CATCH_UP_MAX``, the newest); ``none`` starts a run only for a fire that is on time,
so fires missed during an outage are dropped. The others are counted ``missed``."""
CATCH_UPS: tuple[CatchUp, ...] = typing.get_args(CatchUp)

FireOutcome = Literal["started", "skipped", "missed", "failed"]
"""What became of one fire time: a run ``started``; ``skipped`` by the overlap policy;
``missed``, dropped by the catch-up policy; ``failed``: no run could be started (its input no
longer fits the agent, say), recorded with a dead letter."""
FIRE_OUTCOMES: tuple[FireOutcome, ...] = typing.get_args(FireOutcome)

ScheduleAction = Literal["add", "pause", "resume", "trigger", "delete"]
SCHEDULE_ACTIONS: tuple[ScheduleAction, ...] = typing.get_args(ScheduleAction)

CATCH_UP_MAX = 100
"""The most runs one late fire starts under ``catch_up="all"``: the newest fire times; older ones
are counted missed."""

JITTER_MAX = 3600.0
"""The largest ``jitter`` a schedule may ask for, in seconds."""


class ScheduleSpec(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """What a schedule does, as a client sends it (closed: a misspelt field is an error).

    Exactly one of ``cron`` (5 or 6 fields, matched against the wall clock of ``timezone``)
    and ``every`` (whole seconds, at least 1, anchored on the Unix epoch) is set.
    """

    agent: str
    input: msgspec.Raw
    """Each run's input (JSON; ``null`` for none), checked against the agent's input type."""
    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"
    overlap: Overlap = "skip"
    catch_up: CatchUp = "latest"
    jitter: float = 0.0
    """Each fire happens up to this many seconds after its nominal time (the same delay for the
    same fire wherever it is computed); the run's id and ``scheduled_at`` stay nominal."""
    budget: BudgetBody | None = None
    """Limits for each run the schedule starts, as in a start (``StartTrigger.budget``)."""


class ScheduleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Body of ``<prefix>.as.<sender>.schedule.<name>``.

    ``add`` creates the schedule (``spec`` required; an existing one with another spec is
    refused unless ``replace``); ``pause`` stops its fires, ``resume`` restarts them from the
    next fire time after now; ``trigger`` fires it now (the overlap policy applies);
    ``delete`` removes it and its pending fire.
    """

    action: ScheduleAction
    spec: ScheduleSpec | None = None
    replace: bool = False


class ScheduleCounts(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Fire times of one schedule by outcome, since it was created."""

    started: int = 0
    skipped: int = 0
    missed: int = 0
    failed: int = 0


class ScheduleRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the broker keeps of one schedule (``<prefix>.schedule.rec.<name>``).

    Attributes:
        revision: raised by every ``add``, ``pause`` and ``resume``; a fire armed under an
            older revision is stale and does nothing.
        next_fire_at: the nominal time (Unix seconds) of the fire armed now; ``None`` while
            paused, or when the expression has no later fire.
        last_fire_at: the newest fire time handled (started, skipped or missed), by the timer.
        last_run_id: the run the schedule started last (by its timer or ``trigger``).
        last_runs: the runs the last fire decided to start: a fire handled again after a crash
            starts exactly these (each create-only).
        last_cancelled: the live run the last fire decided to cancel (``cancel-previous``),
            asked again if that fire is handled again.
        last_outcome: what became of the last fire time handled.
    """

    name: str
    spec: ScheduleSpec
    revision: int = 1
    paused: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    created_by: str | None = None
    next_fire_at: float | None = None
    last_fire_at: float | None = None
    last_run_id: str | None = None
    last_runs: tuple[str, ...] = ()
    last_cancelled: str | None = None
    last_outcome: FireOutcome | None = None
    counts: ScheduleCounts = ScheduleCounts()


class ScheduleAnswer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The intake's answer to a ``ScheduleRequest`` on ``Sojourn-Reply-To``.

    ``record`` is the schedule after the request (``None`` once deleted). For a ``trigger``:
    ``run_id`` and ``outcome`` (``started`` or ``skipped``) of the fire it made.
    """

    name: str
    action: ScheduleAction
    record: ScheduleRecord | None = None
    run_id: str | None = None
    outcome: FireOutcome | None = None
    changed: bool = True
    """``False`` for a request that found nothing to do (an ``add`` of the same spec again, a
    ``pause`` of a paused schedule)."""
