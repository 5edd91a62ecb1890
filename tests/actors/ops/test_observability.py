"""Heartbeat details, budgets and the Prometheus metrics a worker exports (issue 5)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import urllib.request

import pytest
from prometheus_client import REGISTRY, generate_latest

from sojourn.actors import Budget, Client, Context, Worker, agent, heartbeat
from sojourn.actors.ops.exposition import serve_metrics, stop_metrics
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PayloadTooLarge, RunNotFound, SojournError
from sojourn.schemas.events import StepFailed
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for


def chatty(n: int) -> int:
    heartbeat({"at": n})
    return n


def loud() -> None:
    heartbeat("x" * 9000)


@agent("observed", budget=Budget(usd=1.0))
async def observed(ctx: Context, n: int) -> str:
    await ctx.step(chatty, n)
    try:
        await ctx.step(loud)
    except Exception as e:
        outcome = type(e).__name__
    for _ in range(3):
        await ctx.spend(usd=0.4, tokens=100)
    return outcome


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_steps_heartbeats_budgets_and_their_metrics(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    before = {
        "steps": sample(
            "sojourn_steps_total", agent="observed", step="chatty", outcome="completed"
        ),
        "calls": sample("sojourn_tool_calls_total", agent="observed"),
        "usd": sample("sojourn_spend_total", agent="observed", unit="usd"),
        "breach": sample("sojourn_budget_breaches_total", agent="observed", limit="usd"),
        "appended": sample("sojourn_events_appended_total", agent="observed"),
    }
    async with Worker([observed], nats=nats_server.url, settings=settings):
        run_id = await client.start("observed", 3)

        async def suspended() -> bool:
            with contextlib.suppress(RunNotFound):
                return (await client.state(run_id)).status == "suspended"
            return False

        await wait_for(suspended, 30, what="the run to reach its budget")
        state = await client.state(run_id)
        assert state.status == "suspended" and state.suspended_reason == "budget"
        assert "usd used up: 1.2 of 1" in (state.suspended_detail or "")
        liv = await client.liveness(run_id)
        assert liv.state == "suspended" and (liv.reason or "").startswith("budget")

        await client.resume(run_id)  # a second budget: the run finishes
        assert await client.result(run_id, timeout=30) == "StepError"

    # an oversized heartbeat fails the step that sent it, clearly
    history = [e for d in await client.history(run_id) for e in d.events]
    failed = [e for e in history if isinstance(e, StepFailed)]
    assert failed and failed[0].error.type == PayloadTooLarge.__name__
    assert "limit is 8192" in failed[0].error.message

    assert (
        sample("sojourn_steps_total", agent="observed", step="chatty", outcome="completed")
        == before["steps"] + 1
    )
    assert sample("sojourn_tool_calls_total", agent="observed") == before["calls"] + 2
    assert sample("sojourn_spend_total", agent="observed", unit="usd") == pytest.approx(
        before["usd"] + 1.2
    )
    assert sample("sojourn_budget_breaches_total", agent="observed", limit="usd") == (
        before["breach"] + 1
    )
    assert sample("sojourn_events_appended_total", agent="observed") > before["appended"]
    text = generate_latest(REGISTRY).decode()
    assert "sojourn_step_duration_seconds_bucket" in text
    assert "sojourn_resume_latency_seconds_bucket" in text
    assert run_id not in text  # a run id is never a label


def test_the_metrics_endpoint_serves_and_a_taken_port_is_a_clear_error(processes: None) -> None:
    server = serve_metrics(0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "# TYPE sojourn_runs gauge" in body
        assert "sojourn_worker_active_runs" in body
        with pytest.raises(SojournError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve_metrics(port)
        cli = subprocess.run(
            [PYTHON, "-m", "sojourn.actors.cli", "watchdog", "--nats", "nats://127.0.0.1:1",
             "--metrics-port", "99999"],
            cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 2 and "not a port number" in cli.stderr
    finally:
        stop_metrics(server)


def test_budgets_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"budget usd must be > 0"):
        Budget(usd=0)


def twice(i: int) -> int:
    return i * 2


@agent("crowd")
async def crowd(ctx: Context, i: int) -> int:
    return await ctx.step(twice, i) + await ctx.step(twice, i)


async def test_a_worker_counts_the_appends_it_stored_together(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([crowd], nats=nats_server.url, settings=settings):
        ids = await asyncio.gather(*(client.start("crowd", i) for i in range(60)))
        results = await asyncio.gather(*(client.result(r, timeout=60) for r in ids))
        assert results == [4 * i for i in range(60)]
        # 60 runs appending at once: what waited while an append was in flight went together.
        batches = sample("sojourn_append_batches_total")
        assert batches >= 1
        assert sample("sojourn_appends_batched_total") >= 2 * batches
