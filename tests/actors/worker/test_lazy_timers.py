"""The two timers a step path keeps armed across steps instead of one per step (no server).

- The appender's flush timer: events queued after a decision are stored alone once they have
  waited ``flush_delay`` for a decision to take them, never sooner, however long ago the timer
  was first armed.
- A step guard's look timer: a step that runs past ``poll_after`` is looked after (and
  interrupted when the look says so), however many short steps came before it; short steps
  with pauses between them are never looked after, however long they add up to.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from sojourn.actors import Agent, Context, agent
from sojourn.actors.worker.activation import Activation
from sojourn.actors.worker.interrupt import StepGuard, StepInterrupted
from sojourn.broker import Broker, EventStore, Names
from sojourn.broker.eventstore import Decision
from sojourn.schemas import RunEvent, RunStarted, StepCompleted, StepStarted, to_raw
from sojourn.schemas.config import Settings

RUN = "lazy-run"
FLUSH_DELAY = 0.2
PAUSE = 1.0


class _NoBroker:
    max_payload = 1024 * 1024

    async def api(self, subject: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        return {}


class _Store(EventStore):
    """One run's history in memory; each decision with the time it was appended."""

    def __init__(self) -> None:
        super().__init__(cast(Broker, _NoBroker()), Names("lazy"), Settings(prefix="lazy"))
        self.decisions: list[Decision] = []
        self.stored_at: list[float] = []

    async def append(
        self,
        run_id: str,
        events: list[RunEvent] | tuple[RunEvent, ...],
        *,
        expected_seq: int,
        writer: str,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        seq = len(self.decisions) + 1
        assert expected_seq == seq - 1
        self.decisions.append(Decision(seq, tuple(events), writer, msg_id or f"{seq}", 0))
        self.stored_at.append(time.time())
        return seq

    async def load(self, run_id: str, after_seq: int = 0) -> list[Decision]:
        return [d for d in self.decisions if d.seq > after_seq]


STEP = 0.04
"""Each step's time: five of them span most of ``FLUSH_DELAY``, so that the flush timer armed
by the first completion comes due while the last one has waited only a part of it."""


async def _quick(i: int) -> int:
    await asyncio.sleep(STEP)
    return i


@agent("lazy")
async def lazy(ctx: Context, steps: int) -> int:
    for i in range(steps):  # back to back: each decision takes the completion before
        await ctx.step(_quick, i)
    await asyncio.sleep(PAUSE)  # not journaled: the last completion waits alone
    return await ctx.step(_quick, steps)


@pytest.mark.parametrize("steps", [1, 5])
async def test_a_completion_left_waiting_is_stored_alone_after_the_flush_delay_not_sooner(
    steps: int,
) -> None:
    store = _Store()
    start = RunStarted(run_id=RUN, agent="lazy", input=to_raw(steps))
    store.decisions.append(Decision(1, (start,), "intake", "start", 0))
    store.stored_at.append(time.time())
    any_lazy: Agent[Any, Any] = lazy
    act = Activation(
        agent=any_lazy,
        run_id=RUN,
        store=store,
        history=list(store.decisions),
        writer="w",
        flush_delay=FLUSH_DELAY,
    )
    await act.run()
    alone = [
        (d, at)
        for d, at in zip(store.decisions, store.stored_at, strict=True)
        if len(d.events) == 1 and isinstance(d.events[0], StepCompleted)
    ]
    assert len(alone) == 1, [d.events for d in store.decisions]
    decision, at = alone[0]
    completed = decision.events[0]
    assert isinstance(completed, StepCompleted) and completed.position == steps - 1
    waited = at - completed.at
    # Not sooner than the delay (a timer armed for an earlier completion must not take it),
    # and long before the pause ends (it was not left for the next decision).
    assert waited >= FLUSH_DELAY * 0.9, waited
    assert waited < PAUSE, waited
    later = store.decisions[store.decisions.index(decision) + 1 :]
    assert any(isinstance(e, StepStarted) and e.position == steps for d in later for e in d.events)
    # Every other completion went out with the next decision's start.
    for d in store.decisions:
        if d is not decision and any(isinstance(e, StepCompleted) for e in d.events):
            assert any(isinstance(e, StepStarted) for e in d.events) or d is store.decisions[-1]


async def test_a_long_step_after_short_ones_is_looked_after_and_interrupted() -> None:
    looks: list[float] = []
    looked = asyncio.Event()
    verdict: list[str | None] = [None]

    async def look() -> str | None:
        looks.append(time.monotonic())
        looked.set()
        return verdict[0]

    guard = StepGuard(look, poll_after=0.5, poll_every=0.1)

    async def short() -> None:
        await asyncio.sleep(0.01)

    for _ in range(10):  # the look timer is armed by the first of these
        await guard.run(short, (), {})
    assert looks == []

    async def long() -> None:
        await asyncio.sleep(30)

    began = time.monotonic()
    task = asyncio.ensure_future(guard.run(long, (), {}))
    await asyncio.wait_for(looked.wait(), 20)  # a step past poll_after is looked after
    assert looks[0] - began >= 0.5 * 0.9, "looked after before poll_after"
    verdict[0] = "cancelled"
    with pytest.raises(StepInterrupted):
        await asyncio.wait_for(task, 20)
    settled = len(looks)
    await asyncio.sleep(0.3)
    assert len(looks) == settled, "looks went on with no step in flight"


async def test_short_steps_with_pauses_between_are_never_looked_after() -> None:
    looks: list[float] = []

    async def look() -> str | None:
        looks.append(time.monotonic())
        return None

    guard = StepGuard(look, poll_after=0.5, poll_every=0.1)

    async def short() -> None:
        await asyncio.sleep(0.02)

    began = time.monotonic()
    while time.monotonic() - began < 1.5:  # three times poll_after, in steps of 20 ms
        await guard.run(short, (), {})
        await asyncio.sleep(0.03)
    await asyncio.sleep(0.6)  # past any timer armed by the last of them
    assert looks == []
