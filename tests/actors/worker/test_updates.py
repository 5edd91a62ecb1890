"""Updates (``client.update``, ``ctx.on_update``; decision 0042) against a real nats-server and
worker processes: applied once per update id across a SIGKILL between the apply and the answer,
answered the same on every retry; a rejection changes nothing; a malformed body is refused on
its first delivery without stalling the run's other messages; unknown and ended runs answer
clearly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.schemas.codec import decode_dead_letter
from sojourn.schemas.config import Settings
from sojourn.schemas.events import UpdateCompleted, UpdateRejected, UpdateRequested
from sojourn.schemas.updates import UpdateRejectedError
from sojourn.schemas.wire import IntakeError
from tests import procs
from tests.conftest import wait_for

APP = "tests.apps.updates"


def applied(db: Path) -> list[str]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT item FROM applied ORDER BY rowid")]


async def waiting(client: Client, run_id: str) -> None:
    async def parked() -> bool:
        return (await client.state(run_id)).status == "waiting"

    await wait_for(parked, timeout=60, what=f"{run_id} to wait")


async def events_of(client: Client, run_id: str, kind: type) -> list[object]:
    return [e for d in await client.history(run_id) for e in d.events if isinstance(e, kind)]


async def test_an_update_sent_five_times_is_applied_once_across_a_sigkill(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "applied.sqlite"
    # The first worker kills itself right after the update's UpdateCompleted is stored.
    first = procs.WorkerProc(
        nats_server.url,
        settings.prefix,
        APP,
        SOJOURN_TEST_DB=str(db),
        SOJOURN_FAULTS="update_applied",
        SOJOURN_FAULT_RATE="1",
    )
    second: procs.WorkerProc | None = None
    try:
        await first.ready()
        run_id = await client.start("cart", "ada", run_id="cart-kill", wait=True)
        await waiting(client, run_id)

        answer = await client.update(run_id, "add", "milk", update_id="u-milk", timeout=60)
        assert answer == {"count": 1, "items": ["milk"]}
        first.proc.wait(30)  # it died at the seam, between the apply and anything else
        assert first.proc.returncode is not None and first.proc.returncode < 0

        second = procs.WorkerProc(nats_server.url, settings.prefix, APP, SOJOURN_TEST_DB=str(db))
        await second.ready()
        for _ in range(4):  # the caller's retries: the same answer, read back from history
            again = await client.update(run_id, "add", "milk", update_id="u-milk", timeout=60)
            assert again == answer
        # The run's state holds milk once: the replay applied it again, not a second time.
        assert await client.update(run_id, "add", "eggs", update_id="u-eggs", timeout=60) == {
            "count": 2,
            "items": ["milk", "eggs"],
        }
        await client.signal(run_id, "checkout")
        assert await client.result(run_id, timeout=60) == ["milk", "eggs"]
    finally:
        first.stop()
        if second is not None:
            second.stop()

    assert applied(db) == ["milk", "eggs"]  # each applied live once, kill or not
    requested = await events_of(client, run_id, UpdateRequested)
    completed = await events_of(client, run_id, UpdateCompleted)
    assert [e.update_id for e in requested] == ["u-milk", "u-eggs"]  # type: ignore[attr-defined]
    assert [e.update_id for e in completed] == ["u-milk", "u-eggs"]  # type: ignore[attr-defined]


async def test_rejections_change_nothing_and_failures_answer(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "applied.sqlite"
    worker = procs.WorkerProc(nats_server.url, settings.prefix, APP, SOJOURN_TEST_DB=str(db))
    try:
        await worker.ready()
        run_id = await client.start("cart", "bob", run_id="cart-reject", wait=True)
        await waiting(client, run_id)
        assert await client.update(run_id, "add", "tea", update_id="u1") == {
            "count": 1,
            "items": ["tea"],
        }
        before = await client.state(run_id)

        with pytest.raises(UpdateRejectedError) as refused:
            await client.update(run_id, "add", "", update_id="u-empty")
        assert refused.value.code == "rejected"
        assert "an empty item" in refused.value.reason
        with pytest.raises(UpdateRejectedError) as again:  # the same rejection, again
            await client.update(run_id, "add", "", update_id="u-empty")
        assert again.value.code == "rejected"
        with pytest.raises(UpdateRejectedError) as bad_type:  # not a str: refused too
            await client.update(run_id, "add", {"no": 1}, update_id="u-type")
        assert bad_type.value.code == "rejected"
        with pytest.raises(UpdateRejectedError) as unknown:
            await client.update(run_id, "nosuch", 1, update_id="u-nosuch")
        assert unknown.value.code == "unknown_update"

        after = await client.state(run_id)
        assert after.ops == before.ops and after.status == before.status
        assert applied(db) == ["tea"]  # no handler ran for any of them
        assert await client.update(run_id, "plan", None) == "1 items for bob"

        with pytest.raises(UpdateRejectedError) as broke:  # its change stands
            await client.update(run_id, "explode", None, update_id="u-boom")
        assert broke.value.code == "failed"
        assert "the handler broke" in broke.value.reason
        assert await client.update(run_id, "plan", None) == "2 items for bob"

        rejected = await events_of(client, run_id, UpdateRejected)
        assert sorted(e.code for e in rejected) == [  # type: ignore[attr-defined]
            "rejected",
            "rejected",
            "unknown_update",
        ]
        await client.signal(run_id, "checkout")
        assert await client.result(run_id, timeout=60) == ["tea", "boom"]

        with pytest.raises(UpdateRejectedError) as ended:  # the run has ended
            await client.update(run_id, "add", "late", update_id="u-late")
        assert ended.value.code == "run_ended"
        # An update decided before the end still answers the same.
        assert await client.update(run_id, "add", "tea", update_id="u1") == {
            "count": 1,
            "items": ["tea"],
        }
    finally:
        worker.stop()


async def test_an_update_during_a_step_is_decided_at_the_next_wait(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    worker = procs.WorkerProc(nats_server.url, settings.prefix, APP)
    try:
        await worker.ready()
        run_id = await client.start("cart", "busy", run_id="cart-busy", wait=True)

        async def in_step() -> bool:
            return (await client.state(run_id)).status == "running"

        await wait_for(in_step, timeout=30, what="the step to run")
        assert await client.update(run_id, "add", "x", timeout=60) == {
            "count": 1,
            "items": ["x"],
        }
        completed = await events_of(client, run_id, UpdateCompleted)
        state = await client.state(run_id)
        assert [e.position for e in completed] == [1]  # type: ignore[attr-defined]
        assert state.ops[0].status == "completed"  # the step ended before it was applied
    finally:
        worker.stop()


async def test_malformed_unknown_and_ended(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    worker = procs.WorkerProc(nats_server.url, settings.prefix, APP)
    try:
        await worker.ready()
        run_id = await client.start("cart", "cy", run_id="cart-bad", wait=True)
        await waiting(client, run_id)
        subject = client.names.update(run_id, "add")
        for body, code in [
            (b'{"update_id": "u-x", "payload": ', "invalid_json"),
            (b'{"payload": "milk"}', "invalid_trigger"),
            (b'{"update_id": "has space", "payload": 1}', "invalid_trigger"),
            (b"", "invalid_trigger"),
        ]:
            reply = await client._publish_answered(subject, body, {}, 30)
            assert isinstance(reply, IntakeError), body
            assert reply.error.code == code, (body, reply.error)
        last = await client.broker.direct_get_last(
            client.names.dlq_stream, client.names.dlq("signal")
        )
        assert last is not None
        record = decode_dead_letter(last.data)
        assert record.code == "invalid_trigger" and record.subject == subject
        assert h.MSG_ID  # the headers module is what the intake reads ids from

        # Nothing stalled: the run's next update and signal go through.
        assert await client.update(run_id, "add", "ok", timeout=60) == {
            "count": 1,
            "items": ["ok"],
        }
        assert (await client.state(run_id)).updates[-1].update_id != "u-x"

        with pytest.raises(UpdateRejectedError) as unknown:
            await client.update("no-such-run", "add", "x", timeout=60)
        assert unknown.value.code == "unknown_run"

        await client.signal(run_id, "checkout")
        assert await client.result(run_id, timeout=60) == ["ok"]
        with pytest.raises(UpdateRejectedError) as ended:
            await client.update(run_id, "add", "late", timeout=30)
        assert ended.value.code == "run_ended"
    finally:
        worker.stop()
