"""The onboarding agent end to end, with its worker SIGKILLed between every stage."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.conftest import wait_for
from tests.procs import WorkerProc


async def test_onboarding_survives_a_crash_between_every_stage(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    procs: list[WorkerProc] = []

    async def worker() -> WorkerProc:
        w = WorkerProc(
            nats_server.url,
            settings.prefix,
            "examples.onboarding",
            SOJOURN_ONBOARDING_OUTBOX=str(outbox),
        )
        procs.append(w)
        return await w.ready()

    async def waiting_on(run_id: str, *what: str) -> None:
        async def check() -> bool:
            st = await client.state(run_id)
            return st.status == "waiting" and set(what) == set(st.waiting_on)

        await wait_for(check, timeout=60, what=f"{run_id} to wait on {what}")

    async def escalated() -> bool:
        return any(outbox.glob("escalation-*.txt"))

    try:
        w = await worker()
        hire = {
            "name": "Ada",
            "email": "ada@example.com",
            "manager": "grace",
            "escalate_after": 1.0,
            "docs_deadline": 3600,
        }
        run_id = await client.start("onboarding", hire, run_id="onboard-ada", wait=True)
        # Stage 1: note drafted, welcome packet sent, waiting for signatures (with a deadline).
        await waiting_on(run_id, "signal:docs.signed", "timer")
        w.kill()
        # Stage 2: nobody signs; the escalation's timer fires while no worker exists, HR is
        # paged, and the run waits on to the docs deadline.
        w = await worker()
        await wait_for(escalated, timeout=60, what="HR paged")
        await waiting_on(run_id, "signal:docs.signed", "timer")
        start = (await client.history(run_id))[0].events[0].at
        deadline = (await client.state(run_id)).deadline
        assert deadline is not None and 3590 < deadline - start < 3610
        w.kill()
        # Stage 3: the signature arrives while no worker runs; the manager is asked.
        await client.signal(run_id, "docs.signed", {"by": "ada@example.com"})
        w = await worker()
        await waiting_on(run_id, "signal:approval.laptop", "timer")
        w.kill()
        # Stage 4: the manager approves; a fresh worker provisions (a child run) and finishes.
        await client.signal(run_id, "approval.laptop", {"approve": True, "by": "grace"})
        w = await worker()
        result = await client.result(run_id, timeout=60)
    finally:
        for p in procs:
            p.stop()

    assert result["outcome"] == "onboarded"
    assert result["signed_by"] == "ada@example.com"
    assert result["escalated"] is True
    assert result["laptop_decided_by"] == "grace"
    assert result["laptop"]["email"] == "ada@example.com"
    assert result["laptop"]["model"] == "16-inch laptop"
    files = Counter(p.name.split("-")[0] for p in outbox.glob("*.txt"))
    assert files == Counter(
        {"welcome": 1, "escalation": 1, "approval": 1, "account": 1, "laptop": 1}
    )
    runs = Counter(line.split()[0] for line in (outbox / "effects.log").read_text().splitlines())
    assert runs == Counter(
        {"welcome": 1, "escalation": 1, "approval-request": 1, "account": 1, "laptop-order": 1}
    )
    (child_id,) = (await client.state(run_id)).children
    child = await client.state(child_id)
    assert child.status == "completed" and child.parent_run_id == run_id
