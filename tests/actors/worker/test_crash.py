"""Crash recovery with real processes: SIGKILL a worker mid-step, restart the broker mid-run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.schemas import StepStarted
from sojourn.schemas.config import Settings
from tests import procs
from tests.conftest import wait_for


def WorkerProc(url: str, prefix: str, log: Path, slow: float = 3.0) -> procs.WorkerProc:
    """A worker for tests.apps.effects in its own process, killed for real."""
    return procs.WorkerProc(
        url, prefix, "tests.apps.effects", SOJOURN_TEST_LOG=str(log), SOJOURN_SLOW_STEP=str(slow)
    )


def executions(log: Path) -> list[tuple[str, str, str, int]]:
    if not log.exists():
        return []
    rows = []
    for raw in log.read_text().splitlines():
        event, name, key, attempt = raw.split()
        rows.append((event, name, key, int(attempt)))
    return rows


async def test_sigkill_worker_mid_step_resumes_on_another(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    first = WorkerProc(nats_server.url, settings.prefix, log)
    second: procs.WorkerProc | None = None
    try:
        await first.ready()
        run_id = await client.start("pipeline", 5, run_id="crash-1", wait=True)

        async def slow_step_running() -> bool:
            return any(r[0] == "exec" and r[1] == "slow" for r in executions(log))

        await wait_for(slow_step_running, what="the slow step to start")
        first.kill()
        second = WorkerProc(nats_server.url, settings.prefix, log, slow=0.1)
        await second.ready()
        assert await client.result(run_id, timeout=60) == [0, 10, 20, 30, 40]
    finally:
        first.stop()
        if second:
            second.stop()

    rows = executions(log)
    execs = Counter((name, key) for ev, name, key, _ in rows if ev == "exec")
    # Every completed step ran exactly once; the interrupted one at most twice, same key.
    assert execs[("quick", "crash-1/0")] == 1
    assert execs[("quick", "crash-1/1")] == 1
    assert execs[("slow", "crash-1/2")] == 2
    assert execs[("quick", "crash-1/3")] == 1
    assert execs[("quick", "crash-1/4")] == 1
    attempts = [a for ev, name, _, a in rows if ev == "exec" and name == "slow"]
    assert attempts == [1, 2]
    starts = [
        e for d in await client.history(run_id) for e in d.events if isinstance(e, StepStarted)
    ]
    assert [(e.position, e.attempt) for e in starts] == [
        (0, 1),
        (1, 1),
        (2, 1),
        (2, 2),
        (3, 1),
        (4, 1),
    ]


async def test_sigkill_broker_mid_run_loses_nothing(
    own_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    worker = WorkerProc(own_server.url, settings.prefix, log, slow=2.0)
    client = await Client.connect(own_server.url, settings=settings)
    try:
        await worker.ready()
        run_id = await client.start("pipeline", 6, run_id="broker-crash", wait=True)

        async def slow_step_running() -> bool:
            return any(r[0] == "exec" and r[1] == "slow" for r in executions(log))

        await wait_for(slow_step_running, what="the slow step to start")
        before = [(d.seq, d.events) for d in await client.history(run_id)]
        await client.close()
        own_server.kill()
        await own_server.start()  # same store, same port
        client = await Client.connect(own_server.url, settings=settings)
        assert await client.result(run_id, timeout=90) == [0, 10, 20, 30, 40, 50]
        after = [(d.seq, d.events) for d in await client.history(run_id)]
        assert after[: len(before)] == before  # every acknowledged event survived
    finally:
        worker.stop()
        await client.close()
    execs = Counter((name, key) for ev, name, key, _ in executions(log) if ev == "exec")
    assert all(count == 1 for (name, _), count in execs.items() if name == "quick")
    assert execs[("slow", "broker-crash/2")] in (1, 2)
