"""Singleton and debounced starts (decision 0047) against a real nats-server: one run per
key while it lives, one run per burst with the last (or every) input, across two worker
processes and a worker SIGKILLed at the dangerous point; hostile bodies refused with a typed
code and nothing created."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from sojourn.actors import Client, RunCancelledError, Worker
from sojourn.actors.worker import debounce
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.connection import JetStreamError
from sojourn.broker.flow import FlowStore
from sojourn.schemas.codec import decode_dead_letter, decode_events, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.events import CancelRequested, RunCancelled, RunStarted
from sojourn.schemas.flow import SingletonRecord, key_token
from tests.actors.worker.test_bad_input import send_raw
from tests.apps.chains import chat
from tests.apps.keyed import batch, gate, latest
from tests.conftest import wait_for
from tests.procs import WorkerProc


async def runs_of(broker: Broker, names: Names, agent: str) -> dict[str, RunStarted]:
    """Every run of ``agent`` that exists, by id (from the events stream)."""
    out: dict[str, RunStarted] = {}
    for m in await broker.direct_get_range(names.events_stream, names.events("*")):
        for ev in decode_events(m.data):
            if isinstance(ev, RunStarted) and ev.agent == agent:
                assert ev.run_id not in out, f"run {ev.run_id} started twice"
                out[ev.run_id] = ev
    return out


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


# --- debounce ------------------------------------------------------------------------------


async def test_a_burst_of_100_starts_one_run_with_the_last_input(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with Worker([latest], nats=nats_server.url, settings=settings):
        began = time.monotonic()
        receipts = [
            await client.trigger("latest", i, debounce=1.5, debounce_key="orders-42")
            for i in range(100)
        ]
        took = time.monotonic() - began
        assert took < 10, f"100 triggers took {took:.1f}s: not one burst"
        ids = {r.run_id for r in receipts}
        assert len(ids) == 1 and all(r.debounced and not r.created for r in receipts)
        (run_id,) = ids
        assert await runs_of(broker, names, "latest") == {}  # not before the burst ends
        assert await client.result(run_id, timeout=60) == 99
        assert list(await runs_of(broker, names, "latest")) == [run_id]
        # Nothing is left to start another: the burst is closed, holding all 100, and no fire
        # is pending.
        token = key_token("orders-42")
        rec, _ = await FlowStore(broker, names).burst("latest", token)
        assert rec is not None and rec.closed and rec.count == 100 and rec.run_id == run_id
        timer = FlowStore.subject(names, "timer", "latest", token)
        assert await broker.direct_get_last(names.schedules_stream, timer) is None
        # The next trigger with the key is a new burst, and a new run.
        nxt = await client.trigger("latest", 7, debounce=0.5, debounce_key="orders-42")
        assert nxt.run_id != run_id
        assert await client.result(nxt.run_id, timeout=60) == 7


async def test_a_debounced_run_cancelled_before_its_burst_fires_ends_cancelled(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    """Its id is answered at once, its run exists only when the burst fires (here 7 s later,
    past the retries a cancel of an unknown run gets): a cancel sent meanwhile waits in the
    inbox and is recorded with the run's start, which then runs nothing; the next start with
    the key begins a new burst, which runs."""
    async with Worker([latest], nats=nats_server.url, settings=settings):
        first = await client.trigger("latest", 1, debounce=7.0, debounce_key="doc-7")
        await client.cancel(first.run_id, "not needed", by="ops")
        with pytest.raises(RunCancelledError):
            await client.result(first.run_id, timeout=60)
        events = [e for d in await client.history(first.run_id) for e in d.events]
        assert [type(e) for e in events] == [RunStarted, CancelRequested, RunCancelled]
        cancel = events[1]
        assert isinstance(cancel, CancelRequested) and cancel.reason == "not needed"
        nxt = await client.trigger("latest", 2, debounce=0.5, debounce_key="doc-7")
        assert nxt.run_id != first.run_id
        assert await client.result(nxt.run_id, timeout=60) == 2


async def test_a_burst_of_100_concurrent_starts_on_two_workers_carries_all(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with (
        Worker([batch], nats=nats_server.url, settings=settings),
        Worker([batch], nats=nats_server.url, settings=settings),
    ):
        receipts = await asyncio.gather(
            *(
                client.trigger("batch", i, debounce=2.0, debounce_key="k", debounce_inputs="all")
                for i in range(100)
            )
        )
        ids = {r.run_id for r in receipts}
        assert len(ids) == 1, ids
        (run_id,) = ids
        got = await client.result(run_id, timeout=60)
        assert sorted(got) == list(range(100))
        runs = await runs_of(broker, names, "batch")
        assert list(runs) == [run_id]
        assert json.loads(bytes(runs[run_id].input)) == got  # in the inbox's order


async def test_a_full_burst_starts_at_once_and_the_next_burst_goes_on(
    nats_server: EmbeddedServer,
    client: Client,
    broker: Broker,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond the bound nothing is dropped: the full burst's run starts now with its inputs,
    and the trigger that did not fit begins the next burst."""
    monkeypatch.setattr(debounce, "DEBOUNCE_INPUTS_MAX", 10)
    names = Names(settings.prefix)
    async with Worker([batch], nats=nats_server.url, settings=settings):
        receipts = [
            await client.trigger("batch", i, debounce=60, debounce_key="k", debounce_inputs="all")
            for i in range(25)
        ]
        bursts = list(dict.fromkeys(r.run_id for r in receipts))
        assert len(bursts) == 3
        assert await client.result(bursts[0], timeout=60) == list(range(10))
        assert await client.result(bursts[1], timeout=60) == list(range(10, 20))
        assert set(await runs_of(broker, names, "batch")) == set(bursts[:2])  # the third waits


async def test_debounce_redelivered_fire_after_sigkill_starts_the_run_once(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    doomed = await WorkerProc(
        nats_server.url,
        settings.prefix,
        "tests.apps.keyed",
        SOJOURN_FAULTS="debounce_closed",
        SOJOURN_FAULT_RATE="1",
    ).ready()
    try:
        r = await client.trigger("latest", 5, debounce=0.5, debounce_key="crash")
        assert r.debounced
        await asyncio.to_thread(doomed.proc.wait, 60)  # it closed the burst and died
        assert await runs_of(broker, names, "latest") == {}
        healthy = await WorkerProc(nats_server.url, settings.prefix, "tests.apps.keyed").ready()
        try:
            assert await client.result(r.run_id, timeout=90) == 5
            assert list(await runs_of(broker, names, "latest")) == [r.run_id]
        finally:
            healthy.stop()
    finally:
        doomed.kill()


# --- singleton -------------------------------------------------------------------------------


async def test_20_concurrent_singleton_starts_on_two_workers_make_one_run(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    workers = [
        await WorkerProc(nats_server.url, settings.prefix, "tests.apps.keyed").ready()
        for _ in range(2)
    ]
    try:
        receipts = await asyncio.gather(
            *(
                client.trigger("gate", f"t{i}", singleton_key="tenant-7", timeout=30)
                for i in range(20)
            )
        )
        ids = {r.run_id for r in receipts}
        assert len(ids) == 1, receipts
        (run_id,) = ids
        assert sum(1 for r in receipts if r.created) == 1
        assert sum(1 for r in receipts if r.attached) == 19
        assert list(await runs_of(broker, names, "gate")) == [run_id]
        # Start returns the live run's id too.
        assert await client.start("gate", "late", singleton_key="tenant-7") == run_id
        # Once it ended, the key starts a new run.
        await client.signal(run_id, "go")
        await client.result(run_id, timeout=60)
        again = await client.trigger("gate", "next", singleton_key="tenant-7")
        assert again.created and not again.attached and again.run_id != run_id
        assert set(await runs_of(broker, names, "gate")) == {run_id, again.run_id}
        # Another key is another run.
        other = await client.trigger("gate", "x", singleton_key="tenant-8")
        assert other.created and other.run_id not in (run_id, again.run_id)
    finally:
        for w in workers:
            w.stop()


async def test_singleton_sigkill_between_record_and_run_ends_with_one_run(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    doomed = await WorkerProc(
        nats_server.url,
        settings.prefix,
        "tests.apps.keyed",
        SOJOURN_FAULTS="singleton_recorded",
        SOJOURN_FAULT_RATE="1",
    ).ready()
    try:
        first = await client.trigger("gate", "first", singleton_key="k", timeout=3)
        assert first.queued  # the worker wrote the key's record and died
        await asyncio.to_thread(doomed.proc.wait, 60)
        assert await runs_of(broker, names, "gate") == {}
        healthy = await WorkerProc(nats_server.url, settings.prefix, "tests.apps.keyed").ready()
        try:
            # The record names a run not created yet, whose start is still in the inbox:
            # a start meanwhile attaches to it, and the redelivered start creates it.
            second = await client.trigger("gate", "second", singleton_key="k", timeout=30)
            assert second.attached and second.run_id == first.run_id

            async def created() -> bool:
                return bool(await runs_of(broker, names, "gate"))

            await wait_for(created, timeout=60, what="the redelivered start to create the run")
            runs = await runs_of(broker, names, "gate")
            assert list(runs) == [first.run_id]
            assert bytes(runs[first.run_id].input) == b'"first"'
        finally:
            healthy.stop()
    finally:
        doomed.kill()


async def test_a_singleton_follows_its_chain_and_counts_a_suspended_run_live(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    async with Worker([chat, gate], nats=nats_server.url, settings=settings):
        first = await client.trigger("chat", {"until": 2}, singleton_key="conv")
        assert first.created
        await client.signal(first.run_id, "say", "hi")

        async def continued() -> bool:
            r = await client.trigger("chat", {"until": 2}, singleton_key="conv")
            return r.attached and r.run_id == f"{first.run_id}-g2"

        await wait_for(continued, timeout=60, what="a start to attach to the chain's next run")
        await client.signal(first.run_id, "say", "bye")
        assert await client.result(f"{first.run_id}-g2", timeout=60) == ["hi", "bye"]
        after = await client.trigger("chat", {"until": 1}, singleton_key="conv")
        assert after.created and after.run_id not in (first.run_id, f"{first.run_id}-g2")

        # A suspended run is live: a start attaches to it until it ends.
        held = await client.trigger("gate", "held", singleton_key="s")
        await client.pause(held.run_id, "for the test")
        await client.signal(held.run_id, "go")  # it suspends before its step

        async def suspended() -> bool:
            return await client.status(held.run_id) == "suspended"

        await wait_for(suspended, timeout=60, what="the run to be suspended")
        again = await client.trigger("gate", "again", singleton_key="s")
        assert again.attached and again.run_id == held.run_id
        await client.cancel(held.run_id)
        await client.trigger("gate", "x", singleton_key="other")  # the worker goes on

        async def cancelled() -> bool:
            return await client.status(held.run_id) == "cancelled"

        await wait_for(cancelled, timeout=60, what="the run to be cancelled")
        fresh = await client.trigger("gate", "fresh", singleton_key="s")
        assert fresh.created and fresh.run_id != held.run_id


async def test_a_record_naming_a_run_that_never_came_is_replaced(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = FlowStore(broker, names)
    dead = SingletonRecord(agent="gate", key="k", run_id="never", inbox_seq=999_999, at=0.0)
    async with Worker([gate], nats=nats_server.url, settings=settings):
        await store.put_singleton(key_token("k"), dead, 0)
        r = await client.trigger("gate", "fresh", singleton_key="k")
        assert r.created and not r.attached and r.run_id != "never"
        assert list(await runs_of(broker, names, "gate")) == [r.run_id]
        # A garbage record (anyone may publish on a deployment without authentication) is
        # written over too.
        subject = FlowStore.subject(names, "single", "gate", key_token("other"))
        await broker.publish(subject, b'{"not": "a record"')
        r2 = await client.trigger("gate", "fresh", singleton_key="other")
        assert r2.created
        # A record naming a wildcard, not a run, is written over too.
        forged = SingletonRecord(agent="gate", key="w", run_id="*", inbox_seq=1, at=0.0)
        await broker.publish(
            FlowStore.subject(names, "single", "gate", key_token("w")), encode(forged)
        )
        assert (await client.trigger("gate", "w", singleton_key="w")).created


async def test_a_forged_burst_record_does_not_stall_the_key(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    forged = {
        "agent": "latest",
        "key": "k",
        "burst": 5,
        "inputs": "last",
        "seconds": 1.0,
        "deadline": 1e300,  # no message schedule can be armed then
        "entries": [],
        "count": 1,
    }
    async with Worker([latest], nats=nats_server.url, settings=settings):
        subject = FlowStore.subject(names, "burst", "latest", key_token("k"))
        await broker.publish(subject, json.dumps(forged).encode())
        r = await client.trigger("latest", 9, debounce=0.3, debounce_key="k")
        assert r.debounced and not r.queued
        assert await client.result(r.run_id, timeout=60) == 9


# --- hostile bodies --------------------------------------------------------------------------

HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"input": "x", "singleton_key": ""}, "invalid_key"),
    ({"input": "x", "singleton_key": "k" * 257}, "invalid_key"),
    ({"input": "x", "singleton_key": "a\nb"}, "invalid_key"),
    ({"input": "x", "singleton_key": "\ud800"}, "invalid_encoding"),  # refused sooner
    ({"input": "x", "singleton_key": 5}, "invalid_trigger"),
    ({"input": 1, "debounce": {"seconds": -1, "key": "k"}}, "invalid_debounce"),
    ({"input": 1, "debounce": {"seconds": 0, "key": "k"}}, "invalid_debounce"),
    ({"input": 1, "debounce": {"seconds": 1e300, "key": "k"}}, "invalid_debounce"),
    ({"input": 1, "debounce": {"seconds": 1, "key": ""}}, "invalid_key"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "é" * 200}}, "invalid_key"),
    ({"input": 1, "debounce": {"seconds": "30s", "key": "k"}}, "invalid_trigger"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "k", "inputs": "some"}}, "invalid_trigger"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "k", "extra": 1}}, "invalid_trigger"),
    ({"input": 1, "debounce": 30}, "invalid_trigger"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "k"}, "run_id": "mine"}, "invalid_trigger"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "k"}, "singleton_key": "k"}, "invalid_trigger"),
    ({"input": "not an int", "debounce": {"seconds": 1, "key": "k"}}, "invalid_input"),
    ({"input": 1, "debounce": {"seconds": 1, "key": "k", "inputs": "all"}}, "invalid_input"),
]


async def test_hostile_keyed_starts_are_refused_and_create_nothing(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with Worker([gate, latest], nats=nats_server.url, settings=settings):
        for body, code in HOSTILE:
            agent = "gate" if "singleton_key" in body and "debounce" not in body else "latest"
            data = json.dumps(body).encode()
            answer: Any = await send_raw(broker, names.start(agent), data)
            assert answer.get("error", {}).get("code") == code, (body, answer)
        # Bytes that are not UTF-8 inside a key never get to be a key.
        answer = await send_raw(
            broker, names.start("gate"), b'{"input": "x", "singleton_key": "\xff\xfe"}'
        )
        assert answer["error"]["code"] == "invalid_encoding"
        letter = await broker.direct_get_last(names.dlq_stream, names.dlq("start"))
        assert letter is not None and decode_dead_letter(letter.data).code == "invalid_encoding"
        flows = await broker.direct_get_range(
            names.schedules_stream, f"{names.prefix}.schedule.flow.>"
        )
        assert flows == []
        assert await runs_of(broker, names, "gate") == {}
        assert await runs_of(broker, names, "latest") == {}
        # The client refuses the same before publishing.
        with pytest.raises(ValueError):
            await client.trigger("latest", 1, debounce=-1, debounce_key="k")
        with pytest.raises(ValueError):
            await client.trigger("latest", 1, debounce=1)
        with pytest.raises(ValueError):
            await client.trigger("latest", 1, debounce=1, debounce_key="k", run_id="r")
        with pytest.raises(Exception, match="singleton_key"):
            await client.trigger("gate", "x", singleton_key="")
        # And the worker still serves.
        r = await client.trigger("gate", "ok", singleton_key="fine")
        assert r.created


async def test_forged_debounce_fires_are_dead_lettered_and_start_nothing(
    nats_server: EmbeddedServer, client: Client, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with Worker([latest], nats=nats_server.url, settings=settings):
        fire = FlowStore.subject(names, "fire", "latest", key_token("k"))
        # Only the broker stores a Nats-Scheduler header: a forged fire has none.
        forged = {"Sojourn-Debounce-Burst": "1", "Sojourn-Debounce-At": "1"}
        with pytest.raises(JetStreamError):
            await broker.publish(fire, b"", {**forged, h.SCHEDULER: "x"})
        await broker.publish(fire, b"", forged)
        await broker.publish(f"{names.prefix}.schedule.flow.fire.latest.not-a-token", b"", forged)

        async def refused() -> bool:
            msgs = await broker.direct_get_range(names.dlq_stream, names.dlq("other"))
            return len(msgs) >= 2

        await wait_for(refused, timeout=30, what="two dead letters")
        assert await runs_of(broker, names, "latest") == {}
        r = await client.trigger("latest", 3, debounce=0.3, debounce_key="k")
        assert await client.result(r.run_id, timeout=60) == 3
        # Its id is reserved: the client refuses it, and so does the intake.
        with pytest.raises(InvalidName, match="debounced burst"):
            await client.trigger("latest", 3, run_id=r.run_id)
        body = json.dumps({"input": 3, "run_id": r.run_id}).encode()
        answer: Any = await send_raw(broker, names.start("latest"), body)
        assert answer["error"]["code"] == "invalid_run_id"


def test_encoded_record_round_trips() -> None:
    rec = SingletonRecord(agent="a", key="k", run_id="r", inbox_seq=1, at=2.0)
    assert encode(rec).startswith(b"{")
