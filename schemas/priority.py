"""Run priorities (decision 0049): 1 (most urgent) to 5 (bulk), 3 by default.

A run's priority is chosen at its start and kept for its life: its start, its wakes (timers,
signals, children's ends, re-wakes) and its children's starts travel on the broker lane of that
priority, and a worker takes from the more urgent lanes first. Priority 3 is the lane sojourn
always had (the subjects without a lane token); 1, 2, 4 and 5 have a ``p<n>`` token of their own
(``docs/wire.md``, "Priorities").

Pure: the type, its bounds, and the lane token; no I/O.
"""

from __future__ import annotations

import typing
from typing import Literal

from .errors import InvalidName

__all__ = [
    "LANED",
    "PRIORITIES",
    "PRIORITY_DEFAULT",
    "Priority",
    "lane_token",
    "parse_lane_token",
    "validate_priority",
]

Priority = Literal[1, 2, 3, 4, 5]
"""1 is the most urgent, 5 the least; 3 is the default."""

PRIORITIES: tuple[Priority, ...] = typing.get_args(Priority)
"""Every priority, most urgent first: the order a worker's lanes are served in."""

PRIORITY_DEFAULT: Priority = 3

LANED: tuple[Priority, ...] = tuple(p for p in PRIORITIES if p != PRIORITY_DEFAULT)
"""The priorities with a lane token of their own (the default's subjects carry none)."""


def validate_priority(value: object) -> Priority:
    """``value`` if it is a priority (an int 1-5, not a bool), else ``InvalidName``."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        raise InvalidName(f"invalid priority {value!r}: use an integer from 1 (most urgent) to 5")
    return value


def lane_token(priority: Priority) -> str:
    """The subject token of a laned priority (``p1``); ``""`` for the default."""
    return "" if priority == PRIORITY_DEFAULT else f"p{priority}"


_TOKENS: dict[str, Priority] = {f"p{p}": p for p in LANED}


def parse_lane_token(token: str) -> Priority | None:
    """The priority a subject token names (``p1``, ``p2``, ``p4``, ``p5``), else ``None``."""
    return _TOKENS.get(token)
