"""The garbage collector of a worker's process: young collections less often.

A worker allocates and frees a great many small objects per step (the step's task, futures,
decoded events, the append's message), and many live across a few turns of the loop while the
append is in flight. CPython's default first-generation threshold (700 net allocations) then
collects every few steps, and what survives a couple of young collections is promoted to the
oldest generation, whose growth triggers full collections: with thousands of runs in memory
(kept activations, a burst of timers) each of those scans the whole heap, 0.2-0.4 s of a
stalled loop, about once a second. Measured (``python -m bench.foundation --only conc``):
30-40 µs of Python CPU per step, 15 % of a concurrent step's, spent in the collector.

``CollectorTuning`` raises the young threshold to ``YOUNG_THRESHOLD`` while a worker runs (a
young collection every ten thousand net allocations, a few milliseconds each): most objects
die before one, so far fewer reach the oldest generation. The thresholds the process had are
put back once its last worker stops. ``Worker(tune_gc=False)`` leaves the collector alone (an
application that manages it itself). Nothing is frozen (``gc.freeze``): frozen objects are
never collected and ``gc.get_objects()`` no longer sees them, too much to impose on a host.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "CollectorTuning"]

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between two young collections while a worker runs
(CPython's default: 700)."""

_holders = 0
_saved: tuple[int, int, int] | None = None


class CollectorTuning:
    """One worker's hold on the process's collector settings (see the module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._held = False

    def hold(self) -> None:
        """Tune the collector for as long as this worker runs (nothing when disabled, or held
        already)."""
        global _holders, _saved
        if not self.enabled or self._held:
            return
        self._held = True
        _holders += 1
        if _holders > 1:
            return
        _saved = gc.get_threshold()
        young, *older = _saved
        if young:  # 0: the application turned automatic collection off; so it stays
            gc.set_threshold(max(young, YOUNG_THRESHOLD), *older)

    def release(self) -> None:
        """This worker has stopped: the last to stop puts the process's thresholds back."""
        global _holders, _saved
        if not self._held:
            return
        self._held = False
        _holders -= 1
        if _holders == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None
