"""Deliberate crashes at named seams: for the chaos harness, and a test's crash explorer.

Off unless ``$SOJOURN_FAULTS`` names seams (comma-separated) in a worker's environment; then at
each named seam the process SIGKILLs itself with probability ``$SOJOURN_FAULT_RATE`` (default
0.05). The seams are the windows where a resumed run could repeat or lose an effect:

- ``after_step``: a step's function returned (its effect happened) but its completion is not
  recorded yet;
- ``before_ack``: the activation's last append landed but its wake is not acknowledged;
- ``replay``: while replaying recorded history, before reaching new work;
- ``timer_wake``: a fired timer's wake was delivered but not yet handled;
- ``intake_recorded``: the intake appended a signal, resume, decision or cancel to a run but
  has not yet published its wake (nor acknowledged the inbox message);
- ``continued``: ``ctx.continue_as_new`` created the chain's next run but the old run's end is
  not recorded yet;
- ``fired``: a schedule's fire created its runs and armed the next fire, but the run has not
  begun executing (no heartbeat lists it yet);
- ``opening``: a run opened in memory (``worker/opening.py``) ran its code to its first
  journaled call, and is about to be stored with it: nothing of it is stored yet;
- ``opened``: that first append landed, the first step has not run, and no heartbeat may list
  the run yet (a kill in the first milliseconds of a run);
- ``child_spawned``: a parent published its child's start, but has not recorded it.
- ``update_applied``: a run applied an update (``ctx.on_update``) and its
  ``UpdateCompleted`` is stored, but the run has not gone on (nor its wake been settled):
  the caller's answer is read back from that event (decision 0042).
- ``forked``: the intake stored a fork (``worker/forks.py``) but has neither answered nor
  acknowledged its trigger, and the fork has not begun executing.
- ``singleton_recorded``: a singleton start wrote its key's record naming its run, but the
  run is not created yet (decision 0047).
- ``debounce_closed``: a debounce burst's fire (or a trigger finding it full) closed the
  burst's record, but the burst's run is not created yet (decision 0047).
- ``concurrency_slot_taken``: a start took a slot of its concurrency key for its run, but the
  run is not created yet (decision 0048).
- ``concurrency_queued``: a start put its run in its key's queue, but the run is not created
  yet (decision 0048).
- ``concurrency_admitted``: a key's pump took a slot for the oldest queued run, but has not
  recorded its ``RunAdmitted`` (decision 0048).

In a test's own process, ``observe`` installs a function called at every seam with the seam's
name and what it knows of where it is (``SojournEnv.explore_crashes`` counts the seams a run
passes, and crashes its worker at one of them).

``$SOJOURN_PAUSE_AT`` names seams where the process SIGSTOPs itself instead, every time, so a
test can change the world at exactly that point (freeze broker nodes, say) and SIGCONT it:

- ``agent_consumers``: a starting worker has its streams, shared consumers and agent records,
  but not yet its per-agent consumers.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable

__all__ = ["SEAMS", "SeamObserver", "fault", "observe", "pause"]

SEAMS = (
    "after_step",
    "before_ack",
    "replay",
    "timer_wake",
    "intake_recorded",
    "continued",
    "fired",
    "opening",
    "opened",
    "child_spawned",
    "forked",
    "update_applied",
    "singleton_recorded",
    "debounce_closed",
    "concurrency_slot_taken",
    "concurrency_queued",
    "concurrency_admitted",
)

SeamObserver = Callable[[str, str], None]
"""Called at a seam with its name and where it is (``""`` when the seam cannot say)."""

_observer: SeamObserver | None = None

_ARMED = frozenset(s for s in os.environ.get("SOJOURN_FAULTS", "").split(",") if s)
_RATE = float(os.environ.get("SOJOURN_FAULT_RATE", "").strip() or "0.05")  # "0" means never
_PAUSED_AT = frozenset(s for s in os.environ.get("SOJOURN_PAUSE_AT", "").split(",") if s)


def observe(observer: SeamObserver | None) -> SeamObserver | None:
    """Install the seams' observer of this process (``None``: none); returns the one before."""
    global _observer
    before, _observer = _observer, observer
    return before


def fault(seam: str, where: str = "") -> None:
    """Tell the observer, if any (it may crash the worker here), then maybe die here (only
    when this seam is armed)."""
    if _observer is not None:
        _observer(seam, where)
    if seam in _ARMED and random.random() < _RATE:
        os.kill(os.getpid(), signal.SIGKILL)


def pause(seam: str) -> None:
    """Stop here until someone sends SIGCONT (only when ``$SOJOURN_PAUSE_AT`` names it)."""
    if seam in _PAUSED_AT:
        os.kill(os.getpid(), signal.SIGSTOP)
