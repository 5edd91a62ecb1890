"""A run's spans in one process, through the SDK's in-memory exporter (each case in a fresh
process: a process sets its tracer provider once): a run started inside the caller's span is
its child; a failed attempt and its retry; an in-doubt attempt settled by its reconcile
function after its worker was killed (``Worker.kill``, as a SIGKILL would) is emitted once, by
the worker that settled it; a run started without a parent has a trace of its own, the same on
every activation; and a sampler that samples nothing exports nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from sojourn.broker import EmbeddedServer
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.usefixtures("processes")

PROBE = """
import asyncio, json, sys
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from sojourn.actors import Context, RetryPolicy, Worker, agent, step
from sojourn.actors.testing import SojournEnv

calls = {"flaky": 0}
charging = asyncio.Event()

async def flaky(x: int) -> str:
    calls["flaky"] += 1
    if calls["flaky"] == 1:
        raise RuntimeError("the first attempt fails")
    return "ok"

async def found(key: str) -> str:
    return "charged before"

@step(in_doubt=found)
async def charge(x: int) -> str:
    charging.set()
    await asyncio.Event().wait()  # never returns: its worker is killed meanwhile
    return "charged"

@agent("spans")
async def spans(ctx: Context, x: int) -> list[str]:
    retried = step(retry=RetryPolicy(retry_on=(RuntimeError,), initial_interval=0.01))(flaky)
    a = await ctx.step(retried, x)
    b = await ctx.step(charge, x)
    return [a, b]

async def main() -> None:
    async with SojournEnv([spans], server=sys.argv[1], virtual_time=False) as env:
        ids = (0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331)
        caller = NonRecordingSpan(SpanContext(*ids, True, TraceFlags(1)))
        token = context.attach(trace.set_span_in_context(caller))
        try:
            run_id = await env.client.start("spans", 1, wait=True, run_id="with-parent")
        finally:
            context.detach(token)
        await asyncio.wait_for(charging.wait(), 60)
        env.worker.kill()
        fresh = Worker([spans], nats=env.url, settings=env.settings)
        await fresh.start()
        try:
            result = await env.client.result(run_id, timeout=60)
        finally:
            await fresh.stop()
    out = []
    for s in exporter.get_finished_spans():
        out.append({
            "name": s.name,
            "trace": f"{s.context.trace_id:032x}",
            "id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent else "",
            "attributes": dict(s.attributes),
            "status": s.status.status_code.name,
        })
    print(json.dumps({"result": result, "spans": out}))

asyncio.run(main())
"""

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


def _probe(url: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=subprocess_env(**env),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_retries_and_an_in_doubt_attempt_settled_after_a_kill(nats_server: EmbeddedServer) -> None:
    got = _probe(nats_server.url)
    assert got["result"] == ["ok", "charged before"]
    spans = got["spans"]
    ids = [s["id"] for s in spans]
    assert len(ids) == len(set(ids))
    assert {s["trace"] for s in spans} == {CALLER_TRACE}
    (run,) = [s for s in spans if s["name"] == "run spans"]
    assert run["parent"] == CALLER_SPAN  # the caller's current span, taken by Client.start
    flaky = sorted(
        (s for s in spans if s["name"] == "flaky"),
        key=lambda s: s["attributes"]["sojourn.step.attempt"],
    )
    assert [s["attributes"]["sojourn.step.outcome"] for s in flaky] == [
        "retry_scheduled",
        "completed",
    ]
    assert flaky[0]["status"] == "ERROR" and flaky[0]["attributes"]["error.type"] == "RuntimeError"
    assert flaky[1]["attributes"]["sojourn.step.retry_of"] == "failed"
    (charge,) = [s for s in spans if s["name"] == "charge"]  # once: settled, never run again
    assert charge["attributes"]["sojourn.step.attempt"] == 1
    assert charge["attributes"]["sojourn.step.settled"] == "in_doubt"
    assert charge["attributes"]["sojourn.step.outcome"] == "completed"


def test_a_sampler_that_samples_nothing_exports_nothing(nats_server: EmbeddedServer) -> None:
    got = _probe(nats_server.url, OTEL_TRACES_SAMPLER="always_off")
    assert got["result"] == ["ok", "charged before"]
    assert got["spans"] == []
