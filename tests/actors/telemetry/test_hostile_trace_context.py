"""Every byte from the wire is hostile, trace context too: a ``traceparent`` or
``tracestate`` that is malformed, oversized or not text is ignored on a start or a signal, over
NATS and over HTTP (with the gateway tracing or not): the run starts and ends as without it,
and nothing of it is recorded. A well-formed one beside them is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.eventstore import Decision
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted, SignalReceived
from sojourn.schemas.wire import StartTrigger
from tests.actors.gateway.conftest import CLIENT_TOKEN, Files, start_gateway

from .otlp import OtlpReceiver

pytestmark = pytest.mark.usefixtures("processes")

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GARBAGE = [
    "garbage",
    "",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
    GOOD + "-extra",  # version 00 has no more fields
    "00-" + "a" * 5000,
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" * 50,
    "00-0af7651916cd43dd8448eb211c8031é-b7ad6b7169203331-01",
]


async def echo(x: int) -> int:
    return x


@agent("hostile_traced")
async def hostile_traced(ctx: Context, x: int) -> int:
    got = await ctx.wait_for("go")
    return int(await ctx.step(echo, x)) + int(got)


def _started(history: list[Decision]) -> RunStarted:
    first = history[0].events[0]
    assert isinstance(first, RunStarted)
    return first


def _signals(history: list[Decision]) -> list[SignalReceived]:
    return [e for d in history for e in d.events if isinstance(e, SignalReceived)]


async def test_garbage_trace_context_on_nats_is_ignored(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    worker = Worker([hostile_traced], nats=nats_server.url, settings=settings)
    await worker.start()
    try:
        values = [*GARBAGE, GOOD]
        for i, value in enumerate(values):
            run_id = f"nats-{i}"
            body = encode(StartTrigger(input=to_raw(i), run_id=run_id))
            headers = {h.MSG_ID: f"start:{run_id}", h.TRACEPARENT: value, h.TRACESTATE: value}
            await client.broker.publish(
                client.names.start("hostile_traced", None, run_id), body, headers
            )
            signal_headers = {h.MSG_ID: f"signal:{run_id}", h.TRACEPARENT: value}
            await client.broker.publish(
                client.names.signal(run_id, "go"), encode(1), signal_headers
            )
        for i, value in enumerate(values):
            run_id = f"nats-{i}"
            assert await client.result(run_id, timeout=60) == i + 1
            history = await client.history(run_id)
            started, signals = _started(history), _signals(history)
            expected = GOOD if value == GOOD else None
            assert started.traceparent == expected, value
            assert started.tracestate is None, value
            assert [s.traceparent for s in signals] == [expected], value
    finally:
        await worker.stop()


@pytest.mark.parametrize("tracing", ["off", "on"])
async def test_garbage_trace_context_over_http_is_ignored(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path, tracing: str
) -> None:
    receiver = await OtlpReceiver().start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint} if tracing == "on" else {}
    (tmp_path / "tokens").write_text(f"{CLIENT_TOKEN} client\n")
    (tmp_path / "keys").write_text(generate_key_file_text("k1"))
    files = Files(tmp_path / "tokens", tmp_path / "keys")
    gateway = await start_gateway(nats_server, settings, files, **env)
    worker = Worker([hostile_traced], nats=nats_server.url, settings=settings)
    await worker.start()
    values: list[bytes] = [
        *(v.encode() for v in GARBAGE[:-1]),
        "é".encode(),
        b"\xff\xfe\x80",
        GOOD.encode(),
    ]
    try:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": f"Bearer {CLIENT_TOKEN}"}, timeout=30
        ) as http:
            for i, value in enumerate(values):
                run_id = f"http-{i}"
                r = await http.post(
                    "/v1/agents/hostile_traced/runs",
                    content=json.dumps(i),
                    headers={
                        b"idempotency-key": run_id.encode(),
                        b"content-type": b"application/json",
                        b"traceparent": value,
                        b"tracestate": value,
                    },
                )
                assert r.status_code in (201, 202), (value, r.text)
                r = await http.post(
                    f"/v1/runs/{run_id}/signals/go",
                    content=b"1",
                    headers={b"content-type": b"application/json", b"traceparent": value},
                )
                assert r.status_code == 202, (value, r.text)
        for i, value in enumerate(values):
            run_id = f"http-{i}"
            assert await client.result(run_id, timeout=60) == i + 1
            history = await client.history(run_id)
            started, signals = _started(history), _signals(history)
            if value == GOOD.encode():
                # The gateway's own span is the parent when it traces; the caller's when not.
                assert started.traceparent is not None
                assert started.traceparent[3:35] == GOOD[3:35]
                assert (started.traceparent == GOOD) == (tracing == "off")
                assert signals[0].traceparent is not None
            else:
                if tracing == "off":
                    assert started.traceparent is None, value
                    assert [s.traceparent for s in signals] == [None], value
                else:  # a fresh trace of the gateway's own: never the garbage
                    assert started.traceparent is not None
                    assert started.traceparent.encode() not in values
                assert started.tracestate is None, value
    finally:
        await worker.stop()
        gateway.stop()
        await receiver.stop()
