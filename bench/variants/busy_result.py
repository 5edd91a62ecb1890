"""For ``python -m bench.paired``: A spends 100 µs more CPU as ``Client.result`` begins to wait
(B is the code as it is). In ``bench.foundation``'s layout the client shares the worker's
process and loop: how much of the client's CPU the 1-step latency pays."""

from __future__ import annotations

from bench.variants import busier
from sojourn.actors.client.reading import RunReading

DESCRIPTION = "A: 100 µs of CPU more as Client.result begins to wait; B: as it is"
_end_of = RunReading._end_of
_busy = busier(_end_of)


def toggle(side: str) -> None:
    RunReading._end_of = _busy if side == "A" else _end_of  # type: ignore[method-assign]
