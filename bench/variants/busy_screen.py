"""For ``python -m bench.paired``: A spends 100 µs more CPU in ``Refusals.screen``, as a start
arrives (B is the code as it is). How much of a worker's CPU before a run's first append the
1-step latency pays, at that point of the path."""

from __future__ import annotations

from bench.variants import busier
from sojourn.actors.worker.refusals import Refusals

DESCRIPTION = "A: 100 µs of CPU more in Refusals.screen; B: as it is"
_screen = Refusals.screen
_busy = busier(_screen)


def toggle(side: str) -> None:
    Refusals.screen = _busy if side == "A" else _screen  # type: ignore[method-assign]
