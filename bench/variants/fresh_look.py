"""For ``python -m bench.paired``: A is ``Client.result`` as it is (the first look of a run
this client just started waits for its end to be heard, ``FRESH_FIRST_LOOK``); B looks at
once, as before that change."""

from __future__ import annotations

from sojourn.actors.client import reading

DESCRIPTION = "A: result's first look waits for a fresh start's end to be heard; B: at once"
_FRESH_FOR = reading.FRESH_FOR


def toggle(side: str) -> None:
    reading.FRESH_FOR = _FRESH_FOR if side == "A" else 0.0
