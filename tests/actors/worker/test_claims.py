"""Workers hold runs by executing them: no lease writes, and no step run twice by two live
workers (docs/decisions/0018-claims-without-lease-writes.md).

- Runs executed end to end write nothing to the leases stream: the events, the wakes and the
  workers' heartbeats are all the ownership there is.
- A wake that reaches a second worker while the first is inside a step is handed back, both
  before the first worker's beat lists the run (``open_step``: it may be running the step
  its activation just started) and after (``listed``); the step runs once.
- ``held_step``, ``Membership.holder`` and ``may_hold`` (pure) decide it, tested directly.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.core.membership import Membership
from sojourn.actors.worker.tenancy import held_step
from sojourn.broker import EmbeddedServer, publish_wake
from sojourn.broker.eventstore import Decision
from sojourn.broker.follow import read_all
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    CancelRequested,
    RunEvent,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepStarted,
    WaitStarted,
)
from sojourn.schemas.health import ActiveRun, WorkerBeat
from tests.conftest import wait_for

RAW_NULL = msgspec.Raw(b"null")

# --- the pure judgement ------------------------------------------------------------------------


def decision(seq: int, writer: str, *events: RunEvent) -> Decision:
    return Decision(seq, tuple(events), writer, f"m{seq}")


def started(position: int, at: float) -> StepStarted:
    return StepStarted(position=position, name=f"s{position}", at=at)


def completed(position: int) -> StepCompleted:
    return StepCompleted(position=position, name=f"s{position}", result=RAW_NULL)


def test_held_step_is_the_open_step_of_the_last_own_decision() -> None:
    begin = decision(1, "intake:w0", RunStarted(run_id="r", agent="a", input=RAW_NULL))
    assert held_step([begin]) is None
    step = decision(2, "host.example-12-ab.3", completed(0), started(1, at=50.0))
    # The worker id is everything before the activation number (host names have dots).
    assert held_step([begin, step]) == ("host.example-12-ab", 50.0)
    # A signal or a cancel request from the intake does not end an activation.
    signal = decision(3, "intake:w0", SignalReceived(name="go", payload=RAW_NULL, signal_id="s1"))
    cancel = decision(4, "intake:w0", CancelRequested())
    assert held_step([begin, step, signal, cancel]) == ("host.example-12-ab", 50.0)
    # A completed step, a parked run: nothing is running.
    done = decision(3, "host.example-12-ab.3", completed(1))
    assert held_step([begin, step, done]) is None
    parked = decision(
        3, "w9.1", completed(1), WaitStarted(position=2, key="signal:go", signals=("go",))
    )
    assert held_step([begin, step, parked]) is None
    # A writer that is not an activation (no activation number) holds nothing.
    assert held_step([begin, decision(2, "operator", started(1, at=1.0))]) is None


def beat(worker: str, at: float, *runs: tuple[str, float], stopped: bool = False) -> WorkerBeat:
    return WorkerBeat(
        worker_id=worker,
        at=at,
        started_at=1.0,
        stopped=stopped,
        runs=tuple(ActiveRun(r, "a", since) for r, since in runs),
    )


def test_membership_says_who_holds_a_run_and_who_may_be_in_its_step() -> None:
    m = Membership(dead_after=1.5)
    m.observe([(1, beat("A", 10.0, ("r1", 9.0))), (2, beat("B", 10.0))], now=100.0, wall=10.0)
    assert m.holder("r1") == "A"
    assert m.holder("r1", besides="A") is None
    assert m.holder("r2") is None
    # A step started after A's last beat: A may be in it. Before, and not listed: A is not.
    assert m.may_hold("A", "r2", since=10.5) is True
    assert m.may_hold("A", "r2", since=9.5) is False
    assert m.may_hold("A", "r1", since=9.5) is True  # listed
    assert m.may_hold("C", "r1", since=9.5) is None  # never seen: the caller asks the broker
    # A falls silent: once judged dead it holds nothing, listed or not.
    m.observe([(1, beat("A", 10.0, ("r1", 9.0))), (3, beat("B", 10.2))], now=101.0, wall=11.0)
    assert m.holder("r1") == "A"
    m.observe([(1, beat("A", 10.0, ("r1", 9.0))), (4, beat("B", 10.4))], now=101.7, wall=11.7)
    assert m.holder("r1") is None
    assert m.may_hold("A", "r1", since=10.5) is False
    # A graceful stop lets go of everything at once.
    m.observe([(5, beat("B", 10.6, ("r1", 10.5), stopped=True))], now=101.8, wall=11.8)
    assert m.holder("r1") is None and m.may_hold("B", "r1", since=11.0) is False


@hsettings(max_examples=300, deadline=None)
@given(
    runs=st.dictionaries(
        st.sampled_from(["W1", "W2", "W3"]),
        st.lists(st.sampled_from(["r1", "r2", "r3", "r4"]), unique=True, max_size=4),
        max_size=3,
    ),
    silent=st.sets(st.sampled_from(["W1", "W2", "W3"])),
    probe=st.sampled_from(["r1", "r2", "r3", "r4"]),
    me=st.sampled_from(["W1", "W2", "W3", "X"]),
)
def test_a_run_is_held_exactly_by_the_live_workers_that_list_it(
    runs: dict[str, list[str]], silent: set[str], probe: str, me: str
) -> None:
    m = Membership(dead_after=1.0)
    beats = {w: beat(w, 5.0, *((r, 4.0) for r in rs)) for w, rs in runs.items()}
    m.observe([(1, b) for b in beats.values()], now=0.0, wall=5.0)
    # The silent ones stop changing; the others beat on.
    later = [
        (1 if w in silent else 2, b if w in silent else beat(w, 6.0, *((r, 4.0) for r in runs[w])))
        for w, b in beats.items()
    ]
    m.observe(later, now=2.0, wall=7.0)
    holder = m.holder(probe, besides=me)
    live_listing = {w for w, rs in runs.items() if probe in rs and w not in silent and w != me}
    assert (holder is None) == (not live_listing)
    assert holder is None or holder in live_listing


# --- real workers --------------------------------------------------------------------------------

release = asyncio.Event()
executions: list[str] = []


def quick(n: int) -> int:
    return n + 1


async def slow(run_id: str) -> str:
    executions.append(run_id)
    await release.wait()
    return "done"


@agent("claims_slow")
async def claims_slow(ctx: Context, n: int) -> str:
    await ctx.step(quick, n)
    return await ctx.step(slow, ctx.run_id)


@agent("claims_quick")
async def claims_quick(ctx: Context, n: int) -> int:
    m = await ctx.step(quick, n)
    await ctx.sleep(0.05)
    return await ctx.step(quick, m)


async def test_runs_executed_end_to_end_write_no_leases(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([claims_quick], nats=nats_server.url, settings=settings):
        ids = [f"nl-{i}" for i in range(50)]
        await asyncio.gather(
            *(client.start("claims_quick", i, run_id=r) for i, r in enumerate(ids))
        )
        results = await asyncio.gather(*(client.result(r, timeout=60) for r in ids))
        assert results == [i + 2 for i in range(50)]
    names = client.names
    assert await read_all(client.broker, names.leases_stream, names.leases_all) == []


async def test_a_wake_for_a_run_inside_a_step_elsewhere_is_handed_back(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    release.clear()
    executions.clear()
    url = nats_server.url
    # A beats rarely: for its first seconds its beat does not list the run it executes, so
    # only the open-step rule can tell B to keep off. A has one slot: busy with the run, it
    # takes no wakes, and every wake goes to B.
    slow_beats = msgspec.structs.replace(settings, worker_beat_interval=4.0, worker_dead_after=30.0)
    patient = msgspec.structs.replace(settings, worker_dead_after=30.0)
    async with Worker(
        [claims_slow], nats=url, settings=slow_beats, worker_id="claims-a", concurrency=1
    ):
        async with Worker([claims_slow], nats=url, settings=patient, worker_id="claims-b") as b:
            run_id = "held-1"
            await client.start("claims_slow", 1, run_id=run_id)
            await wait_for(lambda: _true(bool(executions)), timeout=30, what="A inside the step")
            await publish_wake(client.broker, client.names, run_id, "rewake", agent="claims_slow")
            await wait_for(
                lambda: _true(b.handed_back["open_step"] > 0),
                timeout=30,
                what="B to hand the wake back (open step)",
            )
            # Once A's beat lists the run, B hands back without reading its history.
            await wait_for(
                lambda: _true(b.membership.holder(run_id, besides="claims-b") == "claims-a"),
                timeout=30,
                what="A's beat to list the run",
            )
            await publish_wake(client.broker, client.names, run_id, "rewake", agent="claims_slow")
            await wait_for(
                lambda: _true(b.handed_back["listed"] > 0),
                timeout=30,
                what="B to hand the wake back (listed)",
            )
            release.set()
            assert await client.result(run_id, timeout=30) == "done"
            assert executions == [run_id]  # the step ran once, on A
            history = await client.history(run_id)
            writers = {d.writer.rsplit(".", 1)[0] for d in history if "intake:" not in d.writer}
            assert writers == {"claims-a"}


async def _true(value: bool) -> bool:
    return value


async def test_a_stopping_worker_beats_on_until_its_last_run_rests(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """Its grace lasts longer than ``worker_dead_after``: were its beats to stop with its
    loops, the standby would take the run over and run the step a second time."""
    release.clear()
    executions.clear()
    url = nats_server.url
    a = Worker([claims_slow], nats=url, settings=settings, worker_id="stop-a")
    await a.start()
    stopping: asyncio.Task[None] | None = None
    try:
        async with Worker([claims_slow], nats=url, settings=settings, worker_id="stop-b") as b:
            run_id = "held-stop"
            await client.start("claims_slow", 1, run_id=run_id)
            await wait_for(lambda: _true(bool(executions)), timeout=30, what="A inside the step")
            began = time.time()
            stopping = asyncio.create_task(a.stop(grace=60.0))

            async def beats_went_on() -> bool:
                beat = b.membership.beat("stop-a")
                return beat is not None and beat.at > began + 2 * settings.worker_dead_after

            await wait_for(beats_went_on, timeout=30, what="A to beat on while it stops")
            assert b.membership.alive("stop-a")
            release.set()
            await asyncio.wait_for(stopping, 60)
            assert await client.result(run_id, timeout=30) == "done"
            assert executions == [run_id]  # never taken over: the step ran once

            async def stopped_beat() -> bool:
                beat = b.membership.beat("stop-a")
                return beat is not None and beat.stopped

            await wait_for(stopped_beat, timeout=30, what="A's stopped beat")
    finally:
        release.set()
        if stopping is None:
            await a.stop()
