"""Which workers are alive, as one process sees them: the judgement behind run takeover.

A worker heartbeats every ``Settings.worker_beat_interval`` on ``<prefix>.worker.<id>`` (one
write per worker, however many runs it executes), listing the runs it executes. A worker is
alive while its heartbeat message keeps *changing* as this process looks (a new stream
sequence): the judgement uses only this process's monotonic clock, so clock skew between hosts
cannot make a live worker look dead. The one exception is a worker this process sees for the
first time: its beat's age by the wall clocks is taken as the time it has already been silent,
but never all of ``dead_after`` (``FIRST_LOOK``: a third of it is always watched), so a worker
started right after another died takes over almost as fast as one that was watching, and a
skewed clock or a beat held up by a broker restart cannot condemn a live worker at first
sight. One whose beats stop for ``dead_after``, that stopped gracefully, or that came back
under the same id from a new start (another incarnation) is dead, and ``observe`` reports it
once, with its last beat: its runs are then taken over.

A process that could not look for a while (its own connection, or the broker, was down: then
nobody could heartbeat either) calls ``resume``: every live worker's silence counts from then.

The same beats say who holds which run (``holder``, ``may_hold``): a worker's beat lists every
run it executes, so an activation claims a run by executing it and lets go by ending, with no
write of its own (docs/decisions/0018-claims-without-lease-writes.md).

Pure: no I/O and no clock of its own, so it is tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sojourn.schemas.health import WorkerBeat, vouches

__all__ = ["FIRST_LOOK", "Membership"]

FIRST_LOOK = 1 / 3
"""The part of ``dead_after`` a first look at a worker always watches for itself."""


@dataclass(slots=True)
class _Seen:
    seq: int
    beat: WorkerBeat
    changed_at: float
    dead: bool = False
    asked: bool = False
    """Whether its connection was asked after since its beat last changed (``overdue``)."""


class Membership:
    """The workers of one deployment, judged alive or dead from their heartbeats."""

    def __init__(self, dead_after: float) -> None:
        self.dead_after = dead_after
        self._seen: dict[str, _Seen] = {}
        self._holders: dict[str, list[str]] | None = None
        """Run id -> the live workers whose last beats list it (rebuilt after a look)."""

    def observe(
        self, beats: Iterable[tuple[int, WorkerBeat]], now: float, wall: float | None = None
    ) -> list[WorkerBeat]:
        """Take the current heartbeat of each worker (stream sequence, body) at monotonic time
        ``now`` (and wall-clock time ``wall``, for first looks); return the last beats of the
        workers found dead since the last call (each incarnation once)."""
        died: list[WorkerBeat] = []
        current: set[str] = set()
        self._holders = None
        for seq, beat in beats:
            wid = beat.worker_id
            current.add(wid)
            seen = self._seen.get(wid)
            if seen is None:
                age = 0.0 if wall is None else max(wall - beat.at, 0.0)
                credit = min(age, self.dead_after * (1 - FIRST_LOOK))
                self._seen[wid] = _Seen(seq, beat, now - credit, dead=beat.stopped)
                continue
            if seq != seen.seq:
                if beat.started_at != seen.beat.started_at and not seen.dead:
                    died.append(seen.beat)  # restarted under the same id: the old one is gone
                seen.seq, seen.beat, seen.changed_at = seq, beat, now
                seen.dead, seen.asked = beat.stopped, False
                continue
            if not seen.dead and now - seen.changed_at > self.dead_after:
                seen.dead = True
                died.append(seen.beat)
        for wid in [w for w in self._seen if w not in current]:
            gone = self._seen.pop(wid)  # its heartbeat expired from the stream
            if not gone.dead:
                died.append(gone.beat)
        return died

    def overdue(self, now: float, after: float) -> list[WorkerBeat]:
        """The last beats of the live workers whose beats have not changed for ``after`` (well
        short of ``dead_after``: a beat or two missed) and that answer on their presence
        subject, each once per silence: whether their connection is still there is worth
        asking (``condemn`` those whose connection is gone)."""
        late = []
        for seen in self._seen.values():
            if not seen.dead and not seen.asked and seen.beat.answers:
                if now - seen.changed_at > after:
                    seen.asked = True
                    late.append(seen.beat)
        return late

    def condemn(self, worker_id: str) -> WorkerBeat | None:
        """``worker_id`` is dead without waiting for ``dead_after`` (the server says its
        connection is gone): its last beat, if it was alive until now (reported once, as
        ``observe`` reports the dead). Should its beats go on after all (a connection that came
        back), it is alive again from its next beat."""
        seen = self._seen.get(worker_id)
        if seen is None or seen.dead:
            return None
        seen.dead = True
        self._holders = None
        return seen.beat

    def resume(self, now: float) -> None:
        """This process has not been able to look since long before ``now``: restart every
        live worker's silence from ``now`` instead of counting the blind time against it."""
        for seen in self._seen.values():
            if not seen.dead:
                seen.changed_at = max(seen.changed_at, now)

    def known(self, worker_id: str) -> bool:
        """Whether this process has seen a beat of ``worker_id`` (alive or dead)."""
        return worker_id in self._seen

    def holder(self, run_id: str, besides: str = "") -> str | None:
        """A live worker other than ``besides`` whose last beat lists ``run_id``, if any."""
        if self._holders is None:
            index: dict[str, list[str]] = {}
            for wid, seen in self._seen.items():
                if not seen.dead:
                    for r in seen.beat.runs:
                        index.setdefault(r.run_id, []).append(wid)
            self._holders = index
        return next((w for w in self._holders.get(run_id, ()) if w != besides), None)

    def serving(self, agent: str, besides: str = "") -> bool:
        """Whether a live worker other than ``besides`` serves ``agent`` (its last beat
        names it)."""
        return any(
            not seen.dead and agent in seen.beat.agents and wid != besides
            for wid, seen in self._seen.items()
        )

    def may_hold(self, worker_id: str, run_id: str, since: float) -> bool | None:
        """Whether ``worker_id``, which began working on ``run_id`` at ``since`` (its clock),
        may still be executing it: alive, and its last beat lists the run or predates
        ``since``. ``None``: this process has not seen the worker (yet)."""
        seen = self._seen.get(worker_id)
        if seen is None:
            return None
        return not seen.dead and vouches(seen.beat, run_id, since)

    def alive(self, worker_id: str) -> bool:
        seen = self._seen.get(worker_id)
        return seen is not None and not seen.dead

    def beat(self, worker_id: str) -> WorkerBeat | None:
        seen = self._seen.get(worker_id)
        return None if seen is None else seen.beat
