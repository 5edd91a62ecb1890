"""Takeover of a dead worker's runs, with default settings: real worker processes, SIGKILL
and SIGSTOP.

A worker heartbeats every ``worker_beat_interval`` (0.25 s), listing its runs; other workers
count it dead after ``worker_dead_after`` (1.5 s) without a new beat and wake its runs, whose
leases its beats no longer vouch for. So a killed worker's runs resume in about two seconds,
not when a lease or an ack deadline (``lease_ttl``, 30 s) runs out. The tests check the
behaviour (every run resumes on another worker and ends with the right result; a stopped
worker's runs are flagged) under generous deadlines and print what they timed; the latency
targets are measured by ``python -m bench.takeover`` and ``python -m bench.liveness``
(docs/benchmarks.md), where load is a figure to report rather than a reason to fail.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import pytest

from sojourn.actors import Client, Watchdog
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.schemas.codec import decode_worker_beat
from sojourn.schemas.config import Settings
from sojourn.schemas.priority import Priority
from tests.conftest import wait_for
from tests.procs import WorkerProc

RUNS = 50
STEPS = 40  # x 0.2 s: every run is still executing when its worker dies
DEFAULT_TTL = Settings().lease_ttl
APP = "tests.apps.takeover"


@pytest.fixture
def procs() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.kill()


async def writers_of(client: Client, run_id: str) -> list[tuple[str, float]]:
    """(worker id, stored time) of each decision of the run, the intake's left out."""
    out = []
    names = client.names
    for m in await client.broker.direct_get_range(names.events_stream, names.events(run_id)):
        writer = m.header(h.WRITER)
        if not writer.startswith("intake:"):
            out.append((writer.rsplit(".", 1)[0], m.time))
    return out


async def runs_on(client: Client, run_ids: list[str], worker: str, steps: int) -> bool:
    """Whether every run has recorded ``steps`` decisions of ``worker``."""
    for r in run_ids:
        if sum(1 for w, _ in await writers_of(client, r) if w == worker) < steps:
            return False
    return True


async def resumed_after(client: Client, run_ids: list[str], dead: str, at: float) -> list[float]:
    """For each run, seconds from ``at`` to its first decision by a worker other than ``dead``."""
    out = []
    for r in run_ids:
        later = [t for w, t in await writers_of(client, r) if w != dead and t >= at]
        assert later, f"run {r} was never resumed"
        out.append(min(later) - at)
    return out


async def worker_ids(client: Client) -> dict[int, str]:
    """pid -> worker id, from the workers' heartbeats."""
    names = client.names
    msgs, _ = await client.broker.direct_get_batch(names.health_stream, names.workers_all, 1, 100)
    return {b.pid: b.worker_id for b in (decode_worker_beat(m.data) for m in msgs)}


async def start_worker(
    nats: EmbeddedServer, prefix: str, procs: list[WorkerProc], **env: str
) -> WorkerProc:
    p = await WorkerProc(nats.url, prefix, APP, lease_ttl=DEFAULT_TTL, **env).ready()
    procs.append(p)
    return p


@pytest.mark.parametrize("standby", ["standby", "restarted"])
async def test_a_killed_workers_runs_resume_on_another_worker(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    procs: list[WorkerProc],
    standby: str,
) -> None:
    first = await start_worker(nats_server, settings.prefix, procs)
    run_ids = [f"to-{i}" for i in range(RUNS)]
    await asyncio.gather(*(client.start("takeover", STEPS, run_id=r) for r in run_ids))
    ids = await worker_ids(client)
    first_id = ids[first.proc.pid]
    await wait_for(
        lambda: runs_on(client, run_ids, first_id, 4), timeout=60, what="every run under way"
    )
    if standby == "standby":
        await start_worker(nats_server, settings.prefix, procs)
    killed_at = time.time()
    first.kill()
    if standby == "restarted":
        await start_worker(nats_server, settings.prefix, procs)
    results = await asyncio.gather(*(client.result(r, timeout=120) for r in run_ids))
    assert results == [sum(range(STEPS))] * RUNS
    delays = sorted(await resumed_after(client, run_ids, first_id, killed_at))
    p50, worst = statistics.median(delays), delays[-1]
    print(f"\n{standby}: kill -> next recorded step p50 {p50:.2f}s, max {worst:.2f}s")


async def test_a_stopped_workers_runs_are_flagged_stalled(
    nats_server: EmbeddedServer, settings: Settings, client: Client, procs: list[WorkerProc]
) -> None:
    worker = await start_worker(nats_server, settings.prefix, procs)
    run_ids = [f"stop-{i}" for i in range(5)]
    await asyncio.gather(*(client.start("long_step", 120.0, run_id=r) for r in run_ids))
    flagged: dict[str, float] = {}

    def on_change(liv: object, _before: object) -> None:
        state, run_id = getattr(liv, "state", ""), getattr(liv, "run_id", "")
        if state == "stalled" and run_id in run_ids:
            flagged.setdefault(run_id, time.monotonic())

    async with Watchdog(nats=nats_server.url, settings=settings, on_change=on_change) as wd:

        async def all_running() -> bool:
            states = {r: wd.model.assessed.get(r) for r in run_ids}
            return all(s is not None and s.state == "running" for s in states.values())

        await wait_for(all_running, timeout=60, what="the runs to be judged running")
        worker.pause()
        stopped_at = time.monotonic()
        try:

            async def all_flagged() -> bool:
                return len(flagged) == len(run_ids)

            await wait_for(all_flagged, timeout=60, what="the runs to be flagged stalled")
        finally:
            worker.resume()
    late = max(flagged.values()) - stopped_at
    print(f"\nSIGSTOP -> stalled: {late:.2f}s")


async def test_a_thousand_running_runs_cost_a_few_writes_per_second(
    nats_server: EmbeddedServer, settings: Settings, client: Client, procs: list[WorkerProc]
) -> None:
    await start_worker(nats_server, settings.prefix, procs, SOJOURN_TEST_CONCURRENCY="1000")
    run_ids = [f"many-{i}" for i in range(1000)]
    for chunk in range(0, len(run_ids), 200):
        await asyncio.gather(
            *(client.start("long_step", 600.0, run_id=r) for r in run_ids[chunk : chunk + 200])
        )

    async def all_started() -> bool:
        names = client.names
        msgs, _ = await client.broker.direct_get_batch(
            names.health_stream, names.workers_all, 1, 10
        )
        return any(decode_worker_beat(m.data).active >= 1000 for m in msgs)

    await wait_for(all_started, timeout=120, what="1,000 runs executing")
    names = client.names
    seen: list[str] = []

    async def count(m: Delivery) -> None:
        seen.append(m.subject)

    subs = [
        await client.broker.subscribe(s, cb=count) for s in (names.leases_all, names.workers_all)
    ]
    window = 10.0
    await asyncio.sleep(window)  # counting what happens in a fixed window is the measurement
    for sub in subs:
        await sub.unsubscribe()
    rate = len(seen) / window
    print(f"\nownership and heartbeat writes with 1,000 running runs: {rate:.1f}/s")
    assert rate <= 10.0, rate


async def test_a_broker_outage_longer_than_dead_after_takes_no_run_over(
    own_server: EmbeddedServer, settings: Settings, procs: list[WorkerProc]
) -> None:
    """While the broker is down nobody can heartbeat, and nobody can look either: when it is
    back, no worker counts the silence against the others, so no run changes hands. (The
    owner's first beat usually lands before the standby's first look, so this guards the
    outcome; ``Membership.resume`` itself is tested in test_membership.py.)"""
    owner = await start_worker(own_server, settings.prefix, procs)
    client = await Client.connect(own_server.url, settings=settings)
    try:
        run_ids = [f"outage-{i}" for i in range(5)]
        await asyncio.gather(*(client.start("long_step", 6.0, run_id=r) for r in run_ids))
        owner_id = (await worker_ids(client))[owner.proc.pid]
        await wait_for(
            lambda: runs_on(client, run_ids, owner_id, 1), timeout=60, what="the steps running"
        )
        await start_worker(own_server, settings.prefix, procs)  # a standby that could take over
        await client.close()
        own_server.kill()
        await asyncio.sleep(3 * Settings().worker_dead_after)  # the outage itself
        await own_server.start()  # same store, same port: every process reconnects
        client = await Client.connect(own_server.url, settings=settings)
        results = await asyncio.gather(*(client.result(r, timeout=120) for r in run_ids))
        assert results == [6.0] * len(run_ids)
        for r in run_ids:
            assert {w for w, _ in await writers_of(client, r)} == {owner_id}, r
    finally:
        await client.close()


async def test_a_killed_workers_runs_resume_long_before_its_silence_would_condemn_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client, procs: list[WorkerProc]
) -> None:
    """With ``worker_dead_after`` at 30 s (and the wakes' ack deadline 30 s), a SIGKILLed
    worker's runs still resume within seconds: the survivor, seeing one beat missed, asks the
    server after the dead worker's presence subject and hears "no responders" (its connection
    is gone), so it takes the runs over without waiting for either deadline."""
    slow = {"SOJOURN_TEST_DEAD_AFTER": "30"}
    first = await start_worker(nats_server, settings.prefix, procs, **slow)
    run_ids = [f"gone-{i}" for i in range(10)]
    await asyncio.gather(*(client.start("takeover", STEPS, run_id=r) for r in run_ids))
    first_id = (await worker_ids(client))[first.proc.pid]
    await wait_for(
        lambda: runs_on(client, run_ids, first_id, 2), timeout=60, what="every run under way"
    )
    await start_worker(nats_server, settings.prefix, procs, **slow)
    killed_at = time.time()
    first.kill()
    # 20 s: well short of the 30 s either deadline would take, well above the ~1 s it takes.
    results = await asyncio.gather(*(client.result(r, timeout=20) for r in run_ids))
    assert results == [sum(range(STEPS))] * len(run_ids)
    delays = sorted(await resumed_after(client, run_ids, first_id, killed_at))
    print(f"\nkill -> next recorded step (dead_after 30 s): max {delays[-1]:.2f}s")


async def test_a_run_claimed_after_the_dead_workers_last_beat_resumes_without_a_redelivery(
    nats_server: EmbeddedServer, settings: Settings, client: Client, procs: list[WorkerProc]
) -> None:
    """A worker killed in the first milliseconds of a run, before any beat lists it: the
    survivor finds the run from the events stream above the dead worker's last beat
    (``WorkerBeat.events_seq``) and wakes it, long before the trigger's redelivery (30 s).

    The doomed worker beats every 4 s and the run starts just after one of its beats, so the
    kill lands before the next: its last beat cannot list the run (checked)."""
    slow = {"SOJOURN_TEST_DEAD_AFTER": "30", "SOJOURN_TEST_BEAT_INTERVAL": "4"}
    doomed = await start_worker(nats_server, settings.prefix, procs, **slow)
    doomed_id = (await worker_ids(client))[doomed.proc.pid]
    beats = await client.broker.subscribe(client.names.worker(doomed_id))
    await beats.next_msg(timeout=30)  # a beat just went: the next is 4 s away
    run_id = "claimed-early"
    await client.start("takeover", 10, run_id=run_id, priority=2)
    await wait_for(
        lambda: runs_on(client, [run_id], doomed_id, 1),
        timeout=3,
        interval=0.005,
        what="the run's first step by the doomed worker, before its next beat",
    )
    killed_at = time.time()
    doomed.kill()
    await beats.unsubscribe()
    names = client.names
    last = await client.broker.direct_get_last(names.health_stream, names.worker(doomed_id))
    assert last is not None
    assert run_id not in {r.run_id for r in decode_worker_beat(last.data).runs}
    wakes = await takeover_wakes(client)
    await start_worker(nats_server, settings.prefix, procs, **slow)
    # 20 s: well short of the 30 s the trigger's redelivery would take.
    assert await client.result(run_id, timeout=20) == sum(range(10))
    (delay,) = await resumed_after(client, [run_id], doomed_id, killed_at)
    print(f"\nkill -> next recorded step (claimed after the last beat): {delay:.2f}s")
    # Woken on its own lane, the priority read from its RunStarted.
    assert set(wakes) == {names.wake(run_id, "takeover", 2)}


async def takeover_wakes(client: Client) -> list[str]:
    """The subjects of the takeover wakes published from now on (filled as they come)."""
    subjects: list[str] = []

    async def on_wake(msg: Delivery) -> None:
        if msg.header(h.WAKE_REASON).startswith("takeover"):
            subjects.append(msg.subject)

    await client.broker.subscribe(f"{client.names.prefix}.wake.>", cb=on_wake)
    await client.broker.flush()
    return subjects


async def test_a_dead_workers_runs_are_woken_on_their_own_lanes(
    nats_server: EmbeddedServer, settings: Settings, client: Client, procs: list[WorkerProc]
) -> None:
    """A takeover wake goes on the run's lane (decision 0049): a killed worker's beat lists
    each run's priority, so its urgent run is woken on the urgent lane and its bulk run on the
    bulk lane, not both on the default one."""
    first = await start_worker(nats_server, settings.prefix, procs)
    lanes: dict[str, Priority] = {"lane-urgent": 1, "lane-bulk": 5}
    for run_id, priority in lanes.items():
        await client.start("takeover", STEPS, run_id=run_id, priority=priority)
    first_id = (await worker_ids(client))[first.proc.pid]
    names = client.names

    async def listed() -> bool:
        last = await client.broker.direct_get_last(names.health_stream, names.worker(first_id))
        runs = decode_worker_beat(last.data).runs if last is not None else ()
        return {(r.run_id, r.priority) for r in runs} >= set(lanes.items())

    await wait_for(listed, timeout=60, what="a beat listing both runs with their priorities")
    wakes = await takeover_wakes(client)
    await start_worker(nats_server, settings.prefix, procs)
    first.kill()
    results = await asyncio.gather(*(client.result(r, timeout=60) for r in lanes))
    assert results == [sum(range(STEPS))] * len(lanes)
    assert set(wakes) == {names.wake(r, "takeover", p) for r, p in lanes.items()}
