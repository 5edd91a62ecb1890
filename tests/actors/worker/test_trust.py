"""Hostile input never touches a history: each attack an outsider can make with a plain NATS
connection (no credentials involved) is answered, dead-lettered, and changes no run.

Every case publishes raw bytes on raw subjects the way an attacker would, then checks: an
error answer within 5 s (when there is anywhere safe to answer), a dead-letter record, the
victim's history unchanged, and no repeated traceback in the worker's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import Broker, Delivery, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.schemas import decode_dead_letter
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunResumed, SignalReceived
from sojourn.schemas.wire import DeadLetter
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.procs import WorkerProc


class Poisoned(msgspec.Struct, frozen=True):
    """An input type whose validation crashes (not a ValidationError): a worker bug."""

    n: int

    def __post_init__(self) -> None:
        raise RuntimeError("this input type is broken on purpose")


@agent("victim")
async def victim(ctx: Context) -> str:
    got = await ctx.wait_for("go")
    return f"went {got}"


@agent("broken")
async def broken(ctx: Context, req: Poisoned) -> int:
    return req.n


@pytest.fixture
def settings() -> Settings:
    import uuid

    return Settings(
        prefix=f"t{uuid.uuid4().hex[:10]}",
        lease_ttl=2.0,
        max_deliveries=10,
        max_buffered_signals=3,
    )


class Deployment:
    def __init__(self, broker: Broker, names: Names, client: Client, url: str) -> None:
        self.broker = broker
        self.names = names
        self.client = client
        self.url = url

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        await self.broker.publish(subject, data, headers)

    async def ask(self, subject: str, data: bytes, **headers: str) -> dict[str, Any]:
        """Publish with a proper reply inbox and return the intake's answer (within 5 s)."""
        inbox = self.broker.new_inbox()
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            await self.broker.publish(subject, data, {h.REPLY_TO: inbox, **headers})
            msg = await sub.next_msg(timeout=5)
        finally:
            await sub.unsubscribe()
        answer: dict[str, Any] = json.loads(msg.data)
        return answer

    async def dead_letters(self, kind: str) -> list[DeadLetter]:
        msgs = await self.broker.direct_get_range(self.names.dlq_stream, self.names.dlq(kind))
        return [decode_dead_letter(m.data) for m in msgs]

    async def parked_victim(self, run_id: str) -> int:
        await self.client.start("victim", None, run_id=run_id, wait=True)

        async def parked() -> bool:
            return (await self.client.status(run_id)) == "waiting"

        await wait_for(parked, what=f"{run_id} parked")
        return await self.client.store.last_seq(run_id)


@pytest_asyncio.fixture
async def dep(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Deployment]:
    worker = Worker([victim, broken], nats=nats_server.url, settings=settings)
    await worker.start()
    broker = await Broker.connect(nats_server.url)
    client = await Client.connect(nats_server.url, settings=settings)
    try:
        yield Deployment(broker, Names(settings.prefix), client, nats_server.url)
    finally:
        await client.close()
        await broker.close()
        await worker.stop()


async def test_a_reply_subject_naming_a_sojourn_or_api_subject_is_never_answered(
    dep: Deployment,
) -> None:
    n = dep.names
    before = await dep.parked_victim("v1")
    targets = [
        n.events("v1"),
        n.lease("v1"),
        n.wake("v1"),
        n.worker("w1"),
        n.wedge("v1"),
        f"$JS.API.STREAM.DELETE.{n.events_stream}",
        "_INBOX",  # no token after the prefix
        "_INBOX.a b",  # a space: two tokens on the wire
        "_INBOX.>",  # a wildcard
        "_INBOX." + "x" * 300,  # too long
    ]
    seen: list[tuple[str, bytes]] = []

    async def note(m: Delivery) -> None:
        seen.append((m.subject, m.data))

    sniff = await dep.broker.subscribe(">", cb=note)  # everything, $JS.API and _INBOX too
    try:
        for i, target in enumerate(targets):
            body = json.dumps({"input": None, "run_id": f"inj-{i}"}).encode()
            await dep.publish(n.start("victim"), body, {h.REPLY_TO: target})

        async def all_rejected() -> bool:
            return len(await dep.dead_letters("start")) >= len(targets)

        await wait_for(all_rejected, what="every injection dead-lettered")
    finally:
        await sniff.unsubscribe()
    records = await dep.dead_letters("start")
    assert {r.code for r in records} == {"invalid_reply_to"}
    assert sorted(r.headers[h.REPLY_TO] for r in records) == sorted(targets)
    assert await dep.client.store.last_seq("v1") == before  # the victim is untouched
    for i in range(len(targets)):
        assert await dep.client.store.last_seq(f"inj-{i}") == 0  # nothing was created
    # Nothing the intake says went where the attacker pointed (the victim's own lease release
    # may land on its lease subject meanwhile: it is no answer).
    answers = [(s, d) for s, d in seen if s in targets and (b"inj-" in d or b'"error"' in d)]
    assert answers == []
    info = await dep.broker.api(f"$JS.API.STREAM.INFO.{n.events_stream}")
    assert info["config"]["name"] == n.events_stream  # still there
    # A proper inbox is answered as always.
    ok = await dep.ask(n.start("victim"), b'{"input": null, "run_id": "fine"}')
    assert ok == {"run_id": "fine", "created": True}


@pytest.mark.parametrize(
    "name",
    ["sojourn-resume", "sojourn-decide.1.1", "sojourn-child.v2-c0", "sojourn-anything"],
)
async def test_reserved_signal_names_are_refused_on_the_signal_subject(
    dep: Deployment, name: str
) -> None:
    before = await dep.parked_victim("v2")
    answer = await dep.ask(dep.names.signal("v2", name), b'{"action": "skip"}')
    assert answer["error"]["code"] == "forbidden", answer
    records = await dep.dead_letters("signal")
    assert records[-1].code == "forbidden" and records[-1].subject.endswith(name)
    assert await dep.client.store.last_seq("v2") == before


async def test_control_messages_record_the_subjects_sender_not_a_claim(dep: Deployment) -> None:
    await dep.parked_victim("v3")
    await dep.ask(
        dep.names.signal("v3", "go", sender="alice"),
        b'{"by": "mallory"}',
        **{"Sojourn-Sender": "mallory"},
    )
    assert await dep.client.result("v3", timeout=30) == "went {'by': 'mallory'}"
    received = [
        e for d in await dep.client.history("v3") for e in d.events if isinstance(e, SignalReceived)
    ]
    assert [e.sent_by for e in received] == ["alice"]  # the header is not an identity
    # Anonymous: nobody is recorded, whatever the header says.
    await dep.parked_victim("v4")
    await dep.ask(dep.names.signal("v4", "go"), b"1", **{"Sojourn-Sender": "mallory"})
    received = [
        e for d in await dep.client.history("v4") for e in d.events if isinstance(e, SignalReceived)
    ]
    assert [e.sent_by for e in received] == [None]


async def test_a_resume_of_a_run_that_is_not_suspended_changes_nothing(dep: Deployment) -> None:
    before = await dep.parked_victim("v5")
    answer = await dep.ask(dep.names.resume("v5", "ops"), b'{"note": "hi"}')
    assert answer == {"run_id": "v5", "created": False}
    assert await dep.client.store.last_seq("v5") == before
    events = [e for d in await dep.client.history("v5") for e in d.events]
    assert not any(isinstance(e, RunResumed) for e in events)


@pytest.mark.parametrize(
    ("what", "body", "code"),
    [
        ("trailing newline", b'{"input": null, "run_id": "abc\\n"}', "invalid_run_id"),
        ("child id form", b'{"input": null, "run_id": "someone-c0"}', "invalid_run_id"),
        ("wildcard parent", b'{"input": null, "run_id": "x1", "parent_run_id": "*"}', "forbidden"),
        ("any parent", b'{"input": null, "run_id": "x2", "parent_run_id": "v6"}', "forbidden"),
    ],
)
async def test_ids_in_a_trigger_are_validated_before_use(
    dep: Deployment, what: str, body: bytes, code: str
) -> None:
    before = await dep.parked_victim("v6")
    answer = await dep.ask(dep.names.start("victim"), body)
    assert answer["error"]["code"] == code, (what, answer)
    assert (await dep.dead_letters("start"))[-1].code == code
    assert await dep.client.store.last_seq("v6") == before


async def test_a_spawn_with_a_wildcard_parent_is_refused(dep: Deployment) -> None:
    body = b'{"input": null, "run_id": "kid-c0", "parent_run_id": "*"}'
    answer = await dep.ask(dep.names.spawn("victim", "worker"), body)
    assert answer["error"]["code"] == "invalid_run_id"
    assert await dep.client.store.last_seq("kid-c0") == 0


async def test_an_oversized_trigger_is_answered_and_kept_truncated_with_its_digest(
    dep: Deployment,
) -> None:
    import hashlib

    body = b'{"input": "' + b"x" * (7 * 1024 * 1024) + b'", "run_id": "huge"}'
    answer = await dep.ask(dep.names.start("victim"), body)
    assert answer["error"]["code"] == "payload_too_large"
    record = (await dep.dead_letters("start"))[-1]
    assert record.code == "payload_too_large" and record.truncated
    assert record.size == len(body) and record.sha256 == hashlib.sha256(body).hexdigest()
    assert body.startswith(record.data) and 0 < len(record.data) < len(body)
    # A body that fits is kept whole.
    small = b'{"input": "' + b"y" * (2 * 1024 * 1024) + b'", "run_id": "big"}'
    answer = await dep.ask(dep.names.start("victim"), small)
    record = (await dep.dead_letters("start"))[-1]
    assert record.data == small and not record.truncated


async def test_signals_beyond_the_per_run_limit_are_refused(dep: Deployment) -> None:
    before = await dep.parked_victim("v7")
    for i in range(3):
        ok = await dep.ask(dep.names.signal("v7", "noise"), str(i).encode())
        assert ok == {"run_id": "v7", "created": False}
    answer = await dep.ask(dep.names.signal("v7", "noise"), b"3")
    assert answer["error"]["code"] == "too_many_signals", answer
    assert await dep.client.store.last_seq("v7") == before + 3


async def test_a_message_that_keeps_failing_is_dead_lettered_at_max_deliveries(
    dep: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sojourn")
    inbox = dep.broker.new_inbox()
    sub = await dep.broker.subscribe(inbox, max_msgs=1)
    await dep.publish(
        dep.names.start("broken"),
        b'{"input": {"n": 1}, "run_id": "b1"}',
        {h.REPLY_TO: inbox},
    )
    msg = await sub.next_msg(timeout=60)  # about 10 deliveries a second apart
    answer = json.loads(msg.data)
    assert answer["error"]["code"] == "max_deliveries", answer
    record = (await dep.dead_letters("start"))[-1]
    assert record.code == "max_deliveries" and record.data.startswith(b'{"input"')
    assert await dep.client.store.last_seq("b1") == 0
    tracebacks = [r for r in caplog.records if r.exc_info and "b1" not in r.getMessage()]
    assert len([r for r in caplog.records if r.exc_info]) <= 1, tracebacks  # logged once
    # The worker still serves everything else.
    await dep.parked_victim("v8")


async def test_a_crash_between_recording_a_signal_and_its_wake_still_wakes_the_run(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    """The intake's worker dies right after appending the signal (seam ``intake_recorded``);
    the inbox message comes back after one lease and the next worker wakes the run."""
    prefix = settings.prefix
    first = await WorkerProc(
        nats_server.url,
        prefix,
        "tests.apps.waits",
        lease_ttl=settings.lease_ttl,
        SOJOURN_FAULTS="intake_recorded",
        SOJOURN_FAULT_RATE="1",
    ).ready()
    client = await Client.connect(nats_server.url, settings=settings)
    try:
        run_id = await client.start("gated_kid", 3, run_id="crashy-wake", wait=True)

        async def parked() -> bool:
            return (await client.status(run_id)) == "waiting"

        await wait_for(parked, what="parked")
        await client.signal(run_id, "go", 2)
        await asyncio.to_thread(first.proc.wait, 30)  # it killed itself at the seam
        assert first.proc.returncode == -9
        first.kill()
        events = [e for d in await client.history(run_id) for e in d.events]
        assert any(isinstance(e, SignalReceived) for e in events)  # recorded, not woken
        second = await WorkerProc(
            nats_server.url, prefix, "tests.apps.waits", lease_ttl=settings.lease_ttl
        ).ready()
        try:
            assert await client.result(run_id, timeout=30) == 6
        finally:
            second.stop()
    finally:
        await client.close()
        first.kill()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "sojourn.actors.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(**(env or {})),
    )


async def test_cli_errors_are_one_line(dep: Deployment, tmp_path: Path) -> None:
    blob = tmp_path / "input.json"
    blob.write_bytes(b'{"name": "\xff\xfe"}')
    p = await asyncio.to_thread(_cli, "start", "victim", "--input", f"@{blob}", "--nats", dep.url)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "not UTF-8" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    await dep.parked_victim("v9")
    prefix = dep.names.prefix
    p = await asyncio.to_thread(
        _cli, "decide", "v9", "7", "skip", "--nats", dep.url, "--prefix", prefix
    )
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert os.environ.get("SOJOURN_FAULTS") is None


def test_a_workers_failure_counts_are_bounded() -> None:
    from sojourn.actors.worker.dead_letters import FailureCounts

    counts = FailureCounts(3)
    assert [counts.add("a"), counts.add("a"), counts.add("b")] == [1, 2, 1]
    for r in ("c", "d", "e"):
        counts.add(r)
    assert len(counts) == 3  # a and b, failed longest ago, are forgotten
    assert counts.add("a") == 1
    counts.add("e")
    counts.clear("e")
    assert counts.add("e") == 1
