"""Anomaly signals that come before quality degrades: per agent, the tool-call rate
and the history length against their own baselines.

An agent stuck re-planning calls tools far more often than it usually does, and its history
grows far beyond the usual length of a finished run. Both are measured from run events (their
``at`` times), so a watchdog that starts late and reads old events builds the same baseline as
one that watched them live. Pure bookkeeping; no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HistoryBaseline", "RateBaseline"]

_MINUTE = 60


@dataclass(slots=True)
class RateBaseline:
    """Counts per minute; the recent rate against the rate over the preceding day.

    Attributes:
        recent: seconds the current rate is measured over.
        skip: the most recent seconds left out of the baseline (so a spike is not its own
            baseline).
        span: seconds the baseline covers at most.
        min_span: the baseline is unknown until it covers at least this much.
    """

    recent: float = 300.0
    skip: float = 3600.0
    span: float = 86400.0
    min_span: float = 1800.0
    minutes: dict[int, int] = field(default_factory=dict)
    first_at: float | None = None

    def add(self, at: float, n: int = 1) -> None:
        m = int(at // _MINUTE)
        self.minutes[m] = self.minutes.get(m, 0) + n
        if self.first_at is None or at < self.first_at:
            self.first_at = at

    def rate(self, now: float) -> float:
        """Events per second over the last ``recent`` seconds."""
        return self._count(now - self.recent, now) / self.recent

    def baseline(self, now: float) -> float | None:
        """Events per second over ``[now - span, now - skip)``, or ``None`` if too little is
        known."""
        if self.first_at is None:
            return None
        end = now - self.skip
        start = max(now - self.span, self.first_at)
        if end - start < self.min_span:
            return None
        return self._count(start, end) / (end - start)

    def ratio(self, now: float) -> float | None:
        base = self.baseline(now)
        if base is None:
            return None
        rate = self.rate(now)
        if base <= 0:
            return None if rate <= 0 else float("inf")
        return rate / base

    def prune(self, now: float) -> None:
        """Forget minutes older than the baseline can use."""
        oldest = int((now - self.span) // _MINUTE) - 1
        for m in [m for m in self.minutes if m < oldest]:
            del self.minutes[m]

    def _count(self, start: float, end: float) -> int:
        lo, hi = int(start // _MINUTE), int(end // _MINUTE)
        if hi - lo > len(self.minutes):
            return sum(n for m, n in self.minutes.items() if lo <= m < hi)
        return sum(self.minutes.get(m, 0) for m in range(lo, hi))


@dataclass(slots=True)
class HistoryBaseline:
    """The typical history length (events) of an agent's completed runs: an exponentially
    weighted mean, so it follows code changes over a few dozen runs."""

    alpha: float = 0.05
    min_runs: int = 5
    mean: float = 0.0
    runs: int = 0

    def add(self, events: int) -> None:
        self.runs += 1
        if self.runs == 1:
            self.mean = float(events)
        else:
            self.mean += self.alpha * (events - self.mean)

    @property
    def value(self) -> float | None:
        return self.mean if self.runs >= self.min_runs else None

    def ratio(self, longest_live: int) -> float | None:
        base = self.value
        if base is None or base <= 0:
            return None
        return longest_live / base
