"""Fairness keys (decision 0049): a start may name a key (a tenant, a user) and a weight; a
worker shares its slots between the keys it has work of in weighted round-robin, so a burst of
one key's starts does not starve another key's.

The key and weight travel in two headers, on the start and on every wake of its run:
``Sojourn-Fairness-Key`` and ``Sojourn-Fairness-Weight``. They are hostile data: the intake
reads a start's strictly (``read_fairness``: a bad one is refused ``invalid_fairness``); the
fetch window reads every message's leniently (``classify``: garbage is the default key).

Pure: the type, its rules and the header names; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec

from .errors import InvalidName

__all__ = [
    "FAIRNESS_KEY",
    "FAIRNESS_KEY_MAX",
    "FAIRNESS_WEIGHT",
    "FAIRNESS_WEIGHT_MAX",
    "Fairness",
    "classify",
    "fairness_headers",
    "read_fairness",
    "validate_fairness",
]

FAIRNESS_KEY: Final = "Sojourn-Fairness-Key"
"""Header of a start and of its run's wakes: the run's fairness key (absent: the default)."""

FAIRNESS_WEIGHT: Final = "Sojourn-Fairness-Weight"
"""Header next to ``FAIRNESS_KEY``: the key's weight, decimal digits (absent: 1)."""

FAIRNESS_KEY_MAX = 128
"""The longest fairness key, in characters."""

FAIRNESS_WEIGHT_MAX = 1000
"""The largest weight: a key of weight w gets w times a weight-1 key's share."""

_KEY = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")
_WEIGHT = re.compile(r"[1-9][0-9]{0,3}")


class Fairness(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run's fairness key and weight (``RunStarted.fairness``); ``key`` ``""`` is the
    default key every start without one shares."""

    key: str = ""
    weight: int = 1


DEFAULT = Fairness()


def validate_fairness(key: object, weight: object = 1) -> Fairness:
    """The fairness of ``key`` and ``weight``, checked.

    Raises:
        InvalidName: a key that is not 1-128 characters of ``A-Z a-z 0-9 _ . : @ / -`` (or
            ``""``, the default key), a weight that is not an int from 1 to 1000.
    """
    if not isinstance(key, str) or (key and not _KEY.fullmatch(key)):
        raise InvalidName(
            f"invalid fairness key {str(key)[:40]!r}: use 1-{FAIRNESS_KEY_MAX} characters from "
            "A-Z a-z 0-9 _ . : @ / -"
        )
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise InvalidName(f"invalid fairness weight {weight!r}: a whole number")
    if not 1 <= weight <= FAIRNESS_WEIGHT_MAX:
        raise InvalidName(f"invalid fairness weight {weight}: from 1 to {FAIRNESS_WEIGHT_MAX}")
    if not key and weight != 1:
        raise InvalidName("a fairness weight needs a fairness key")
    return Fairness(key=key, weight=weight)


def fairness_headers(f: Fairness | None) -> dict[str, str]:
    """The headers that carry ``f`` (none for the default)."""
    if f is None or f == DEFAULT:
        return {}
    headers = {FAIRNESS_KEY: f.key}
    if f.weight != 1:
        headers[FAIRNESS_WEIGHT] = str(f.weight)
    return headers


def read_fairness(headers: Mapping[str, str]) -> Fairness:
    """A start's fairness from its headers, strictly (the intake's reading).

    Raises:
        InvalidName: a key or weight that is not one (``validate_fairness``), a weight that
            is not decimal digits, or a weight without a key.
    """
    key, weight = headers.get(FAIRNESS_KEY), headers.get(FAIRNESS_WEIGHT)
    if not key and weight is None:  # no key, or an empty one: the default
        return DEFAULT
    if weight is not None and not _WEIGHT.fullmatch(weight):
        raise InvalidName(
            f"invalid {FAIRNESS_WEIGHT} {weight[:40]!r}: a whole number from 1 to "
            f"{FAIRNESS_WEIGHT_MAX}"
        )
    if not key:
        raise InvalidName(f"{FAIRNESS_WEIGHT} needs a {FAIRNESS_KEY}")
    return validate_fairness(key, 1 if weight is None else int(weight))


def classify(headers: Mapping[str, str] | None) -> Fairness:
    """A message's fairness for ordering it, leniently: total, never raises; anything that is
    not a valid key and weight is the default key (weight 1)."""
    if not headers:
        return DEFAULT
    try:
        return read_fairness(headers)
    except Exception:
        return DEFAULT
