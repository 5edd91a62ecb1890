"""Holding every run of an agent: the operator's agent pause (docs/wire.md, "Agent holds").

``sojourn pause --agent A`` sends a ``HoldRequest`` on ``<prefix>.as.<sender>.hold.<agent>``
(admin role only where the deployment authenticates). A worker's intake records it as the
agent's ``AgentHold`` (``<prefix>.hold.<agent>``, the last message of that subject is the
agent's state), which every worker follows: a run of a held agent suspends itself (reason
``manual``) before its next step, and is listed on ``<prefix>.held.<agent>.<run_id>`` so
that the unpause can resume it. Who paused is the request subject's sender, never a field of
a body.
"""

from __future__ import annotations

import typing
from typing import Final, Literal

import msgspec

__all__ = [
    "HOLD_ACTIONS",
    "HOLD_REASON_MAX",
    "AgentHold",
    "HeldRun",
    "HoldAction",
    "HoldAnswer",
    "HoldRequest",
]

HoldAction = Literal["pause", "unpause"]
"""What a hold request asks: hold the agent's runs, or let them go on."""
HOLD_ACTIONS: tuple[HoldAction, ...] = typing.get_args(HoldAction)

HOLD_REASON_MAX: Final = 1024
"""Characters of a hold's reason (a longer one is refused)."""


class HoldRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Body of ``<prefix>.as.<sender>.hold.<agent>``."""

    action: HoldAction
    reason: str = ""


class AgentHold(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's hold as the intake recorded it (``<prefix>.hold.<agent>``): ``paused``, by
    whom (the authenticated sender of the request), why and when (unix seconds). A record
    with ``paused`` false is an unpause."""

    agent: str
    paused: bool
    by: str = ""
    reason: str = ""
    at: float = 0.0

    def detail(self) -> str:
        """The suspension detail a held run records."""
        by = f" by {self.by}" if self.by else ""
        why = f": {self.reason}" if self.reason else ""
        return f"agent {self.agent} paused{by}{why}; `sojourn unpause --agent {self.agent}` goes on"


class HeldRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run a hold suspended (``<prefix>.held.<agent>.<run_id>``): the unpause resumes it.
    Once resumed, its record is replaced by one with ``released`` true, which expires."""

    run_id: str
    at: float = 0.0
    released: bool = False


class HoldAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The intake's answer to a ``HoldRequest``: the agent's hold now, and how many held runs
    an unpause resumed."""

    agent: str
    paused: bool
    resumed: int = 0
