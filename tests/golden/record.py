"""Record the golden histories of the example agents: ``python -m tests.golden.record``.

Runs every example agent on an embedded nats-server (with a worker in this process), drives
each run through its waits, and writes each history as ``sojourn history RUN --json`` prints
it to ``tests/golden/<module>--<label>.json``. tests/actors/core/test_golden.py replays them
against today's code: a change to an example that would strand its recorded runs fails CI.
Re-record only for a change that is meant to break old histories (and say so in the commit).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from sojourn.actors import Agent, Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.events import HistoryEntry

HERE = Path(__file__).resolve().parent


async def until_waiting_on(client: Client, run_id: str, what: str) -> None:
    for _ in range(600):
        history = await client.history(run_id)
        if history:
            state = await client.state(run_id)
            if any(what in on for on in state.waiting_on):
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{run_id} never waited on {what}")


async def save(client: Client, name: str, run_id: str) -> None:
    history = await client.history(run_id)
    entries = [HistoryEntry(seq=d.seq, writer=d.writer, events=list(d.events)) for d in history]
    (HERE / f"{name}.json").write_bytes(encode(entries) + b"\n")
    print(f"{name}: {sum(len(d.events) for d in history)} events")


async def record(url: str, scratch: Path) -> None:
    os.environ["SOJOURN_DEMO_OUTBOX"] = str(scratch / "welcome")
    os.environ["SOJOURN_DEMO_STEP_SECONDS"] = "0"
    os.environ["SOJOURN_ONBOARDING_OUTBOX"] = str(scratch / "onboarding")
    from examples import (
        chat,
        greeter,
        hourly_report,
        onboarding,
        research_agent,
        streaming,
        welcome,
    )

    agents: list[Agent[Any, Any]] = [
        greeter.greeter,
        welcome.welcome,
        onboarding.onboarding,
        onboarding.it_provision,
        streaming.answerer,
        research_agent.researcher,
        chat.chat,
        hourly_report.report,
    ]
    settings = Settings(prefix="golden")
    worker = Worker(agents, nats=url, settings=settings)
    await worker.start()
    client = await Client.connect(url, settings=settings)
    try:
        run = await client.start("greeter", {"name": "Ada", "email": "ada@example.com"})
        await client.result(run, timeout=60)
        await save(client, "examples.greeter--completed", run)

        run = await client.start("welcome", {"name": "Ada", "email": "ada@example.com"})
        await client.result(run, timeout=60)
        await save(client, "examples.welcome--completed", run)

        hire = {"name": "Ada", "email": "ada@example.com", "docs_deadline": 3600}
        run = await client.start("onboarding", hire)
        await until_waiting_on(client, run, "docs.signed")
        await save(client, "examples.onboarding--parked", run)
        await client.signal(run, "docs.signed", {"by": "ada@example.com"})
        await until_waiting_on(client, run, "hardware.delivered")
        await client.signal(run, "hardware.delivered", {"serial": "SN-1"})
        await client.result(run, timeout=60)
        await save(client, "examples.onboarding--completed", run)
        await save(client, "examples.onboarding--child", f"{run}-c2")

        late = {**hire, "docs_deadline": 0.5, "hardware_deadline": 0.5}
        run = await client.start("onboarding", late)
        await until_waiting_on(client, run, "docs.signed")
        await asyncio.sleep(1.0)  # past the deadline: HR is paged, the run waits again
        await until_waiting_on(client, run, "docs.signed")
        await client.signal(run, "docs.signed", {"by": "hr@example.com"})
        await client.result(run, timeout=60)
        await save(client, "examples.onboarding--escalated", run)

        question = {"question": "What is durable execution?", "tokens": 12, "delay": 0}
        run = await client.start("answerer", question)
        await client.result(run, timeout=60)
        await save(client, "examples.streaming--completed", run)

        research = {"topic": "durable execution", "to": "ada@example.com"}
        run = await client.start("researcher", research)
        await until_waiting_on(client, run, "approval.send_report")
        await save(client, "examples.research_agent--parked", run)
        await client.signal(run, "approval.send_report", {"approve": True, "by": "ada"})
        await client.result(run, timeout=60)
        await save(client, "examples.research_agent--approved", run)
        run = await client.start("researcher", research)
        await until_waiting_on(client, run, "approval.send_report")
        denial = {"approve": False, "by": "ada", "note": "not yet"}
        await client.signal(run, "approval.send_report", denial)
        await client.result(run, timeout=60)
        await save(client, "examples.research_agent--denied", run)

        run = await client.start("chat", {"question": "What is the weather in Lisbon?"})
        await client.result(run, timeout=60)
        await save(client, "examples.chat--completed", run)

        # A run started by a schedule's fire (not a trigger): its RunStarted names the
        # schedule and the nominal fire time.
        await client.add_schedule("hourly-report", agent="report", every=1, input={"team": "sales"})
        fired: str | None = None
        for _ in range(600):
            record = await client.schedule("hourly-report")
            fired = record.last_run_id if record is not None else None
            if fired is not None:
                break
            await asyncio.sleep(0.05)
        if fired is None:
            raise RuntimeError("schedule hourly-report never fired")
        await client.delete_schedule("hourly-report")
        await client.result(fired, timeout=60)
        await save(client, "examples.hourly_report--scheduled", fired)
    finally:
        await client.close()
        await worker.stop()


async def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        server = EmbeddedServer(store_dir=Path(scratch) / "nats", port=0)
        await server.start()
        try:
            await record(server.url, Path(scratch))
        finally:
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
