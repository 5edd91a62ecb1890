"""Shared rate limits: named budgets of requests and tokens per unit of time, kept by the
broker for a whole deployment (docs/guide.md, "Shared rate limits"; decision 0046).

A limit is declared by name (``Agent(limits=...)``, ``Worker(limits=...)``, or at run time with
``sojourn limit NAME --requests 500/min``) and used by steps and model requests
(``@step(limit="openai")``, ``ctx.llm(..., limit="openai")``). Its state is one record on
``<prefix>.limit.<name>`` (``LimitRecord``), changed only by compare-and-set: the rate, the
theoretical arrival times of the generic cell rate algorithm (``actors/core/ratelimit.py``) for
requests and for tokens, and a block a provider's 429 imposed on everyone. Times in the record
are integer nanoseconds since the epoch, so the spacing of grants is exact.
"""

from __future__ import annotations

import math
import re
import typing
from typing import Final, Literal

import msgspec

from .errors import InvalidName

__all__ = [
    "LIMITS_MAX",
    "LIMIT_ACTIONS",
    "LIMIT_BLOCK_MAX",
    "LIMIT_NAME_MAX",
    "NS",
    "Limit",
    "LimitAction",
    "LimitAnswer",
    "LimitRecord",
    "LimitRequest",
    "Rate",
    "parse_rate",
    "valid_limit_name",
    "validate_limit_name",
]

NS: Final = 1_000_000_000
"""Nanoseconds in a second: the unit of every time in a ``LimitRecord``."""

LIMIT_NAME_MAX: Final = 64
"""Characters of a limit's name: letters, digits, ``_`` and ``-``."""

LIMITS_MAX: Final = 256
"""Limits one deployment may have (each is a metric label value, so their number is bounded)."""

LIMIT_BLOCK_MAX: Final = 3600.0
"""Longest block, in seconds, a 429's ``Retry-After`` or an operator may impose at once."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RATE = re.compile(
    r"\s*(?P<amount>[0-9]+(?:\.[0-9]+)?)\s*(?P<scale>[kKmM]?)\s*/\s*"
    r"(?P<every>[0-9]+(?:\.[0-9]+)?)?\s*(?P<unit>s|sec|second|m|min|minute|h|hour|d|day)s?\s*"
)
_UNITS: Final = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
_SCALES: Final = {"": 1, "k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}
_AMOUNT_MAX: Final = 10**12


def valid_limit_name(name: object) -> bool:
    """Whether ``name`` is a limit's name (one subject token: letters, digits, ``_``, ``-``)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def validate_limit_name(name: object) -> str:
    """``name`` if it is a limit's name.

    Raises:
        InvalidName: it is not (1 to 64 letters, digits, ``_`` or ``-``).
    """
    if not valid_limit_name(name):
        raise InvalidName(
            f"a limit's name is 1 to {LIMIT_NAME_MAX} letters, digits, '_' or '-', not {name!r:.80}"
        )
    assert isinstance(name, str)
    return name


class Rate(msgspec.Struct, frozen=True, kw_only=True):
    """``amount`` per ``period_ns``: ``parse_rate("500/min")`` is 500 per 60 s."""

    amount: int
    period_ns: int

    @property
    def interval_ns(self) -> int:
        """The spacing of one unit, rounded up (so the rate is never exceeded)."""
        return -(-self.period_ns // self.amount)

    def text(self) -> str:
        seconds = self.period_ns / NS
        for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
            if seconds == size:
                return f"{self.amount}/{unit}"
        return f"{self.amount}/{seconds:g}s"


def parse_rate(text: object) -> Rate:
    """``"500/min"``, ``"200k/min"``, ``"10/s"``, ``"1.5M/day"``, ``"30/10s"`` as a ``Rate``.

    Raises:
        ValueError: not a rate, or an amount below 1 or above 10**12 per period.
    """
    if not isinstance(text, str) or len(text) > 40:
        raise ValueError(f"a rate is text like '500/min' or '200k/min', not {text!r:.60}")
    m = _RATE.fullmatch(text)
    if m is None:
        raise ValueError(f"a rate is text like '500/min', '200k/min' or '10/s', not {text!r}")
    amount = float(m["amount"]) * _SCALES[m["scale"]]
    every = float(m["every"]) if m["every"] else 1.0
    period_ns = round(every * _UNITS[m["unit"]] * NS)
    if not (math.isfinite(amount) and 1 <= amount <= _AMOUNT_MAX) or amount != int(amount):
        raise ValueError(f"a rate's amount is a whole number from 1 to 10**12, not {text!r}")
    if not 0 < period_ns <= 366 * 86400 * NS:
        raise ValueError(f"a rate's period is more than 0 and at most a year, not {text!r}")
    return Rate(amount=int(amount), period_ns=period_ns)


class Limit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A limit's declaration: ``requests`` and/or ``tokens`` per period (rates as text), and the
    ``burst`` of requests that may start at once (1: evenly spaced).

    Example:
        >>> Limit(requests="500/min", tokens="200k/min")
    """

    requests: str | None = None
    tokens: str | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        if self.requests is None and self.tokens is None:
            raise ValueError("a limit has a rate of requests, of tokens, or both")
        for rate in (self.requests, self.tokens):
            if rate is not None:
                parse_rate(rate)
        if not isinstance(self.burst, int) or not 1 <= self.burst <= 100_000:
            raise ValueError(f"a limit's burst is from 1 to 100000, not {self.burst!r}")

    @property
    def request_rate(self) -> Rate | None:
        return None if self.requests is None else parse_rate(self.requests)

    @property
    def token_rate(self) -> Rate | None:
        return None if self.tokens is None else parse_rate(self.tokens)


class LimitRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A limit's state (``<prefix>.limit.<name>``), written by compare-and-set only.

    ``requests_tat``/``tokens_tat``: the theoretical arrival time of the next request and the
    time the tokens charged so far are paid off (ns); ``blocked_until``: no request is granted
    a slot before this (a provider's 429); ``epoch``: raised by every block, so a grant made
    before a block that covers its slot is known stale. ``set_by``: who declared or set the
    rate (a worker's declaration, or the authenticated sender of ``sojourn limit``)."""

    name: str
    limit: Limit
    version: int = 0
    """Raised by every write: a reader keeps the newest record it has seen."""
    requests_tat: int = 0
    tokens_tat: int = 0
    blocked_until: int = 0
    epoch: int = 0
    granted: int = 0
    """Requests granted so far (a counter for operators)."""
    blocks: int = 0
    set_by: str = ""
    declared: bool = True
    """Set by a worker's declaration (``False``: by an operator, whom declarations never
    overrule)."""
    updated_at: float = 0.0


LimitAction = Literal["set", "block", "unblock"]
"""What ``sojourn limit`` asks: set the rate, block every grant for a while, lift a block."""
LIMIT_ACTIONS: tuple[LimitAction, ...] = typing.get_args(LimitAction)


class LimitRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Body of ``<prefix>.as.<sender>.limit.<name>`` (admin role where the deployment
    authenticates): ``set`` with ``limit``, ``block`` with ``seconds``, or ``unblock``."""

    action: LimitAction
    limit: Limit | None = None
    seconds: float | None = None


class LimitAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The intake's answer to a ``LimitRequest``: the limit's record now."""

    record: LimitRecord
