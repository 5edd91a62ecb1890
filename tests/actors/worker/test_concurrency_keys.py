"""Concurrency keys (decision 0048) against a real nats-server: at most N live runs per key,
the rest queued (``pending``, ``queued on key K, position P``) and admitted in arrival order as
slots free; a queued run cancelled leaves the queue; hostile keys and limits refused with a
typed code; a SIGKILLed worker's slots come back within the take-over time."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from sojourn.actors import Client, Worker
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.concurrency import ConcurrencyStore
from sojourn.projections.projector import Projector
from sojourn.schemas.codec import decode_dead_letter
from sojourn.schemas.concurrency import QueueEntry, SlotHolder, SlotsRecord, key_token
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import RunAdmitted, RunCompleted, RunStarted
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from tests.actors.worker.test_bad_input import send_raw
from tests.apps.concurrency import keyed_chain, keyed_fast, keyed_wait, tenant_job
from tests.conftest import wait_for
from tests.procs import WorkerProc


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


async def test_queued_runs_show_their_position_and_are_admitted_in_order(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    conc = {"key": "tenant-1", "limit": 2}
    async with Worker([keyed_wait, keyed_fast], nats=nats_server.url, settings=settings):
        ids = [
            await client.start("keyed_wait", f"t{i}", run_id=f"w{i}", concurrency=conc, wait=True)
            for i in range(6)
        ]

        async def two_waiting() -> bool:
            return [await client.status(r) for r in ids[:2]] == ["waiting", "waiting"]

        await wait_for(two_waiting, timeout=30, what="two runs to hold the slots")
        for i, rid in enumerate(ids[2:], 1):
            state = await client.state(rid)
            assert state.status == "pending" and state.queued
            assert await client.queued_detail(state) == f"queued on key tenant-1, position {i}"
        listing = await client.queue("keyed_wait", "tenant-1")
        assert listing.depth == 4 and [q.run_id for q in listing.queued] == ids[2:]
        assert sorted(h.run_id for h in listing.holders) == ids[:2]
        # Another key is not held up.
        other = await client.start(
            "keyed_wait", "o", concurrency={"key": "tenant-2", "limit": 2}, wait=True
        )

        async def other_waits() -> bool:
            return await client.status(other) == "waiting"

        await wait_for(other_waits, timeout=30, what="another key's run to run")
        # Cancelling a queued run takes it out of the queue, holding nothing.
        await client.cancel(ids[3])

        async def cancelled() -> bool:
            return await client.status(ids[3]) == "cancelled"

        await wait_for(cancelled, timeout=30, what="the queued run to be cancelled")

        async def left() -> bool:  # its end's side job takes it out of the queue
            listing = await client.queue("keyed_wait", "tenant-1")
            return [q.run_id for q in listing.queued] == [ids[2], ids[4], ids[5]]

        await wait_for(left, timeout=30, what="the cancelled run to leave the queue")
        cancelled_state = await client.state(ids[3])
        assert cancelled_state.steps_completed == 0 and not cancelled_state.queued
        s5 = await client.state(ids[5])
        assert await client.queued_detail(s5) == "queued on key tenant-1, position 3"
        # A slot freed admits the oldest queued run.
        await client.signal(ids[0], "go")
        assert await client.result(ids[0], timeout=30) == "t0"

        async def admitted() -> bool:
            return await client.status(ids[2]) == "waiting"

        await wait_for(admitted, timeout=30, what="the head of the queue to be admitted")
        assert await client.status(ids[4]) == "pending"
        for rid in [ids[1], ids[2], ids[4], ids[5], other]:

            async def waiting(rid: str = rid) -> bool:
                return await client.status(rid) == "waiting"

            await wait_for(waiting, timeout=30, what=f"{rid} to be admitted")
            await client.signal(rid, "go")
        for i in (1, 2, 4, 5):
            assert await client.result(ids[i], timeout=30) == f"t{i}"
        await _key_is_free(client, "keyed_wait", "tenant-1")


# --- the fleet: two worker processes, one SIGKILLed -----------------------------------------


def _overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    points = sorted([(b, 1) for b, _ in intervals] + [(e, -1) for _, e in intervals])
    most = live = 0
    for _, d in points:
        live += d
        most = max(most, live)
    return most


def _ledger_intervals(path: Path, tenant: str) -> dict[str, tuple[float, float]]:
    """Per run: from its step's first start to its last end, as the step recorded them."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT run_id, MIN(began), MAX(ended) FROM live WHERE tenant = ? GROUP BY run_id",
            (tenant,),
        ).fetchall()
    finally:
        db.close()
    return {r: (b, e if e is not None else float("inf")) for r, b, e in rows}


def _ledger_rows(path: Path) -> list[tuple[str, str, float, float | None, int]]:
    if not path.exists():
        return []
    db = sqlite3.connect(path, timeout=30)
    try:
        return db.execute("SELECT run_id, tenant, began, ended, pid FROM live").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


async def _history_intervals(client: Client, run_ids: list[str]) -> dict[str, tuple[float, float]]:
    """Per run: from when it took its slot (``RunAdmitted``, or ``RunStarted`` when it took
    one at once) to its end, from its history; every run has exactly one end."""
    out: dict[str, tuple[float, float]] = {}
    for rid in run_ids:
        events = [e for d in await client.history(rid) for e in d.events]
        started = events[0]
        assert isinstance(started, RunStarted) and started.concurrency is not None
        admitted = [e for e in events if isinstance(e, RunAdmitted)]
        ends = [e for e in events if isinstance(e, TERMINAL_EVENTS)]
        assert len(ends) == 1 and isinstance(ends[0], RunCompleted), (rid, events)
        if started.concurrency.ticket:
            assert len(admitted) == 1, (rid, events)
            began = admitted[0].at
        else:
            assert not admitted, (rid, events)
            began = started.at
        out[rid] = (began, ends[0].at)
    return out


@pytest.mark.slow(23)
@pytest.mark.timeout(400)
async def test_limit_2_holds_fleet_wide_across_a_sigkill_and_another_key_is_not_delayed(
    nats_server: EmbeddedServer, client: Client, settings: Settings, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    ledger_env = str(ledger)
    module = "tests.apps.concurrency"
    workers = [
        await WorkerProc(
            nats_server.url, settings.prefix, module, SOJOURN_TEST_LEDGER=ledger_env
        ).ready()
        for _ in range(2)
    ]
    spare: WorkerProc | None = None
    try:
        slow = [f"a{i:02d}" for i in range(50)]
        fast = [f"b{i:02d}" for i in range(50)]
        began = time.monotonic()
        for i, rid in enumerate(slow):
            job = {"tenant": "A", "n": i, "work": 0.8}  # key A needs 20 s at the least
            await client.start(
                "ledger_job", job, run_id=rid, concurrency={"key": "A", "limit": 2}, wait=True
            )
        for i, rid in enumerate(fast):
            job = {"tenant": "B", "n": i, "work": 0.4}
            await client.start(
                "ledger_job", job, run_id=rid, concurrency={"key": "B", "limit": 100}, wait=True
            )
        # Key B's runs are not behind key A's queue: all done while A's is still long.
        for i, rid in enumerate(fast):
            assert await client.result(rid, timeout=60) == i
        depth = (await client.queue("ledger_job", "A")).depth
        print(f"key B's 50 runs done in {time.monotonic() - began:.1f}s; key A's queue: {depth}")
        assert depth >= 20, f"key A's queue is {depth} when key B is done: B waited for A"

        # SIGKILL a worker in the middle of a key-A step; the slot its run holds comes back
        # once the run is taken over and finishes.
        pids = {w.proc.pid: w for w in workers}
        in_flight: list[tuple[str, int]] = []

        async def a_step_in_flight() -> bool:
            rows = _ledger_rows(ledger)
            done = {r[0] for r in rows if r[3] is not None}
            in_flight[:] = [
                (r[0], r[4]) for r in rows if r[1] == "A" and r[0] not in done and r[4] in pids
            ]
            return bool(in_flight)

        await wait_for(a_step_in_flight, timeout=60, what="a key-A step in flight")
        victim_run, victim_pid = in_flight[0]
        pids[victim_pid].kill()
        killed_at = time.time()
        spare = await WorkerProc(
            nats_server.url, settings.prefix, module, SOJOURN_TEST_LEDGER=ledger_env
        ).ready()

        async def both_slots_busy_again() -> bool:
            fresh = {r[0] for r in _ledger_rows(ledger) if r[1] == "A" and r[2] > killed_at}
            return len(fresh) >= 2

        await wait_for(both_slots_busy_again, timeout=60, what="key A's 2 slots in use again")
        print(f"key A's slots back {time.time() - killed_at:.1f}s after the SIGKILL")
        # The killed worker's run was taken over (its step ran again, elsewhere) unless its
        # step had just finished before the kill.
        assert await client.result(victim_run, timeout=60) is not None
        rows = [r for r in _ledger_rows(ledger) if r[0] == victim_run]
        if not any(r[3] is not None and r[4] == victim_pid for r in rows):
            assert any(r[4] != victim_pid and r[3] is not None for r in rows), rows

        for i, rid in enumerate(slow):
            assert await client.result(rid, timeout=180) == i
        by_history = await _history_intervals(client, slow)
        assert _overlap(list(by_history.values())) == 2  # never more, and the key was used
        by_ledger = _ledger_intervals(ledger, "A")
        assert set(by_ledger) == set(slow)
        assert _overlap(list(by_ledger.values())) <= 2
        assert _overlap(list((await _history_intervals(client, fast)).values())) > 2
        await _key_is_free(client, "ledger_job", "A")
    finally:
        for w in [*workers, *([spare] if spare else [])]:
            w.kill()


# --- hostile bodies, and a key the agent declares ----------------------------------------------

HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("keyed_fast", {"input": 1, "concurrency": {"key": "", "limit": 2}}, "invalid_concurrency"),
    (
        "keyed_fast",
        {"input": 1, "concurrency": {"key": "k" * 257, "limit": 2}},
        "invalid_concurrency",
    ),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "a\nb", "limit": 2}}, "invalid_concurrency"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k", "limit": 0}}, "invalid_concurrency"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k", "limit": -5}}, "invalid_concurrency"),
    (
        "keyed_fast",
        {"input": 1, "concurrency": {"key": "k", "limit": 10**9}},
        "invalid_concurrency",
    ),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k", "limit": 2**70}}, "out_of_range"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k", "limit": 1.5}}, "invalid_trigger"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k", "limit": "2"}}, "invalid_trigger"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": 5, "limit": 2}}, "invalid_trigger"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "k"}}, "invalid_trigger"),
    (
        "keyed_fast",
        {"input": 1, "concurrency": {"key": "k", "limit": 2, "x": 1}},
        "invalid_trigger",
    ),
    ("keyed_fast", {"input": 1, "concurrency": "k"}, "invalid_trigger"),
    ("keyed_fast", {"input": 1, "concurrency": {"key": "\ud800", "limit": 2}}, "invalid_encoding"),
    (
        "keyed_fast",
        {"input": 1, "concurrency": {"key": "k", "limit": 2}, "singleton_key": "k"},
        "invalid_concurrency",
    ),
    ("keyed_fast", {"input": "x", "concurrency": {"key": "k", "limit": 2}}, "invalid_input"),
    # the agent declares its own key: a start names none, and its input must make one
    (
        "tenant_job",
        {"input": {"tenant": "t", "n": 1}, "concurrency": {"key": "k", "limit": 2}},
        "invalid_concurrency",
    ),
    ("tenant_job", {"input": {"tenant": "", "n": 1}}, "invalid_concurrency"),
    ("tenant_job", {"input": {"tenant": "x" * 300, "n": 1}}, "invalid_concurrency"),
    ("tenant_job", {"input": {"n": 1}}, "invalid_input"),
]


async def test_hostile_concurrency_is_refused_with_a_typed_code_and_creates_nothing(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with Worker([keyed_fast, tenant_job], nats=nats_server.url, settings=settings):
        for agent_name, body, code in HOSTILE:
            answer: Any = await send_raw(broker, names.start(agent_name), json.dumps(body).encode())
            assert answer.get("error", {}).get("code") == code, (body, answer)
            letter = await broker.direct_get_last(names.dlq_stream, names.dlq("start"))
            assert letter is not None and decode_dead_letter(letter.data).code == code
        # Bytes that are not UTF-8 inside a key never get to be a key.
        answer = await send_raw(
            broker,
            names.start("keyed_fast"),
            b'{"input": 1, "concurrency": {"key": "\xff\xfe", "limit": 2}}',
        )
        assert answer["error"]["code"] == "invalid_encoding"
        events = await broker.direct_get_range(names.events_stream, names.events("*"))
        assert events == [], "a refused start created a run"
        nothing = await broker.direct_get_range(
            names.schedules_stream, f"{names.prefix}.schedule.flow.>"
        )
        assert nothing == [], "a refused start wrote a slot or a queue entry"
        # The client refuses the same before publishing anything.
        for bad in ({"key": "", "limit": 2}, {"key": "k", "limit": 0}, {"key": "k"}, {"x": 1}):
            with pytest.raises(ValueError):
                await client.start("keyed_fast", 1, concurrency=bad)
        # ... and the worker goes on serving.
        rid = await client.start("keyed_fast", 7, concurrency={"key": "k", "limit": 1}, wait=True)
        assert await client.result(rid, timeout=30) == 7


async def test_an_agent_declared_key_limits_runs_by_their_input(
    nats_server: EmbeddedServer,
    client: Client,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("SOJOURN_TEST_LEDGER", str(ledger))

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"agent": "tenant_job", **labels}) or 0.0

    before = (
        sample("sojourn_concurrency_queued_total"),
        sample("sojourn_concurrency_admitted_total", how="queue"),
        sample("sojourn_concurrency_released_total", how="ended"),
        sample("sojourn_concurrency_queue_wait_seconds_count"),
    )
    async with Worker([tenant_job], nats=nats_server.url, settings=settings):
        ids = [
            await client.start(
                "tenant_job", {"tenant": "t1" if i % 2 else "t2", "n": i, "work": 0.2}, wait=True
            )
            for i in range(10)
        ]
        assert [await client.result(r, timeout=60) for r in ids] == list(range(10))
    for tenant in ("t1", "t2"):
        assert _overlap(list(_ledger_intervals(ledger, tenant).values())) == 2
    states = [await client.state(r) for r in ids]
    assert all(s.concurrency is not None and s.concurrency.limit == 2 for s in states)
    queued = sum(1 for s in states if s.concurrency is not None and s.concurrency.ticket)
    assert queued > 0
    after = (
        sample("sojourn_concurrency_queued_total"),
        sample("sojourn_concurrency_admitted_total", how="queue"),
        sample("sojourn_concurrency_released_total", how="ended"),
        sample("sojourn_concurrency_queue_wait_seconds_count"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [queued, queued, 10, queued]


# --- a worker SIGKILLed at each seam of the key's records ------------------------------------

MODULE = "tests.apps.concurrency"
ONE = {"key": "crash", "limit": 1}


async def _doomed(url: str, prefix: str, seam: str) -> WorkerProc:
    return await WorkerProc(
        url, prefix, MODULE, SOJOURN_FAULTS=seam, SOJOURN_FAULT_RATE="1"
    ).ready()


async def _finish(client: Client, run_ids: list[str]) -> None:
    """Let every run through the key, one at a time: each is admitted, then told to go."""
    for rid in run_ids:

        async def waiting(rid: str = rid) -> bool:
            return await client.status(rid) == "waiting"

        await wait_for(waiting, timeout=90, what=f"{rid} to hold the key's slot")
        await client.signal(rid, "go")
        assert await client.result(rid, timeout=60) == rid


async def _waiting(client: Client, run_id: str) -> bool:
    return await client.status(run_id) == "waiting"


async def _key_is_free(client: Client, agent: str = "keyed_wait", key: str = "crash") -> None:
    """Every slot given back (the end's side job, just after the end is stored) and nothing
    queued."""

    async def free() -> bool:
        listing = await client.queue(agent, key)
        return listing.depth == 0 and listing.holders == ()

    await wait_for(free, timeout=30, what=f"key {key!r} to be free")


async def test_killed_after_taking_a_slot_before_creating_the_run(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    """The slot names a run not created yet, whose start is still in the inbox: a start
    meanwhile queues behind it, and the redelivered start creates it."""
    doomed = await _doomed(nats_server.url, settings.prefix, "concurrency_slot_taken")
    try:
        first = await client.trigger("keyed_wait", "x0", run_id="x0", concurrency=ONE, timeout=3)
        assert first.queued  # no answer: it took the slot and died
        await asyncio.to_thread(doomed.proc.wait, 60)
        healthy = await WorkerProc(nats_server.url, settings.prefix, MODULE).ready()
        try:
            await client.start("keyed_wait", "x1", run_id="x1", concurrency=ONE, wait=True)
            assert (await client.state("x1")).queued
            await _finish(client, ["x0", "x1"])
            await _key_is_free(client)
        finally:
            healthy.stop()
    finally:
        doomed.kill()


async def test_killed_after_queueing_before_creating_the_run(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    """The entry names a run not created yet: the key's pump waits for it (first in line)
    rather than pass it, and the redelivered start creates it queued."""
    healthy = await WorkerProc(nats_server.url, settings.prefix, MODULE).ready()
    doomed: WorkerProc | None = None
    try:
        await client.start("keyed_wait", "y0", run_id="y0", concurrency=ONE, wait=True)
        healthy.stop()
        doomed = await _doomed(nats_server.url, settings.prefix, "concurrency_queued")
        second = await client.trigger("keyed_wait", "y1", run_id="y1", concurrency=ONE, timeout=3)
        assert second.queued  # it queued the run and died
        await asyncio.to_thread(doomed.proc.wait, 60)
        healthy = await WorkerProc(nats_server.url, settings.prefix, MODULE).ready()
        await client.start("keyed_wait", "y2", run_id="y2", concurrency=ONE, wait=True)
        await _finish(client, ["y0", "y1", "y2"])  # in arrival order
        await _key_is_free(client)
    finally:
        healthy.kill()
        if doomed is not None:
            doomed.kill()


async def test_killed_after_taking_a_slot_for_a_queued_run_before_recording_it(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    """The ended run's side jobs are redone (its worker died before its wake was settled):
    the pump finds the slot already the queued run's and records its admission."""
    doomed = await _doomed(nats_server.url, settings.prefix, "concurrency_admitted")
    try:
        await client.start("keyed_wait", "z0", run_id="z0", concurrency=ONE, wait=True)
        await client.start("keyed_wait", "z1", run_id="z1", concurrency=ONE, wait=True)

        async def z0_waits() -> bool:
            return await client.status("z0") == "waiting"

        await wait_for(z0_waits, timeout=60, what="z0 to hold the slot")
        assert (await client.state("z1")).queued
        await client.signal("z0", "go")
        assert await client.result("z0", timeout=60) == "z0"
        await asyncio.to_thread(doomed.proc.wait, 60)  # it took the slot for z1 and died
        listing = await client.queue("keyed_wait", "crash")
        assert [h.run_id for h in listing.holders] == ["z1"] and (await client.state("z1")).queued
        healthy = await WorkerProc(nats_server.url, settings.prefix, MODULE).ready()
        try:
            await _finish(client, ["z1"])
            await _key_is_free(client)
        finally:
            healthy.stop()
    finally:
        doomed.kill()


async def test_a_chain_keeps_its_slot_across_continue_as_new(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    conc = {"key": "chain", "limit": 1}
    async with Worker([keyed_chain], nats=nats_server.url, settings=settings):
        await client.start("keyed_chain", 1, run_id="c", concurrency=conc, wait=True)
        await client.start("keyed_chain", 0, run_id="d", concurrency=conc, wait=True)

        async def waiting(rid: str) -> bool:
            try:
                return await client.status(rid) == "waiting"
            except RunNotFound:
                return False

        await wait_for(lambda: waiting("c"), timeout=30, what="c to hold the slot")
        await client.signal("c", "go")
        await wait_for(lambda: waiting("c-g2"), timeout=30, what="the chain's next run")
        listing = await client.queue("keyed_chain", "chain")
        assert [h.run_id for h in listing.holders] == ["c"]  # named by the chain's first run
        assert (await client.state("d")).queued
        assert (await client.state("c-g2")).concurrency is not None
        await client.signal("c", "go")  # reaches the chain's current run
        assert await client.result("c", timeout=30) == 0
        await wait_for(lambda: waiting("d"), timeout=30, what="d to be admitted")
        await client.signal("d", "go")
        assert await client.result("d", timeout=30) == 0
        await _key_is_free(client, "keyed_chain", "chain")


async def test_the_projector_s_view_of_a_queued_run_says_where_it_stands(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    conc = {"key": "viewed", "limit": 1}
    async with (
        Projector(nats=nats_server.url, settings=settings, interval=0.2) as projector,
        Worker([keyed_wait], nats=nats_server.url, settings=settings),
    ):
        for n in range(4):
            await client.start("keyed_wait", f"t{n}", run_id=f"v{n}", concurrency=conc, wait=True)

        async def placed(rid: str, position: int) -> bool:
            view = await client.view(rid)
            return (
                view is not None
                and view.status == "pending"
                and view.waiting_on == ("queue:viewed",)
                and view.queue_position == position
                and view.detail == f"queued on key viewed, position {position}"
            )

        for i in (1, 2, 3):

            async def at_place(i: int = i) -> bool:
                return await placed(f"v{i}", i)

            await wait_for(at_place, timeout=30, what=f"v{i}'s view")
        assert projector.leading
        await client.cancel("v2")  # the runs behind it move up
        await wait_for(lambda: placed("v3", 2), timeout=30, what="v3's view to move up")

        await wait_for(lambda: _waiting(client, "v0"), timeout=30, what="v0 to hold the slot")
        await client.signal("v0", "go")

        async def admitted_view() -> bool:
            view = await client.view("v1")
            return view is not None and view.status == "waiting" and view.detail is None

        await wait_for(admitted_view, timeout=30, what="v1's view once admitted")
        await wait_for(lambda: placed("v3", 1), timeout=30, what="v3 to be next")


async def test_forged_records_do_not_stall_a_key(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    """Anyone may publish on a deployment without authentication: a slots record that is not
    one, a full one naming runs that never came, queue entries that are garbage or name no run.
    The key goes on: garbage is written over or dropped, dead holders are reclaimed."""
    names = Names(settings.prefix)
    store = ConcurrencyStore(broker, names)
    token = key_token("forged")
    conc = {"key": "forged", "limit": 2}
    async with Worker([keyed_fast], nats=nats_server.url, settings=settings):
        await broker.publish(store.slots_subject("keyed_fast", token), b'{"not": "a record"')
        await broker.publish(store.queue_subject("keyed_fast", token, "junk"), b"\xff\x00")
        rid = await client.start("keyed_fast", 1, concurrency=conc, wait=True)
        assert await client.result(rid, timeout=30) == 1
        full = SlotsRecord(
            agent="keyed_fast",
            key="forged",
            limit=2,
            holders=(SlotHolder("ghost-1", 999_999, 0.0), SlotHolder("ghost-2", 999_998, 0.0)),
        )
        await _key_is_free(client, "keyed_fast", "forged")  # its end gave its slot back
        _, seq = await store.slots("keyed_fast", token)
        await store.put_slots(token, full, seq)
        ghost = QueueEntry(
            agent="keyed_fast", key="forged", run_id="ghost-3", limit=2, inbox_seq=999_997, at=0.0
        )
        await store.enqueue(token, ghost)
        ids = [
            await client.start("keyed_fast", n, concurrency=conc, wait=True) for n in range(2, 6)
        ]
        for n, r in enumerate(ids, 2):
            assert await client.result(r, timeout=60) == n
        await _key_is_free(client, "keyed_fast", "forged")


async def test_a_run_started_again_keeps_its_slot_and_its_place(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    """The same run id started again (outside the inbox's dedup: a raw publish) is one run: a
    holder keeps its slot, a queued run its place, and neither is started twice."""
    names = Names(settings.prefix)
    conc = {"key": "again", "limit": 1}
    async with Worker([keyed_wait], nats=nats_server.url, settings=settings):
        await client.start("keyed_wait", "a", run_id="s1", concurrency=conc, wait=True)
        await client.start("keyed_wait", "b", run_id="s2", concurrency=conc, wait=True)
        await wait_for(lambda: _waiting(client, "s1"), timeout=30, what="s1 to hold the slot")
        body = json.dumps({"input": "x", "concurrency": conc}).encode()
        for rid in ("s1", "s2"):
            answer: Any = await send_raw(broker, names.start("keyed_wait", None, rid), body)
            assert answer == {"run_id": rid, "created": False}, answer
        listing = await client.queue("keyed_wait", "again")
        assert [h.run_id for h in listing.holders] == ["s1"]
        assert [q.run_id for q in listing.queued] == ["s2"]
        assert await client.status("s1") == "waiting" and (await client.state("s2")).queued
        await client.signal("s1", "go")
        await wait_for(lambda: _waiting(client, "s2"), timeout=30, what="s2 to be admitted")
        # A fork of a run queued at its start counts against no key: it runs at once.
        fork = await client.fork("s2", from_step=0, fork_id="s2-fork", signal=("go", None))
        assert await client.result(fork, timeout=30) == "b"
        assert (await client.state(fork)).concurrency is None
        await client.signal("s2", "go")
        assert await client.result("s2", timeout=30) == "b"
        await _key_is_free(client, "keyed_wait", "again")
