"""The garbage collector of a worker's process: collected less often, its start-up frozen.

A worker allocates and frees a great many small objects per step (the step's task, futures,
decoded events, the append's message), and many live across a few turns of the loop while the
append is in flight. CPython's default first-generation threshold (700 allocations) then
collects every few steps, and what survives a couple of young collections is promoted to the
oldest generation, whose growth triggers full collections: with thousands of runs in memory
(kept activations, a burst of timers) each of those scans the whole heap, 0.2-0.4 s of a
stalled loop a second. Measured (``python -m bench.foundation --only conc``): 30-40 µs of
Python CPU per step, 15 % of a concurrent step's, spent in the collector.

``CollectorTuning`` raises the young threshold to ``YOUNG_THRESHOLD`` while a worker runs (a
young collection every ten thousand net allocations, a few milliseconds each), and, the first
time in a process, collects once and freezes what the process holds at start-up (its modules,
classes and configuration: ``gc.freeze``), so that full collections no longer scan them. The
thresholds the process had are put back once its last worker stops. ``Worker(tune_gc=False)``
leaves the collector alone (an application that manages it itself).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "CollectorTuning"]

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between two young collections while a worker runs
(CPython's default: 700)."""

_holders = 0
_saved: tuple[int, int, int] | None = None
_frozen = False


class CollectorTuning:
    """One worker's hold on the process's collector settings (see the module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._held = False

    def hold(self) -> None:
        """Tune the collector for as long as this worker runs (nothing when disabled, or held
        already)."""
        global _holders, _saved, _frozen
        if not self.enabled or self._held:
            return
        self._held = True
        _holders += 1
        if _holders > 1:
            return
        _saved = gc.get_threshold()
        if not _frozen:
            _frozen = True
            gc.collect()  # what start-up left as garbage is not frozen with the rest
            gc.freeze()
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
