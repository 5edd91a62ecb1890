"""``POST /v1/agents/{agent}/runs``'s concurrency key (decision 0048): the headers
``Sojourn-Concurrency-Key`` and ``Sojourn-Concurrency-Limit``. A queued run's status
(``GET /v1/runs/{run_id}``) says ``detail`` ``queued on key K, position P`` and ``queue``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sojourn.schemas.concurrency import LIMIT_MAX, ConcurrencyBody, concurrency_fault

from ._http import HttpProblem

__all__ = ["CONCURRENCY_KEY_HEADER", "CONCURRENCY_LIMIT_HEADER", "concurrency_options"]

CONCURRENCY_KEY_HEADER: Final = "Sojourn-Concurrency-Key"
CONCURRENCY_LIMIT_HEADER: Final = "Sojourn-Concurrency-Limit"


def concurrency_options(headers: Mapping[str, str]) -> dict[str, Any]:
    """``{"concurrency": {...}}`` for ``Client.trigger`` from a start's headers (empty
    without them).

    Raises:
        HttpProblem: ``invalid_concurrency``: one header without the other, a key that is not
            UTF-8 or not a key, a limit that is not a whole number from 1 to ``LIMIT_MAX``, or
            with a singleton key or a debounce.
    """
    text, limit_text = headers.get(CONCURRENCY_KEY_HEADER), headers.get(CONCURRENCY_LIMIT_HEADER)
    if text is None and limit_text is None:
        return {}
    if text is None or limit_text is None:
        raise HttpProblem(
            "invalid_concurrency",
            f"{CONCURRENCY_KEY_HEADER} and {CONCURRENCY_LIMIT_HEADER} go together",
        )
    try:  # a header is Latin-1 on the wire: a key in UTF-8 arrives as its bytes
        key = text.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise HttpProblem("invalid_concurrency", f"{CONCURRENCY_KEY_HEADER} is not UTF-8") from None
    if not limit_text.isascii() or not limit_text.isdigit() or len(limit_text) > 4:
        raise HttpProblem(
            "invalid_concurrency",
            f"{CONCURRENCY_LIMIT_HEADER} is a whole number from 1 to {LIMIT_MAX}",
        )
    body = ConcurrencyBody(key=key, limit=int(limit_text))
    why = concurrency_fault(body)
    if why is not None:
        raise HttpProblem("invalid_concurrency", why)
    if any(h in headers for h in ("Sojourn-Singleton-Key", "Sojourn-Debounce")):
        raise HttpProblem(
            "invalid_concurrency", "a singleton or debounced start takes no concurrency key"
        )
    return {"concurrency": {"key": key, "limit": body.limit}}
