"""Wakes: "this run has something to do" hints on ``<prefix>.wake.<run_id>``.

A wake is never the truth (the run's events are); a duplicate wake costs one history read. The
wake stream keeps one message per run subject, so a burst of wakes for one run is one delivery.
"""

from __future__ import annotations

from . import headers as h
from .connection import Broker
from .names import Names

__all__ = ["publish_wake"]


async def publish_wake(broker: Broker, names: Names, run_id: str, reason: str = "") -> int:
    """Durably ask some worker to look at ``run_id``; returns the wake's stream sequence."""
    headers = {h.WAKE_REASON: reason} if reason else None
    ack = await broker.publish(names.wake(run_id), b"", headers)
    return ack.seq
