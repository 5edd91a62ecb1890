"""Record the golden histories of the example agents: ``python -m tests.golden.record``.

Runs every example agent on an embedded nats-server (with a worker in this process), drives
each run through its waits, and writes each history as ``sojourn history RUN --json`` prints
it to ``tests/golden/<module>--<label>.json``. tests/actors/core/test_golden.py replays them
against today's code: a change to an example that would strand its recorded runs fails CI.
Re-record only for a change that is meant to break old histories (and say so in the commit),
and only the examples it changes: ``python -m tests.golden.record onboarding`` records the
named examples (module names) and leaves the other files as they are.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from sojourn.actors import Agent, Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.events import HistoryEntry, StepCompleted

HERE = Path(__file__).resolve().parent
EXAMPLES = frozenset(
    {"greeter", "welcome", "onboarding", "streaming", "research_agent", "chat", "hourly_report"}
    | {"openai_agents"}
    | {"mcp_tools"}
    | {"langgraph_agent"}
)


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


async def record(url: str, scratch: Path, only: frozenset[str] = EXAMPLES) -> None:
    os.environ["SOJOURN_DEMO_OUTBOX"] = str(scratch / "welcome")
    os.environ["SOJOURN_DEMO_STEP_SECONDS"] = "0"
    os.environ["SOJOURN_ONBOARDING_OUTBOX"] = str(scratch / "onboarding")
    os.environ["NOTES_DB"] = str(scratch / "notes.sqlite")  # mcp_tools' MCP server
    from examples import (
        chat,
        greeter,
        hourly_report,
        langgraph_agent,
        mcp_tools,
        onboarding,
        openai_agents,
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
        mcp_tools.note_taker,
        openai_agents.support_desk,
        langgraph_agent.travel_agent,
    ]
    settings = Settings(prefix="golden")
    worker = Worker(agents, nats=url, settings=settings)
    await worker.start()
    client = await Client.connect(url, settings=settings)
    try:
        if "greeter" in only:
            await record_greeter(client)
        if "welcome" in only:
            await record_welcome(client)
        if "onboarding" in only:
            await record_onboarding(client)
        if "streaming" in only:
            await record_streaming(client)
        if "research_agent" in only:
            await record_research(client)
        if "chat" in only:
            await record_chat(client)
        if "hourly_report" in only:
            await record_hourly(client)
        if "mcp_tools" in only:
            await record_mcp_tools(client)
        if "openai_agents" in only:
            await record_openai_agents(client)
        if "langgraph_agent" in only:
            await record_langgraph(client)
    finally:
        await client.close()
        await worker.stop()


async def record_greeter(client: Client) -> None:
    run = await client.start("greeter", {"name": "Ada", "email": "ada@example.com"})
    await client.result(run, timeout=60)
    await save(client, "examples.greeter--completed", run)


async def record_welcome(client: Client) -> None:
    run = await client.start("welcome", {"name": "Ada", "email": "ada@example.com"})
    await client.result(run, timeout=60)
    await save(client, "examples.welcome--completed", run)


async def until_step(client: Client, run_id: str, name: str) -> None:
    for _ in range(600):
        if any(
            isinstance(e, StepCompleted) and e.name == name
            for d in await client.history(run_id)
            for e in d.events
        ):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{run_id} never completed a step {name}")


async def record_onboarding(client: Client) -> None:
    # Production deadlines (days): parked on the signature, then signed and approved.
    hire = {"name": "Ada", "email": "ada@example.com", "manager": "grace"}
    run = await client.start("onboarding", hire)
    await until_waiting_on(client, run, "docs.signed")
    await save(client, "examples.onboarding--parked", run)
    await client.signal(run, "docs.signed", {"by": "ada@example.com"})
    await until_waiting_on(client, run, "approval.laptop")
    await client.signal(run, "approval.laptop", {"approve": True, "by": "grace"})
    await client.result(run, timeout=60)
    await save(client, "examples.onboarding--completed", run)
    (child,) = (await client.state(run)).children
    await save(client, "examples.onboarding--child", child)

    # HR paged after half a second; signed after that; the manager silent: the policy denies.
    late = {**hire, "escalate_after": 0.5, "docs_deadline": 3600, "approval_deadline": 0.5}
    run = await client.start("onboarding", late)
    await until_step(client, run, "page_hr")
    await until_waiting_on(client, run, "docs.signed")
    await client.signal(run, "docs.signed", {"by": "ada@example.com"})
    await client.result(run, timeout=60)
    await save(client, "examples.onboarding--escalated", run)

    # Never signed: HR paged, then the docs deadline ends the run.
    never = {**hire, "escalate_after": 0.3, "docs_deadline": 0.8}
    run = await client.start("onboarding", never)
    await client.result(run, timeout=60)
    await save(client, "examples.onboarding--unsigned", run)


async def record_streaming(client: Client) -> None:
    question = {"question": "What is durable execution?", "tokens": 12, "delay": 0}
    run = await client.start("answerer", question)
    await client.result(run, timeout=60)
    await save(client, "examples.streaming--completed", run)


async def record_research(client: Client) -> None:
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


async def record_chat(client: Client) -> None:
    run = await client.start("chat", {"question": "What is the weather in Lisbon?"})
    await client.result(run, timeout=60)
    await save(client, "examples.chat--completed", run)


async def record_hourly(client: Client) -> None:
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


async def record_openai_agents(client: Client) -> None:
    run = await client.start("support-desk", "Please refund order A1")
    await until_waiting_on(client, run, "approval.refund")
    await save(client, "examples.openai_agents--parked", run)
    await client.signal(run, "approval.refund", {"approve": True, "by": "ada"})
    await client.result(run, timeout=60)
    await save(client, "examples.openai_agents--approved", run)
    run = await client.start("support-desk", "Please refund order A1")
    await until_waiting_on(client, run, "approval.refund")
    await client.signal(run, "approval.refund", {"approve": False, "by": "ada", "note": "no"})
    await client.result(run, timeout=60)
    await save(client, "examples.openai_agents--denied", run)


async def record_langgraph(client: Client) -> None:
    run = await client.start("travel-agent", "a flight to Lisbon on May 4")
    await until_waiting_on(client, run, "approval.book_flight")
    await save(client, "examples.langgraph_agent--parked", run)
    await client.signal(run, "approval.book_flight", {"approve": True, "by": "ada"})
    await client.result(run, timeout=60)
    await save(client, "examples.langgraph_agent--approved", run)


async def record_mcp_tools(client: Client) -> None:
    run = await client.start("note-taker", ["buy milk", "call Ada"])
    await client.result(run, timeout=60)
    await save(client, "examples.mcp_tools--completed", run)


async def main(only: frozenset[str] = EXAMPLES) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        server = EmbeddedServer(store_dir=Path(scratch) / "nats", port=0)
        await server.start()
        try:
            await record(server.url, Path(scratch), only)
        finally:
            await server.stop()


if __name__ == "__main__":
    named = frozenset(sys.argv[1:]) or EXAMPLES
    if named - EXAMPLES:
        sys.exit(f"unknown examples {sorted(named - EXAMPLES)}: choose from {sorted(EXAMPLES)}")
    asyncio.run(main(named))
