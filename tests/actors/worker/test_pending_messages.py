"""A message about a run whose start is still stored in the inbox (``Intake._not_yet``): when
this worker or another live one serves the start's agent, the start is taken soon, and the
message comes back a second or two later however often it was delivered before; when none
does (the run is pending), the pauses grow with the deliveries, so a run pending for hours
costs little. Real server; the intakes are built here, with no loop pulling the inbox, so the
start stays stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import pytest_asyncio

from sojourn.actors import Client, Context, agent
from sojourn.actors.worker.intake import UNKNOWN_RUN_RETRIES, Intake
from sojourn.actors.worker.refusals import Rejected
from sojourn.broker.eventstore import EventStore
from sojourn.broker.registry import AgentRegistry
from sojourn.schemas.config import Settings


@agent("waits")
async def waits(ctx: Context) -> object:
    return await ctx.wait_for("go")


class _Msg:
    """What ``_not_yet`` reads of a delivery: its count, and the pause it is handed back for."""

    def __init__(self, delivered: int) -> None:
        self.num_delivered = delivered
        self.naks: list[float] = []

    async def nak(self, delay: float = 0.0) -> None:
        self.naks.append(delay)


@pytest_asyncio.fixture
async def intakes(client: Client, settings: Settings) -> AsyncIterator[dict[str, Intake]]:
    """Intakes on the client's deployment: one serving ``waits``; two serving nothing, one
    knowing a live worker that serves ``waits``, one knowing none."""
    await client._ensure()
    b = client.broker
    store = EventStore(b, client.names, settings)

    def make(agents: dict[str, Any], live: bool = False) -> Intake:
        return Intake(
            broker=b,
            store=store,
            names=client.names,
            settings=settings,
            registry=AgentRegistry(b, client.names),
            agents=agents,
            writer="intake:test",
            served_elsewhere=lambda agent: live and agent == "waits",
        )

    yield {
        "serves": make({"waits": waits}),
        "live_elsewhere": make({}, live=True),
        "elsewhere": make({}),
    }


@pytest.mark.parametrize("delivered", [UNKNOWN_RUN_RETRIES, 12, 40])
async def test_a_message_for_a_run_whose_start_is_stored_comes_back_soon_where_its_agent_is_served(
    client: Client, intakes: dict[str, Intake], delivered: int
) -> None:
    run_id = await client.start("waits", None, run_id=f"pending-{delivered}")
    served, live, elsewhere = _Msg(delivered), _Msg(delivered), _Msg(delivered)
    await intakes["serves"]._not_yet(cast(Any, served), run_id)
    await intakes["live_elsewhere"]._not_yet(cast(Any, live), run_id)
    await intakes["elsewhere"]._not_yet(cast(Any, elsewhere), run_id)
    # Where the agent is served, here or by a live worker: a second or two, whatever the count.
    assert len(served.naks) == 1 and 1.0 <= served.naks[0] <= 2.0
    assert len(live.naks) == 1 and 1.0 <= live.naks[0] <= 2.0
    # Pending (no live worker of its agent): a second per delivery so far (at most 30), jitter.
    assert len(elsewhere.naks) == 1
    assert min(30.0, delivered) <= elsewhere.naks[0] <= min(30.0, delivered) + 1.0


async def test_a_message_for_a_run_never_started_is_refused_after_its_retries(
    client: Client, intakes: dict[str, Intake]
) -> None:
    await client._ensure()
    early = _Msg(UNKNOWN_RUN_RETRIES - 1)
    await intakes["serves"]._not_yet(cast(Any, early), "never-started")
    assert early.naks == [1.0]
    with pytest.raises(Rejected) as refused:
        await intakes["serves"]._not_yet(cast(Any, _Msg(UNKNOWN_RUN_RETRIES)), "never-started")
    assert refused.value.code == "unknown_run"
