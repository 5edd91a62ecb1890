"""``POST /v1/agents/{agent}/runs``'s lane and fairness (decision 0049): the headers
``Sojourn-Priority`` (1 to 5), ``Sojourn-Fairness-Key`` and ``Sojourn-Fairness-Weight``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.fairness import FAIRNESS_KEY, FAIRNESS_WEIGHT, read_fairness
from sojourn.schemas.priority import PRIORITIES

from ._concurrency import CONCURRENCY_KEY_HEADER, CONCURRENCY_LIMIT_HEADER
from ._http import HttpProblem
from ._keyed import DEBOUNCE_HEADER, DEBOUNCE_INPUTS_HEADER, DEBOUNCE_KEY_HEADER, SINGLETON_HEADER
from ._routed import ATTRIBUTES_HEADER

__all__ = ["PRIORITY_HEADER", "REQUEST_HEADERS", "START_HEADERS", "flow_options"]

PRIORITY_HEADER: Final = "Sojourn-Priority"

START_HEADERS: Final = (
    ATTRIBUTES_HEADER,
    SINGLETON_HEADER,
    DEBOUNCE_HEADER,
    DEBOUNCE_KEY_HEADER,
    DEBOUNCE_INPUTS_HEADER,
    CONCURRENCY_KEY_HEADER,
    CONCURRENCY_LIMIT_HEADER,
    PRIORITY_HEADER,
    FAIRNESS_KEY,
    FAIRNESS_WEIGHT,
)
"""Every header a start may carry besides the request's own: what a page on an origin
``--cors-origin`` names may send (the CORS preflight's allowed headers)."""

REQUEST_HEADERS: Final = (
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "Last-Event-ID",
    "traceparent",
    "tracestate",
)
"""The request headers any route reads (the rest of the CORS preflight's allowed headers)."""


def flow_options(headers: Mapping[str, str]) -> dict[str, Any]:
    """``priority``, ``fairness_key`` and ``fairness_weight`` for ``Client.trigger`` from a
    start's headers (only those given).

    Raises:
        HttpProblem: ``invalid_priority``: not a whole number from 1 to 5;
            ``invalid_fairness``: a key that is not a fairness key, a weight without a key or
            not a whole number from 1 to 1000.
    """
    options: dict[str, Any] = {}
    text = headers.get(PRIORITY_HEADER)
    if text is not None:
        if text not in {str(p) for p in PRIORITIES}:
            raise HttpProblem(
                "invalid_priority",
                f"{PRIORITY_HEADER} is a whole number from 1 (most urgent) to 5",
            )
        options["priority"] = int(text)
    given = {k: v for k in (FAIRNESS_KEY, FAIRNESS_WEIGHT) if (v := headers.get(k)) is not None}
    if given:
        try:
            fairness = read_fairness(given)
        except (InvalidName, ValueError) as e:
            raise HttpProblem("invalid_fairness", str(e)) from None
        options["fairness_key"] = fairness.key
        options["fairness_weight"] = fairness.weight
    return options
