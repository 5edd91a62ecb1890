"""``POST /v1/agents/{agent}/runs``'s keyed starts (decision 0047): the headers
``Sojourn-Singleton-Key``, ``Sojourn-Debounce``, ``Sojourn-Debounce-Key`` and
``Sojourn-Debounce-Inputs``, and the answer a keyed start gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sojourn.schemas.flow import DEBOUNCE_INPUTS, KeyedOptions, key_fault, parse_window
from sojourn.schemas.gateway import KeyedStartAnswer, StartAnswer

from ..client.runs import StartReceipt
from ._http import HttpProblem
from ._routed import start_attributes

__all__ = [
    "DEBOUNCE_HEADER",
    "DEBOUNCE_INPUTS_HEADER",
    "DEBOUNCE_KEY_HEADER",
    "SINGLETON_HEADER",
    "GatewayStart",
    "start_answer",
    "start_options",
]

SINGLETON_HEADER: Final = "Sojourn-Singleton-Key"
DEBOUNCE_HEADER: Final = "Sojourn-Debounce"
DEBOUNCE_KEY_HEADER: Final = "Sojourn-Debounce-Key"
DEBOUNCE_INPUTS_HEADER: Final = "Sojourn-Debounce-Inputs"


class GatewayStart(KeyedOptions, total=False):
    """What a start's headers say besides its run id: its attributes, and whether it is
    keyed."""

    attributes: dict[str, Any] | None


def _key(headers: Mapping[str, str], name: str) -> str | None:
    """A key header, as text (a header is Latin-1 on the wire: a key in UTF-8 arrives as its
    bytes, decoded back here)."""
    text = headers.get(name)
    if text is None:
        return None
    try:
        key = text.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise HttpProblem("invalid_key", f"{name} is not UTF-8") from None
    why = key_fault(key)
    if why is not None:
        raise HttpProblem("invalid_key", f"{name}: {why}")
    return key


def start_options(headers: Mapping[str, str]) -> GatewayStart:
    """A start's options from its headers: ``Sojourn-Attributes`` and the keyed ones.

    Raises:
        HttpProblem: ``invalid_attributes``, ``invalid_key``, ``invalid_debounce``.
    """
    options: GatewayStart = {"attributes": start_attributes(headers)}
    singleton = _key(headers, SINGLETON_HEADER)
    window = headers.get(DEBOUNCE_HEADER)
    key = _key(headers, DEBOUNCE_KEY_HEADER)
    inputs = headers.get(DEBOUNCE_INPUTS_HEADER)
    if singleton is not None:
        options["singleton_key"] = singleton
    if window is None:
        if key is not None or inputs is not None:
            raise HttpProblem(
                "invalid_debounce",
                f"{DEBOUNCE_KEY_HEADER} and {DEBOUNCE_INPUTS_HEADER} go with {DEBOUNCE_HEADER}",
            )
        return options
    try:
        options["debounce"] = parse_window(window)
    except ValueError as e:
        raise HttpProblem("invalid_debounce", f"{DEBOUNCE_HEADER}: {e}") from None
    if key is None or singleton is not None or headers.get("idempotency-key") is not None:
        raise HttpProblem(
            "invalid_debounce",
            f"a debounced start has a {DEBOUNCE_KEY_HEADER}, and neither an Idempotency-Key "
            f"nor a {SINGLETON_HEADER}",
        )
    options["debounce_key"] = key
    if inputs is not None:
        if inputs == "last":
            options["debounce_inputs"] = "last"
        elif inputs == "all":
            options["debounce_inputs"] = "all"
        else:
            raise HttpProblem(
                "invalid_debounce", f"{DEBOUNCE_INPUTS_HEADER} is one of {list(DEBOUNCE_INPUTS)}"
            )
    return options


def start_answer(receipt: StartReceipt, keyed: bool) -> tuple[StartAnswer, int]:
    """The answer to a start and its status: 201 created, 200 it existed or the start attached
    to its singleton key's live run, 202 stored (no worker took it yet) or debounced (the run
    starts when the burst ends). A keyed start's answer says ``attached`` and ``debounced``."""
    answer = StartAnswer(run_id=receipt.run_id, created=receipt.created, queued=receipt.queued)
    if keyed:
        answer = KeyedStartAnswer(
            run_id=receipt.run_id,
            created=receipt.created,
            queued=receipt.queued,
            attached=receipt.attached,
            debounced=receipt.debounced,
        )
    status = 202 if receipt.queued or receipt.debounced else 201 if receipt.created else 200
    return answer, status
