"""Retention of keyed starts' records (decision 0053, ``actors/ops/keyed.py``): a retention
pass removes the singleton, burst, fire and slots records nothing needs any more, keeps the
live ones, never removes a record written after it judged the one before, and the keys work
as before afterwards."""

from __future__ import annotations

import time
from typing import Any

from sojourn.actors import Client, Worker
from sojourn.actors.cli._archive import report_lines
from sojourn.actors.ops import keyed as keyed_mod
from sojourn.actors.ops.archive import Archiver
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.concurrency import ConcurrencyStore
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.flow import FlowStore
from sojourn.schemas.codec import to_raw
from sojourn.schemas.concurrency import SlotHolder, SlotsRecord
from sojourn.schemas.config import Settings
from sojourn.schemas.flow import DebounceEntry, DebounceRecord, SingletonRecord, key_token
from tests.actors.ops import test_retention
from tests.actors.ops.test_retention import MONTH, later
from tests.apps.concurrency import keyed_fast
from tests.apps.keyed import gate, latest
from tests.conftest import wait_for

NOWHERE = 10**12
"""An inbox sequence no start has: a record naming it has no start left in the inbox."""

broker = test_retention.broker  # a connection with the deployment's topology


async def record(broker: Broker, names: Names, kind: str, agent: str, key: str) -> Any:
    """The last message on a key's ``kind`` subject, or ``None``."""
    subject = f"{names.prefix}.schedule.flow.{kind}.{agent}.{key_token(key)}"
    return await broker.direct_get_last(names.schedules_stream, subject)


async def test_dead_keyed_records_leave_in_a_pass_and_the_keys_work_after(
    nats_server: EmbeddedServer, broker: Broker, client: Client, settings: Settings
) -> None:
    names = Names(settings.prefix)
    async with Worker([gate, latest, keyed_fast], nats=nats_server.url, settings=settings):
        done = await client.start("gate", "a", singleton_key="s-done")
        live = await client.start("gate", "b", singleton_key="s-live")
        await client.signal(done, "go")
        assert await client.result(done, timeout=30) == "a"
        burst = await client.trigger("latest", 7, debounce=0.2, debounce_key="d-done")
        assert await client.result(burst.run_id, timeout=30) == 7
        fast = await client.start("keyed_fast", 3, concurrency={"key": "c-done", "limit": 1})
        assert await client.result(fast, timeout=30) == 3

        async def slot_given_back() -> bool:
            m = await record(broker, names, "slots", "keyed_fast", "c-done")
            return m is not None and b'"holders":[]' in m.data

        await wait_for(slot_given_back, what="the slot given back")
        archiver = Archiver(broker, settings, retain_ended=MONTH)
        young = await archiver.run_pass(now=time.time())
        assert sum(young.keyed.values()) == 0  # everything ended just now
        dry = await archiver.run_pass(now=later(), dry_run=True)
        expected = {"singleton": 1, "burst": 1, "fire": 1, "slots": 1}
        assert dry.keyed == expected and dry.keyed_errors == {}
        assert await record(broker, names, "single", "gate", "s-done") is not None

        report = await archiver.run_pass(now=later())
        assert report.keyed == expected and report.keyed_errors == {}
        assert "removed 4 keyed start record(s)" in "\n".join(report_lines(report))
        for kind, agent, key in [
            ("single", "gate", "s-done"),
            ("burst", "latest", "d-done"),
            ("fire", "latest", "d-done"),
            ("slots", "keyed_fast", "c-done"),
        ]:
            assert await record(broker, names, kind, agent, key) is None, kind
        kept = await record(broker, names, "single", "gate", "s-live")
        assert kept is not None and live.encode() in kept.data  # its run is live: kept

        # The keys work as they did: a new run per key, a new burst, a slot again.
        again = await client.trigger("gate", "c", singleton_key="s-done")
        assert again.created and not again.attached and again.run_id != done
        attached = await client.trigger("gate", "d", singleton_key="s-live")
        assert attached.attached and attached.run_id == live
        burst2 = await client.trigger("latest", 8, debounce=0.2, debounce_key="d-done")
        assert burst2.run_id != burst.run_id
        assert await client.result(burst2.run_id, timeout=30) == 8
        fast2 = await client.start("keyed_fast", 4, concurrency={"key": "c-done", "limit": 1})
        assert await client.result(fast2, timeout=30) == 4
        for run_id in (again.run_id, live):
            await client.signal(run_id, "go")
        assert await client.result(again.run_id, timeout=30) == "c"


async def test_live_records_stay_and_a_record_written_after_the_judgement_is_kept(
    broker: Broker, client: Client, settings: Settings, monkeypatch: Any
) -> None:
    """Written directly, all older than the cutoff: an open burst, a closed burst whose run
    was never created (its fire's redelivery or the next trigger creates it), a slots record
    with a holder and a singleton record whose start is still in the inbox stay; a dead
    singleton record rewritten by a start between the pass's judgement and its purge keeps
    the new record."""
    names = Names(settings.prefix)
    flow, slots = FlowStore(broker, names), ConcurrencyStore(broker, names)
    now = time.time()
    entry = DebounceEntry(NOWHERE, to_raw(1))

    def burst(key: str, closed: bool) -> DebounceRecord:
        return DebounceRecord(
            agent="latest", key=key, burst=NOWHERE, inputs="last", seconds=1.0, deadline=now,
            entries=(entry,), count=1, recorded=(NOWHERE,), closed=closed, updated_at=now,
        )  # fmt: skip

    await flow.put_burst(key_token("open"), burst("open", False), 0)
    await flow.put_burst(key_token("no-run"), burst("no-run", True), 0)
    held = SlotsRecord(
        agent="keyed_fast", key="held", limit=1, holders=(SlotHolder("r1", 0, now),), updated_at=now
    )
    await slots.put_slots(key_token("held"), held, 0)
    inbox = await client.broker.publish(names.start("gate", None, "waiting-start"), b"{}")
    pending = SingletonRecord(
        agent="gate", key="pending", run_id="waiting-start", inbox_seq=inbox.seq, at=now
    )
    await flow.put_singleton(key_token("pending"), pending, 0)
    dead = SingletonRecord(agent="gate", key="race", run_id="never", inbox_seq=NOWHERE, at=now)
    await flow.put_singleton(key_token("race"), dead, 0)
    newer = SingletonRecord(agent="gate", key="race", run_id="newer", inbox_seq=NOWHERE, at=now)
    judge = keyed_mod.KeyedRecords._singleton_dead

    async def judged_then_rewritten(self: Any, m: StoredMessage, cutoff: float) -> bool:
        verdict = await judge(self, m, cutoff)
        if verdict and b"race" in m.data:  # a start with the key writes over it meanwhile
            await flow.put_singleton(key_token("race"), newer, m.seq)
        return verdict

    monkeypatch.setattr(keyed_mod.KeyedRecords, "_singleton_dead", judged_then_rewritten)
    report = await Archiver(broker, settings, retain_ended=MONTH).run_pass(now=later())
    assert report.keyed_errors == {}
    assert report.keyed["burst"] == 0 and report.keyed["slots"] == 0
    for kind, agent, key in [
        ("burst", "latest", "open"),
        ("burst", "latest", "no-run"),
        ("slots", "keyed_fast", "held"),
        ("single", "gate", "pending"),
    ]:
        assert await record(broker, names, kind, agent, key) is not None, key
    left = await record(broker, names, "single", "gate", "race")
    assert left is not None and b"newer" in left.data
