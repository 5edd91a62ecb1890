"""Sticky activations and fold snapshots (``actors/worker/sticky.py``,
``actors/history/snapshots.py``).

A worker keeps the activation of a run that parks on a wait resting there; the next wake of
the run on that worker goes on from the kept code (no load, no fold, no replay) when only
signals were appended since, and discards the kept copy otherwise. Against a real
nats-server; the pure parts (``Body``, ``StickyRuns``, ``fold_history``) with hypothesis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.core.actions import Parked
from sojourn.actors.core.state import fold
from sojourn.actors.history.snapshots import Snapshot, fold_history
from sojourn.actors.worker.activation import Activation
from sojourn.actors.worker.sticky import Body, StickyRuns
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.schemas import RunEvent, SignalReceived, StepStarted, WaitStarted
from sojourn.schemas.codec import to_raw
from sojourn.schemas.config import Settings
from tests.conftest import wait_for
from tests.procs import WorkerProc
from tests.strategies import valid_histories

# --- agents ------------------------------------------------------------------------------------

CALLS: Counter[str] = Counter()
"""Step executions, by run id and turn: every turn's step must run exactly once."""


async def reply(run_id: str, turn: int, text: str) -> str:
    CALLS[f"{run_id}:{turn}"] += 1
    return f"{turn}:{text}"


@agent("chat")
async def chat(ctx: Context) -> list[str]:
    """A conversation: each signal ``msg`` is a turn (one step); ``bye`` ends it."""
    said: list[str] = []
    turn = 0
    while True:
        text = await ctx.wait_for("msg")
        if text == "bye":
            return said
        turn += 1
        said.append(await ctx.step(reply, ctx.run_id, turn, str(text)))


@agent("napper")
async def napper(ctx: Context, naps: int) -> int:
    """Sleeps ``naps`` times (in-process timers wake it), a step after each."""
    for i in range(naps):
        await ctx.sleep(0.3)
        await ctx.step(reply, ctx.run_id, i + 1, "nap")
    return naps


# --- helpers -----------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    w = Worker([chat, napper], nats=nats_server.url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def parked(client: Client, run_id: str, turns: int) -> bool:
    """Whether the run recorded ``turns`` steps and parked on its next wait."""
    history = await client.history(run_id)
    events = [e for d in history for e in d.events]
    steps = sum(isinstance(e, StepStarted) for e in events)
    return bool(events) and steps == turns and isinstance(events[-1], WaitStarted)


def writes_once(history: list[Decision]) -> None:
    """The history folds without anomalies and starts each step once (no copy wrote twice)."""
    events = [e for d in history for e in d.events]
    assert fold(events).anomalies == ()
    starts = [e.position for e in events if isinstance(e, StepStarted)]
    assert len(starts) == len(set(starts)), starts


# --- the worker keeps and resumes ---------------------------------------------------------------


async def test_kept_activation_resumes_on_signals_without_loading(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("chat", None)
    await wait_for(lambda: parked(client, run_id, 0), what="parked")
    await wait_for(_holds(lambda: run_id in worker.sticky), what="kept")
    # ``folds`` counts activations built from a loaded, folded history (replaying the code).
    folds, resumed = worker.folds, worker.sticky.resumed
    # Kept is not held (no slot, not in the heartbeats) once its activation has ended: it is
    # kept before the activation's last settling (its wake's ack) is done.
    await wait_for(_holds(lambda: run_id not in worker._active), what="not held")
    for turn in range(1, 6):
        await client.signal(run_id, "msg", f"hello {turn}")
        await wait_for(lambda t=turn: parked(client, run_id, t), what=f"turn {turn}")  # type: ignore[misc]
        await wait_for(_holds(lambda: run_id in worker.sticky), what="kept again")
    assert worker.folds == folds, "a kept run was loaded and folded again"
    assert worker.sticky.resumed == resumed + 5
    await client.signal(run_id, "msg", "bye")
    out = await client.result(run_id, timeout=30)
    assert out == [f"{t}:hello {t}" for t in range(1, 6)]
    assert all(CALLS[f"{run_id}:{t}"] == 1 for t in range(1, 6))
    writes_once(await client.history(run_id))
    assert run_id not in worker.sticky  # ended: nothing kept


async def test_a_foreign_write_discards_the_kept_copy(
    worker: Worker, client: Client, nats_server: EmbeddedServer, settings: Settings
) -> None:
    """Another worker takes the run while it is kept here (it consumes a signal and runs the
    turn's step): the kept copy must not go on; the next wake activates the run from its
    history, and nothing is written twice."""
    run_id = await client.start("chat", None)
    await wait_for(_holds(lambda: run_id in worker.sticky), what="kept")
    other = await Broker.connect(nats_server.url)
    try:
        store = EventStore(other, client.names, settings)
        # What another worker's activation does: the intake records a signal (no wake here),
        # the other worker activates the run, takes it, runs the step and parks again.
        last = await store.last_seq(run_id)
        signal = SignalReceived(name="msg", payload=to_raw("elsewhere"), signal_id="x1", at=1.0)
        await store.append(run_id, [signal], expected_seq=last, writer="intake:other")
        history = await store.load(run_id)
        act = Activation(
            agent=chat, run_id=run_id, store=store, history=history, writer="other-worker.1"
        )
        assert await act.run() == "waiting"
    finally:
        await other.close()
    assert run_id in worker.sticky  # nothing told this worker
    folds = worker.folds
    await client.signal(run_id, "msg", "here")
    await wait_for(lambda: parked(client, run_id, 2), what="turn 2")
    assert worker.sticky.discarded["changed"] == 1
    assert worker.folds == folds + 1  # activated from its history
    await client.signal(run_id, "msg", "bye")
    assert await client.result(run_id, timeout=30) == ["1:elsewhere", "2:here"]
    assert CALLS[f"{run_id}:1"] == 1 and CALLS[f"{run_id}:2"] == 1
    history = await client.history(run_id)
    writes_once(history)
    # The kept copy wrote nothing after the other worker's decisions: every later decision is
    # by activations that began after them.
    after = [d.writer for d in history if d.seq > act.last_seq and not d.writer.startswith("in")]
    assert after and all(w.startswith(worker.worker_id) for w in after)


async def test_a_cancel_while_kept_ends_the_run(worker: Worker, client: Client) -> None:
    run_id = await client.start("chat", None)
    await wait_for(_holds(lambda: run_id in worker.sticky), what="kept")
    await client.cancel(run_id, "enough")
    await wait_for(_status(client, run_id, "cancelled"), what="cancelled")
    assert worker.sticky.discarded["changed"] >= 1
    assert run_id not in worker.sticky


async def test_in_process_timers_resume_kept_runs(worker: Worker, client: Client) -> None:
    run_id = await client.start("napper", 3)
    assert await client.result(run_id, timeout=30) == 3
    assert worker.sticky.resumed >= 2  # the first nap may be taken before it is kept
    writes_once(await client.history(run_id))


async def test_eviction_unwinds_cleanly(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([chat], nats=nats_server.url, settings=settings, sticky_runs=1) as w:
        first = await client.start("chat", None)
        await wait_for(_holds(lambda: first in w.sticky), what="first kept")
        kept_first = w.sticky._runs[first]
        second = await client.start("chat", None)
        await wait_for(_holds(lambda: second in w.sticky), what="second kept")
        assert first not in w.sticky and len(w.sticky) == 1
        assert w.sticky.discarded["evicted"] == 1
        body = kept_first.body
        assert body is not None
        await wait_for(_holds(lambda: body.ended), what="evicted code unwound")
        assert kept_first.fenced  # it can never write again
        seq = await EventStore(w._broker_or_fail(), client.names, settings).last_seq(first)
        folds, resumed = w.folds, w.sticky.resumed
        for run_id in (second, first):  # the kept one goes on; the evicted one is cold
            await client.signal(run_id, "msg", "hi")
            await client.signal(run_id, "msg", "bye")
            assert await client.result(run_id, timeout=30) == ["1:hi"]
            writes_once(await client.history(run_id))
        # The kept one went on from its kept code, never discarded (its spare wakes after its
        # end fold an ended run: not counted here); the evicted one was activated from its
        # history. Each run's two signals are one resume or two, as the first one's wake comes
        # before or after the second is recorded (on a loaded machine, often after); the
        # evicted run, activated cold for its first signal, may be kept and resumed for its
        # second.
        assert resumed + 1 <= w.sticky.resumed <= resumed + 3, (resumed, w.sticky.resumed)
        assert w.sticky.discarded == Counter(evicted=1)
        assert w.folds > folds
        history = await client.history(first)
        assert next(d for d in history if d.seq > seq).writer.startswith("intake:")


async def test_stop_discards_kept_runs_and_another_worker_finishes_them(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    w = Worker([chat], nats=nats_server.url, settings=settings)
    await w.start()
    runs = [await client.start("chat", None) for _ in range(5)]
    await wait_for(_holds(lambda: all(r in w.sticky for r in runs)), what="all kept")
    bodies = [w.sticky._runs[r].body for r in runs]
    await w.stop()
    assert all(b is not None and b.ended for b in bodies)
    assert w.sticky.discarded["closed"] == 5 and len(w.sticky) == 0
    async with Worker([chat], nats=nats_server.url, settings=settings):
        for r in runs:
            await client.signal(r, "msg", "x")
            await client.signal(r, "msg", "bye")
        for r in runs:
            assert await client.result(r, timeout=30) == ["1:x"]


async def test_sigkill_with_kept_runs_loses_nothing(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """A worker process keeps 20 parked conversations and is SIGKILLed: another worker
    resumes every one from its history, each turn's step recorded once."""
    proc = await WorkerProc(
        nats_server.url, settings.prefix, "tests.apps.sticky_chat", lease_ttl=settings.lease_ttl
    ).ready()
    try:
        runs = [await client.start("sticky-chat", None) for _ in range(20)]
        for r in runs:
            await client.signal(r, "msg", "one")
        for r in runs:
            await wait_for(lambda r=r: parked(client, r, 1), what="turn 1")  # type: ignore[misc]
    finally:
        proc.kill()
    from tests.apps.sticky_chat import sticky_chat

    async with Worker([sticky_chat], nats=nats_server.url, settings=settings) as w:
        for r in runs:
            await client.signal(r, "msg", "two")
            await client.signal(r, "msg", "bye")
        for r in runs:
            assert await client.result(r, timeout=60) == ["1:one", "2:two"]
            writes_once(await client.history(r))
        assert w.sticky.resumed == 0 or w.folds >= len(runs)


# --- pure parts --------------------------------------------------------------------------------


def _decisions(events: list[RunEvent], cuts: list[int]) -> list[Decision]:
    """``events`` cut into decisions at ``cuts`` (sequences 1, 2, ...)."""
    bounds = sorted({c for c in cuts if 0 < c < len(events)})
    parts, start = [], 0
    for b in [*bounds, len(events)]:
        parts.append(tuple(events[start:b]))
        start = b
    return [Decision(i + 1, p, "w.1", f"m{i}") for i, p in enumerate(parts) if p]


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_histories(), st.lists(st.integers(0, 200), max_size=8), st.integers(0, 20))
def test_folding_from_a_snapshot_equals_folding_everything(
    drawn: tuple[list[RunEvent], Any], cuts: list[int], at: int
) -> None:
    events, _ = drawn
    history = _decisions(events, cuts)
    whole = fold_history(history)
    assert whole.state == fold(events)
    k = min(at, len(history))
    prefix = fold_history(history[:k])
    assert fold_history(history, prefix) == whole
    # A snapshot that is not of a prefix (a sequence the history lacks) is not used.
    bogus = Snapshot(seq=10_000, state=fold(events[:1]))
    assert fold_history(history, bogus) == whole


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ktd"), st.integers(0, 5)), max_size=40))
def test_sticky_runs_is_a_bounded_lru(ops: list[tuple[str, int]]) -> None:
    """Against a model: at most ``limit`` kept, the least recently kept evicted first, every
    activation discarded when it leaves other than by ``take``, never discarded twice."""

    async def go() -> None:
        limit = 3
        runs: StickyRuns[_Fake] = StickyRuns(limit)
        model: list[str] = []
        out: dict[str, _Fake] = {}
        for op, n in ops:
            rid = f"r{n}"
            if op == "k":
                if rid in model or rid in out:
                    continue
                fake = _Fake()
                assert runs.keep(rid, fake)
                model.append(rid)
                if len(model) > limit:
                    model.pop(0)
            elif op == "t":
                got = runs.take(rid)
                assert (got is not None) == (rid in model)
                if got is not None:
                    model.remove(rid)
                    assert not got.discarded
                    out[rid] = got
            else:
                got = out.pop(rid, None)
                if got is not None:
                    runs.discard(got, "changed")
                    assert got.discarded == 1
            assert list(runs._runs) == model
        await runs.close(1.0)
        assert len(runs) == 0
        assert not runs.keep("late", _Fake())  # closed: declined

    asyncio.run(go())


class _Fake:
    """A kept activation as ``StickyRuns`` sees it: a resting body, discarded once."""

    def __init__(self) -> None:
        self.discarded = 0
        self.body: Body[str] = Body()
        self.body._resume = asyncio.get_running_loop().create_future()  # "resting"

    def discard(self) -> None:
        self.discarded += 1
        self.body.discard()


async def test_body_rests_goes_on_and_unwinds() -> None:
    body: Body[str] = Body()
    trace: list[str] = []

    async def code() -> str:
        try:
            for i in range(3):
                trace.append(f"rest {i}")
                await body.rest()
            return "done"
        except Parked:
            trace.append("unwound")
            return "parked"

    assert await body.drive(code) is None and body.resting
    assert await body.drive(code) is None and body.resting
    assert await body.drive(code) is None
    assert await body.drive(code) == "done" and body.ended
    assert trace == ["rest 0", "rest 1", "rest 2"]
    with pytest.raises(RuntimeError):
        await body.drive(code)

    discarded: Body[str] = Body()
    trace.clear()

    async def code2() -> str:
        try:
            await discarded.rest()
        except Parked:
            trace.append("unwound")
            raise
        return "never"

    assert await discarded.drive(code2) is None
    discarded.discard()
    await discarded.wait_ended()
    assert trace == ["unwound"] and discarded.ended


async def test_rest_outside_drive_parks() -> None:
    with pytest.raises(Parked):
        await Body[None]().rest()


async def test_a_cancelled_drive_cancels_the_code() -> None:
    body: Body[None] = Body()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def code() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(body.drive(code))
    await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert cancelled.is_set() and body.ended


# --- small helpers -----------------------------------------------------------------------------


def _holds(check: Any) -> Any:
    async def predicate() -> bool:
        return bool(check())

    return predicate


def _status(client: Client, run_id: str, status: str) -> Any:
    async def predicate() -> bool:
        return (await client.state(run_id)).status == status

    return predicate
