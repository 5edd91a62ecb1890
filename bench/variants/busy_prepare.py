"""For ``python -m bench.paired``: A spends 100 µs more CPU as the worker builds a new run's
activation (``Worker._prepare``; B is the code as it is). How much of a worker's CPU before a
run's first append the 1-step latency pays, at that point of the path."""

from __future__ import annotations

from bench.variants import busier
from sojourn.actors.worker.worker import Worker

DESCRIPTION = "A: 100 µs of CPU more in Worker._prepare; B: as it is"
_prepare = Worker._prepare
_busy = busier(_prepare)


def toggle(side: str) -> None:
    Worker._prepare = _busy if side == "A" else _prepare  # type: ignore[method-assign]
