"""A run's step list and spend on the read side (decision 0040), on a real nats-server: the
projector writes it as the run's steps go, ``Client.steps`` and ``GET /v1/runs/{id}/steps``
read it, and bytes a stranger left at its key are never taken for one."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.actors.console.timeline import timeline_of
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker.connection import Broker
from sojourn.projections.projector import Projector
from sojourn.schemas.codec import decode_run_steps, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.steps import RunSteps
from sojourn.schemas.vocabulary import BUDGET_LIMITS
from tests.actors.gateway.conftest import CLIENT_TOKEN, Files, start_gateway
from tests.conftest import wait_for
from tests.projections.test_projector import serving
from tests.projections.test_steplist import _expected

pytestmark = pytest.mark.usefixtures("processes")

DEADLINE = 90.0


def quick(i: int) -> int:
    return i


@agent("rs_then_wait")
async def rs_then_wait(ctx: Context, n: int) -> str:
    """``n`` quick steps in a burst (faster than the record is rewritten), then a wait."""
    for i in range(n):
        await ctx.step(quick, i)
    said: str = await ctx.wait_for("go", type=str)
    return said


async def test_a_run_s_steps_appear_on_the_read_side_with_their_timings(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        await wait_for(lambda: _true(p.leading), DEADLINE, what="the projector to lead")
        async with serving(nats_server.url, settings):
            run_id = await client.start("pj_steps", 3, run_id="stepped")

            async def ended() -> bool:
                view = await client.view(run_id)
                steps = await client.steps(run_id)
                return (
                    view is not None
                    and view.status == "completed"
                    and steps is not None
                    and steps.last_seq == view.last_seq
                )

            await wait_for(ended, DEADLINE, what="the run's last steps record")
        assert p._store.steps_written >= 1
    record = await client.steps(run_id)
    assert record is not None and record.run_id == run_id
    assert record.steps_total == 4 and [s.position for s in record.steps] == [0, 1, 2, 3]
    for s in record.steps[:3]:
        assert s.name.endswith("work") and s.outcome == "completed" and s.attempts == 1
        assert s.ended_at is not None and s.ended_at >= s.started_at
        assert s.duration is not None and s.duration >= 0.01  # each sleeps 10 ms
    flaky = record.steps[3]
    assert (flaky.attempts, flaky.retries, flaky.in_doubt, flaky.outcome) == (2, 1, 0, "completed")
    assert flaky.error is not None and flaky.error.type == "ConnectionError"
    assert flaky.error.message == "first attempt fails"
    spend = {b.limit: b for b in record.spend}
    assert list(spend) == list(BUDGET_LIMITS)
    assert spend["steps"].used == 5 and spend["tool_calls"].used == 5
    assert spend["wall_seconds"].used > 0
    # what the read side holds is what the console's timeline folds from the whole history
    history = await client.history(run_id)
    timeline = timeline_of(run_id, history, now=0.0)
    assert [s for s in record.steps] == [_expected(i) for i in timeline.items if i.kind == "step"]

    # the gateway serves it, as read by the client
    keys = tmp_path / "keys"
    keys.write_text(generate_key_file_text("k1"))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{CLIENT_TOKEN} client\n")
    gw = await start_gateway(nats_server, settings, Files(tokens, keys))
    try:
        auth = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        async with httpx.AsyncClient(base_url=gw.url, headers=auth, timeout=30) as http:
            r = await http.get(f"/v1/runs/{run_id}/steps")
            assert r.status_code == 200, r.text
            assert decode_run_steps(r.content) == record
            r = await http.get("/v1/runs/nobody/steps")
            assert r.status_code == 404 and r.json()["code"] == "unknown_run"
            r = await http.get("/v1/runs/a.b/steps")
            assert r.status_code in (400, 404)
            r = await http.get(f"/v1/runs/{run_id}/steps", headers={"Authorization": ""})
            assert r.status_code == 401
    finally:
        gw.stop()


async def test_a_live_run_s_record_catches_up_with_its_view_while_it_waits(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """Decisions within a second of the last record write are held back; the projector's next
    pass writes them, so a waiting run's record reaches its view's decision."""
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        await wait_for(lambda: _true(p.leading), DEADLINE, what="the projector to lead")
        w = Worker([rs_then_wait], nats=nats_server.url, settings=settings)
        await w.start()
        try:
            run_id = await client.start("rs_then_wait", 30, run_id="burst")

            async def caught_up() -> bool:
                view = await client.view(run_id)
                steps = await client.steps(run_id)
                return (
                    view is not None
                    and view.status == "waiting"
                    and steps is not None
                    and steps.last_seq == view.last_seq
                )

            await wait_for(caught_up, DEADLINE, what="the waiting run's record")
            record = await client.steps(run_id)
            assert record is not None and record.steps_total == 30
            assert all(s.outcome == "completed" for s in record.steps)
            assert [s.position for s in record.steps] == list(range(30))
        finally:
            await w.stop()


async def test_bytes_a_stranger_left_at_a_steps_key_are_not_a_record(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    from sojourn.broker.topology import ensure_topology

    names = Names(settings.prefix)
    b = await Broker.connect(nats_server.url)
    try:
        await ensure_topology(b, names, settings, consumers=False)
        hostile = [
            b"not json",
            b"[" * 10_000,
            encode({"run_id": "other", "steps": []}),  # another run's record
            encode({"run_id": "r9", "steps": [{"position": "x", "name": 1}]}),
            b'{"run_id": "r9", "pad": "' + b"x" * 300_000 + b'"}',
        ]
        for data in hostile:
            await b.publish(names.run_steps_key("r9"), data)
            assert await client.steps("r9") is None
        good = RunSteps(run_id="r9", steps_total=3)
        await b.publish(names.run_steps_key("r9"), encode(good))
        assert await client.steps("r9") == good
    finally:
        await b.close()


async def _true(value: bool) -> bool:
    return value
