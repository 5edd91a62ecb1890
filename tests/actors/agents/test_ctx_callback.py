"""``ctx.callback`` on a real nats-server: a run hands out a token, parks for days, and the
signal the token implies wakes it once.

What the HTTP gateway will do with a token is played here by the test itself: verify it, then
``Client.signal(claims.run_id, claims.signal, body, signal_id=claims.signal_id)``. The run's
side is real: the token is journaled (a replay on another worker, with other keys or none,
returns the same one), and the signal id makes a repeated callback one signal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sojourn.actors import (
    Agent,
    CallbackKeys,
    CallbackKeysMissing,
    Client,
    Context,
    InvalidName,
    RunFailedError,
    Worker,
    agent,
)
from sojourn.actors.agents.callbacks import CALLBACK_KEYS_ENV
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.schemas import RunEvent, SignalReceived, ValueRecorded
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

OLD_SECRET = "old-" * 10
NEW_SECRET = "new-" * 10


def esign_agent(seen: list[str]) -> Agent[str, dict[str, Any]]:
    """Sends a document for signature and waits for the signing service's callback; then
    waits for whichever comes first of a second such callback (there must be none) and
    ``finish``. Every token its code gets, live or replayed, goes to ``seen``."""

    @agent("esign")
    async def esign(ctx: Context, document: str) -> dict[str, Any]:
        token = ctx.callback("docs.signed", ttl=timedelta(days=3))
        seen.append(token)
        signed = await ctx.wait_for("docs.signed")
        again = await ctx.select("docs.signed", "finish")
        assert again is not None
        return {"token": token, "signed": signed, "again": again.name, "document": document}

    return esign


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def parked_with_token(client: Client, run_id: str, seen: list[str]) -> None:
    async def parked() -> bool:
        return bool(seen) and await client.status(run_id) == "waiting"

    await wait_for(parked, what="the run to issue its token and park")


async def deliver_raw(client: Client, run_id: str, signal: str, signal_id: str) -> Any:
    """Send the callback's signal again as a foreign client would, under a Msg-Id of its own
    (so the broker's duplicate window does not drop it) but the same signal id, and return the
    intake's answer: it has handled the message by then."""
    inbox = client.broker.new_inbox()
    sub = await client.broker.subscribe(inbox, max_msgs=1)
    try:
        await client.broker.publish(
            client.names.signal(run_id, signal),
            b'{"envelope": "E2"}',
            {h.MSG_ID: f"retry-{signal_id}", h.SIGNAL_ID: signal_id, h.REPLY_TO: inbox},
        )
        msg = await sub.next_msg(timeout=30)
    finally:
        await sub.unsubscribe()
    return json.loads(msg.data)


def key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "callback.keys"
    path.write_text(text)
    return path


async def test_a_callback_token_survives_replay_and_delivers_once(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = key_file(tmp_path, f"k1 {OLD_SECRET}\n")
    first_keys = CallbackKeys.load(path)
    seen: list[str] = []
    esign = esign_agent(seen)
    run_id = "esign-1"
    issued_after = time.time()
    async with Worker([esign], nats=nats_server.url, settings=settings, callback_keys=first_keys):
        await client.start("esign", "contract-1", run_id=run_id, wait=True)
        await parked_with_token(client, run_id, seen)
    (token,) = seen

    # What the gateway will do: the token names this run and signal, for three days.
    claims = first_keys.verify(token, time.time())
    assert (claims.run_id, claims.signal) == (run_id, "docs.signed")
    three_days = timedelta(days=3).total_seconds()
    assert issued_after + three_days <= claims.expires_at <= time.time() + three_days + 1
    values = [e for e in await events_of(client, run_id) if isinstance(e, ValueRecorded)]
    assert [(v.kind, json.loads(bytes(v.value))) for v in values] == [("callback", token)]

    # The external system calls back, and (its retry logic) calls back again: no worker is up.
    sid = await client.signal(run_id, claims.signal, {"envelope": "E1"}, signal_id=claims.signal_id)
    assert sid == claims.signal_id
    await client.signal(run_id, claims.signal, {"envelope": "E1"}, signal_id=claims.signal_id)

    # Keys rotated meanwhile (from the environment this time): the replay must not re-sign.
    path.write_text(f"k2 {NEW_SECRET}\nk1 {OLD_SECRET}\n")
    monkeypatch.setenv(CALLBACK_KEYS_ENV, str(path))
    second = Worker([esign], nats=nats_server.url, settings=settings)
    assert second.callback_keys is not None and second.callback_keys.kids == ("k2", "k1")
    async with second:
        answer = await deliver_raw(client, run_id, claims.signal, claims.signal_id)
        assert answer == {"run_id": run_id, "created": False}
        await client.signal(run_id, "finish")
        out = await client.result(run_id, timeout=60)

    assert out == {
        "token": token,
        "signed": {"envelope": "E1"},
        "again": "finish",  # the repeated callbacks were no second signal
        "document": "contract-1",
    }
    assert len(seen) >= 2, "the second worker did not replay the run"
    assert set(seen) == {token}
    assert token.split(".")[1] == "k1"
    signals = [e for e in await events_of(client, run_id) if isinstance(e, SignalReceived)]
    assert [(s.name, s.signal_id) for s in signals] == [
        ("docs.signed", claims.signal_id),
        ("finish", signals[-1].signal_id),
    ]


async def test_a_worker_without_keys_replays_a_recorded_token(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys sign new tokens only: a run that already holds one goes on anywhere."""
    monkeypatch.delenv(CALLBACK_KEYS_ENV, raising=False)
    keys = CallbackKeys([("k1", OLD_SECRET.encode())])
    seen: list[str] = []
    esign = esign_agent(seen)
    async with Worker([esign], nats=nats_server.url, settings=settings, callback_keys=keys):
        await client.start("esign", "contract-2", run_id="esign-2", wait=True)
        await parked_with_token(client, "esign-2", seen)
    claims = keys.verify(seen[0], time.time())
    keyless = Worker([esign], nats=nats_server.url, settings=settings)
    assert keyless.callback_keys is None
    async with keyless:
        await client.signal("esign-2", claims.signal, "ok", signal_id=claims.signal_id)
        await client.signal("esign-2", "finish")
        out = await client.result("esign-2", timeout=60)
    assert out["token"] == seen[0] and out["signed"] == "ok"
    assert len(seen) >= 2 and set(seen) == {seen[0]}


async def test_without_keys_a_callback_fails_the_run_saying_what_to_set(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CALLBACK_KEYS_ENV, raising=False)
    seen: list[str] = []
    async with Worker([esign_agent(seen)], nats=nats_server.url, settings=settings):
        run_id = await client.start("esign", "contract-3", wait=True)
        with pytest.raises(RunFailedError) as info:
            await client.result(run_id, timeout=60)
    error = info.value.error
    assert error is not None and error.type == "CallbackKeysMissing"
    assert "SOJOURN_CALLBACK_KEYS" in error.message and "callback_keys" in error.message
    assert seen == []
    events = await events_of(client, run_id)
    assert not [e for e in events if isinstance(e, ValueRecorded)]


def refusal(call: Callable[[], object]) -> str:
    try:
        call()
    except (InvalidName, ValueError, CallbackKeysMissing) as e:
        return type(e).__name__
    return "accepted"


async def test_bad_arguments_are_refused_before_anything_is_recorded(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    keys = CallbackKeys([("k1", OLD_SECRET.encode())])

    @agent("careless")
    async def careless(ctx: Context, _: None) -> dict[str, Any]:
        refused = [
            refusal(lambda: ctx.callback("sojourn-child.x", ttl=60)),
            refusal(lambda: ctx.callback("a..b", ttl=60)),
            refusal(lambda: ctx.callback("docs.signed", ttl=0)),
            refusal(lambda: ctx.callback("docs.signed", ttl=timedelta(days=367))),
        ]
        token = ctx.callback("paid", ttl=timedelta(minutes=5))
        return {"refused": refused, "token": token}

    async with Worker([careless], nats=nats_server.url, settings=settings, callback_keys=keys):
        run_id = await client.start("careless", None, wait=True)
        out = await client.result(run_id, timeout=60)
    assert out["refused"] == ["InvalidName", "InvalidName", "ValueError", "ValueError"]
    values = [e for e in await events_of(client, run_id) if isinstance(e, ValueRecorded)]
    assert [(v.position, v.kind) for v in values] == [(0, "callback")]
    claims = keys.verify(out["token"], values[0].at)
    assert claims.signal == "paid" and claims.run_id == run_id
    assert values[0].at + 300 <= claims.expires_at <= values[0].at + 302
