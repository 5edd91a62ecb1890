"""For ``python -m bench.paired --steps N``: A spends 100 µs more CPU as each step's attempt
begins (``StepGuard.run``; B is the code as it is). A check that the sequential layout sees
what a step pays."""

from __future__ import annotations

from bench.variants import busier
from sojourn.actors.worker.interrupt import StepGuard

DESCRIPTION = "A: 100 µs of CPU more in StepGuard.run; B: as it is"
_run = StepGuard.run
_busy = busier(_run)


def toggle(side: str) -> None:
    StepGuard.run = _busy if side == "A" else _run  # type: ignore[method-assign]
