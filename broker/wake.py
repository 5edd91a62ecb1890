"""Wakes: "this run has something to do" hints on ``<prefix>.wake.<agent>.<run_id>``.

A wake is never the truth (the run's events are); a duplicate wake costs one history read. The
wake stream keeps one message per run subject, so a burst of wakes for one run is one delivery.
Wakes are routed by agent: each agent's wakes have their own durable consumer, pulled only by
the workers that serve it.
"""

from __future__ import annotations

from sojourn.schemas.fairness import Fairness, fairness_headers
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.vocabulary import WakeReason, wake_reason

from . import headers as h
from .connection import Broker
from .names import Names

__all__ = ["publish_wake"]


async def publish_wake(
    broker: Broker,
    names: Names,
    run_id: str,
    reason: WakeReason,
    detail: str = "",
    *,
    agent: str | None,
    priority: Priority = PRIORITY_DEFAULT,
    fairness: Fairness | None = None,
) -> int:
    """Durably ask a worker serving ``agent`` to look at ``run_id`` for ``reason`` (with
    ``detail``: header ``Sojourn-Wake-Reason``, see ``wake_reason``); returns the wake's stream
    sequence. ``agent=None`` (the run's agent is not known here) asks any worker; one that does
    not serve the run hands it back, so pass the agent whenever it is known. ``priority``: the
    run's (``RunStarted.priority``), whose lane the wake goes on, and ``fairness`` its key, which
    the wake carries (decision 0049)."""
    headers = {h.WAKE_REASON: wake_reason(reason, detail), **fairness_headers(fairness)}
    ack = await broker.publish(names.wake(run_id, agent, priority), b"", headers)
    return ack.seq
