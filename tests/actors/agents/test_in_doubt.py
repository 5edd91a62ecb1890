"""In-doubt steps, made in doubt for real: a worker process is SIGKILLed while a step's body
runs (its ``StepStarted`` is recorded, its end never is), and another worker takes the run over
and applies the step's ``in_doubt`` policy: ``retry``, ``ask`` (suspend until ``decide``) or a
``reconcile`` function asked by idempotency key.

Two worker processes serve ``tests.apps.retry_agents``; the one whose pid the step's log line
names is killed, the other takes over after the lease (2 s).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest_asyncio

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.schemas import (
    RunEvent,
    RunResumed,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    from_raw,
)
from sojourn.schemas.config import Settings
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.procs import WorkerProc

MODULE = "tests.apps.retry_agents"


@dataclass(frozen=True)
class Row:
    event: str  # exec, done, reconcile
    pid: int
    step: str
    key: str
    last: str  # the attempt; for reconcile, what the ledger held ("-": nothing)


@dataclass
class Deployment:
    url: str
    prefix: str
    log: Path
    ledger: Path
    workers: list[WorkerProc] = field(default_factory=list)

    async def start(self, n: int = 2, **env: str) -> list[WorkerProc]:
        env = {"SOJOURN_TEST_LOG": str(self.log), "SOJOURN_TEST_LEDGER": str(self.ledger), **env}
        new = [WorkerProc(self.url, self.prefix, MODULE, lease_ttl=2.0, **env) for _ in range(n)]
        self.workers.extend(new)
        await asyncio.gather(*(w.ready() for w in new))
        return new

    def rows(self) -> list[Row]:
        if not self.log.exists():
            return []
        out = []
        for raw in self.log.read_text().splitlines():
            event, pid, step, key, last = raw.split()
            out.append(Row(event, int(pid), step, key, last))
        return out

    def execs(self, step: str) -> list[tuple[int, str, int]]:
        """``(pid, key, attempt)`` of every time ``step``'s body started."""
        return [
            (r.pid, r.key, int(r.last)) for r in self.rows() if r.event == "exec" and r.step == step
        ]

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.proc.poll() is None]

    async def crash_mid_step(self, step: str, key: str, attempt: int = 1) -> WorkerProc:
        """Wait until ``step`` (``key``, ``attempt``) is running, SIGKILL the worker running it
        (its end is never recorded); return the killed worker."""

        async def running() -> bool:
            return any(
                r.event == "exec" and r.step == step and r.key == key and r.last == str(attempt)
                for r in self.rows()
            )

        await wait_for(running, timeout=30, what=f"{step} attempt {attempt} to run")
        (row,) = [
            r
            for r in self.rows()
            if r.event == "exec" and r.step == step and r.key == key and r.last == str(attempt)
        ]
        (victim,) = [w for w in self.alive() if w.proc.pid == row.pid]
        victim.kill()
        assert not any(r.event == "done" and r.key == key and r.pid == row.pid for r in self.rows())
        return victim


@pytest_asyncio.fixture
async def deployment(
    nats_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> AsyncIterator[Deployment]:
    d = Deployment(nats_server.url, settings.prefix, tmp_path / "steps.log", tmp_path / "ledger")
    try:
        yield d
    finally:
        for w in d.workers:
            w.stop()


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def step_events(client: Client, run_id: str, position: int) -> list[tuple[str, int]]:
    out = []
    for e in await events_of(client, run_id):
        if isinstance(e, (StepStarted, StepCompleted, StepFailed)) and e.position == position:
            out.append((type(e).__name__, e.attempt))
    return out


async def writer_of(client: Client, run_id: str, position: int, attempt: int) -> str:
    for d in await client.history(run_id):
        for e in d.events:
            if isinstance(e, StepStarted) and (e.position, e.attempt) == (position, attempt):
                return d.writer
    raise AssertionError(f"no StepStarted({position}, attempt {attempt})")


async def wait_suspended(client: Client, run_id: str, times: int = 1) -> None:
    async def suspended() -> bool:
        events = await events_of(client, run_id)
        n = sum(isinstance(e, RunSuspended) for e in events)
        return n >= times and (await client.state(run_id)).status == "suspended"

    await wait_for(suspended, timeout=30, what=f"the run to be suspended ({times})")


async def check_in_doubt_suspension(client: Client, run_id: str) -> None:
    state = await client.state(run_id)
    assert state.status == "suspended"
    assert state.suspended_reason == "in_doubt"
    detail = state.suspended_detail or ""
    assert "'charge_ask'" in detail and "position 1" in detail and f"{run_id}/1" in detail, detail
    assert state.anomalies == ()


async def check_clean(client: Client, run_id: str) -> None:
    state = await client.state(run_id)
    assert state.terminal and state.anomalies == (), state.anomalies


# --- default: retry ----------------------------------------------------------------------------


async def test_default_policy_reruns_with_the_same_key_as_attempt_2(
    client: Client, deployment: Deployment
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_retry", 0, run_id="doubt-retry", wait=True)
    victim = await deployment.crash_mid_step("slow", f"{run_id}/1")
    (survivor,) = deployment.alive()
    assert await client.result(run_id, timeout=30) == [0, 10, 20, 30]

    assert deployment.execs("slow") == [
        (victim.proc.pid, f"{run_id}/1", 1),
        (survivor.proc.pid, f"{run_id}/1", 2),
    ]
    for p in (0, 2, 3):
        assert len([x for x in deployment.execs("quick") if x[1] == f"{run_id}/{p}"]) == 1
    assert await step_events(client, run_id, 1) == [
        ("StepStarted", 1),
        ("StepStarted", 2),
        ("StepCompleted", 2),
    ]
    assert f"-{victim.proc.pid}-" in await writer_of(client, run_id, 1, 1)
    assert f"-{survivor.proc.pid}-" in await writer_of(client, run_id, 1, 2)
    await check_clean(client, run_id)


# --- ask ---------------------------------------------------------------------------------------


async def test_ask_suspends_and_skip_records_the_result_without_running(
    client: Client, deployment: Deployment
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_ask", 500, run_id="ask-skip", wait=True)
    victim = await deployment.crash_mid_step("charge_ask", f"{run_id}/1")
    await wait_suspended(client, run_id)
    await check_in_doubt_suspension(client, run_id)
    assert await step_events(client, run_id, 1) == [("StepStarted", 1)]

    # Resuming without a decision does not run the step: the run asks again.
    await client.resume(run_id, "no decision yet")
    await wait_suspended(client, run_id, times=2)
    await check_in_doubt_suspension(client, run_id)
    assert deployment.execs("charge_ask") == [(victim.proc.pid, f"{run_id}/1", 1)]
    assert await step_events(client, run_id, 1) == [("StepStarted", 1)]

    await client.decide(run_id, 1, "skip", "ch_manual", by="ops")
    assert await client.result(run_id, timeout=30) == {"charge": "ch_manual", "error": None}
    assert deployment.execs("charge_ask") == [(victim.proc.pid, f"{run_id}/1", 1)]
    events = await events_of(client, run_id)
    (done,) = [e for e in events if isinstance(e, StepCompleted) and e.position == 1]
    assert from_raw(done.result, str) == "ch_manual"
    assert done.attempt == 1
    assert await step_events(client, run_id, 1) == [("StepStarted", 1), ("StepCompleted", 1)]
    assert len([x for x in deployment.execs("quick") if x[1] == f"{run_id}/2"]) == 1
    await check_clean(client, run_id)


async def test_ask_then_decide_retry_runs_the_step_again(
    client: Client, deployment: Deployment
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_ask", 700, run_id="ask-retry", wait=True)
    victim = await deployment.crash_mid_step("charge_ask", f"{run_id}/1")
    (survivor,) = deployment.alive()
    await wait_suspended(client, run_id)
    await check_in_doubt_suspension(client, run_id)
    assert len(deployment.execs("charge_ask")) == 1

    await client.decide(run_id, 1, "retry")
    assert await client.result(run_id, timeout=30) == {
        "charge": "ch_700_attempt2",
        "error": None,
    }
    assert deployment.execs("charge_ask") == [
        (victim.proc.pid, f"{run_id}/1", 1),
        (survivor.proc.pid, f"{run_id}/1", 2),
    ]
    assert await step_events(client, run_id, 1) == [
        ("StepStarted", 1),
        ("StepStarted", 2),
        ("StepCompleted", 2),
    ]
    await check_clean(client, run_id)


async def test_ask_then_decide_fail_raises_step_error_in_the_agent(
    client: Client, deployment: Deployment
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_ask", 900, run_id="ask-fail", wait=True)
    await deployment.crash_mid_step("charge_ask", f"{run_id}/1")
    await wait_suspended(client, run_id)
    await check_in_doubt_suspension(client, run_id)

    await client.decide(run_id, 1, "fail", by="ops")
    assert await client.result(run_id, timeout=30) == {"charge": None, "error": "InDoubtFailed"}
    assert len(deployment.execs("charge_ask")) == 1
    events = await events_of(client, run_id)
    (failed,) = [e for e in events if isinstance(e, StepFailed)]
    assert (failed.position, failed.attempt, failed.retry_at) == (1, 1, None)
    assert failed.error.type == "InDoubtFailed" and "ops" in failed.error.message
    # The agent handled the error and ended: nothing after the failed step ran.
    assert await step_events(client, run_id, 2) == []
    assert [x for x in deployment.execs("quick") if x[1] == f"{run_id}/2"] == []
    await check_clean(client, run_id)


async def test_ask_decided_through_the_cli(
    client: Client, deployment: Deployment, settings: Settings
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_ask", 300, run_id="ask-cli", wait=True)
    await deployment.crash_mid_step("charge_ask", f"{run_id}/1")
    await wait_suspended(client, run_id)
    await check_in_doubt_suspension(client, run_id)

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "sojourn.actors.cli",
            *args,
            "--nats",
            deployment.url,
            "--prefix",
            settings.prefix,
            cwd=ROOT,
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await cli("decide", run_id, "1", "skip", "--result", json.dumps("ch_cli"))
    assert code == 0, (out, err)
    assert "decided skip" in out and run_id in out
    assert await client.result(run_id, timeout=30) == {"charge": "ch_cli", "error": None}
    assert len(deployment.execs("charge_ask")) == 1
    resumed = [e for e in await events_of(client, run_id) if isinstance(e, RunResumed)]
    assert len(resumed) == 1 and (resumed[0].by or "").startswith("cli")
    await check_clean(client, run_id)

    # The run is no longer waiting for a decision: the CLI says so and changes nothing.
    before = await client.history(run_id)
    code, out, err = await cli("decide", run_id, "1", "retry")
    assert code != 0 and "not suspended" in err, (code, out, err)
    assert await client.history(run_id) == before


async def test_ask_asks_again_when_the_retried_attempt_is_in_doubt_too(
    client: Client, deployment: Deployment
) -> None:
    """A "retry" decision settles one in-doubt attempt. If the retried attempt dies mid-way as
    well, its effect may have happened: an ``in_doubt="ask"`` step must ask again, not reuse
    the old decision and run a third time on its own."""
    await deployment.start(3, SOJOURN_SLOW_ATTEMPTS="1,2")
    run_id = await client.start("doubt_ask", 100, run_id="ask-twice", wait=True)
    await deployment.crash_mid_step("charge_ask", f"{run_id}/1", attempt=1)
    await wait_suspended(client, run_id)
    await client.decide(run_id, 1, "retry")
    await deployment.crash_mid_step("charge_ask", f"{run_id}/1", attempt=2)

    async def settled() -> bool:
        state = await client.state(run_id)
        suspended = sum(isinstance(e, RunSuspended) for e in await events_of(client, run_id))
        return state.terminal or (state.status == "suspended" and suspended >= 2)

    await wait_for(settled, timeout=30, what="the run to be suspended again (or to end)")
    assert [a for _, _, a in deployment.execs("charge_ask")] == [1, 2]
    await check_in_doubt_suspension(client, run_id)


# --- reconcile ---------------------------------------------------------------------------------


async def test_reconcile_finds_the_effect_and_the_step_is_not_rerun(
    client: Client, deployment: Deployment
) -> None:
    await deployment.start()
    run_id = await client.start("doubt_reconcile", True, run_id="rec-done", wait=True)
    victim = await deployment.crash_mid_step("charge_reconciled", f"{run_id}/1")
    (survivor,) = deployment.alive()
    assert await client.result(run_id, timeout=30) == [0, "ch_1", 20]

    assert deployment.execs("charge_reconciled") == [(victim.proc.pid, f"{run_id}/1", 1)]
    reconciles = [r for r in deployment.rows() if r.event == "reconcile"]
    assert [(r.pid, r.key, r.last) for r in reconciles] == [
        (survivor.proc.pid, f"{run_id}/1", "ch_1")
    ]
    assert await step_events(client, run_id, 1) == [("StepStarted", 1), ("StepCompleted", 1)]
    (done,) = [
        e
        for e in await events_of(client, run_id)
        if isinstance(e, StepCompleted) and e.position == 1
    ]
    assert from_raw(done.result, str) == "ch_1"
    assert deployment.ledger.read_text().splitlines() == [f"{run_id}/1 ch_1"]
    await check_clean(client, run_id)


async def test_reconcile_not_done_reruns_the_step(client: Client, deployment: Deployment) -> None:
    await deployment.start()
    run_id = await client.start("doubt_reconcile", False, run_id="rec-not-done", wait=True)
    victim = await deployment.crash_mid_step("charge_reconciled", f"{run_id}/1")
    (survivor,) = deployment.alive()
    assert await client.result(run_id, timeout=30) == [0, "ch_2", 20]

    assert deployment.execs("charge_reconciled") == [
        (victim.proc.pid, f"{run_id}/1", 1),
        (survivor.proc.pid, f"{run_id}/1", 2),
    ]
    reconciles = [r for r in deployment.rows() if r.event == "reconcile"]
    assert [(r.pid, r.key, r.last) for r in reconciles] == [(survivor.proc.pid, f"{run_id}/1", "-")]
    # The reconcile ran before the rerun.
    rows = deployment.rows()
    assert rows.index(reconciles[0]) < rows.index(
        next(
            r for r in rows if r.event == "exec" and r.step == "charge_reconciled" and r.last == "2"
        )
    )
    assert await step_events(client, run_id, 1) == [
        ("StepStarted", 1),
        ("StepStarted", 2),
        ("StepCompleted", 2),
    ]
    assert deployment.ledger.read_text().splitlines() == [f"{run_id}/1 ch_2"]
    await check_clean(client, run_id)
