"""The agents the console tests drive: a refund that asks a model, waits for an approval and
pays; a slow step to be cut off by a SIGKILL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sojourn.actors import Context, agent, current_step
from sojourn.actors.llm import PriceTable, ScriptedModel

MODEL = ScriptedModel(
    lambda request: "Refund it: the parcel never arrived and the customer is in good standing.",
    name="scripted-large",
    prices=PriceTable({"scripted-large": (3000.0, 15000.0)}),
)
"""USD per million tokens high enough that a few words cost cents, so the cost shows."""


async def look_up(order: int) -> dict[str, int]:
    await asyncio.sleep(0.05)
    return {"order": order, "amount": 42}


async def pay(order: int) -> str:
    return f"paid {order}"


@agent("refunds")
async def refunds(ctx: Context, order: int) -> str:
    found = await ctx.step(look_up, order)
    advice = await ctx.llm(MODEL, f"Should order {found['order']} be refunded?", stream=True)
    decision = await ctx.approval("refund", approvers=["ada"], timeout=timedelta(hours=1))
    if not decision.approved:
        return f"refused: {advice.text[:20]}"
    return await ctx.step(pay, order)


async def prepare(n: int) -> int:
    return n + 1


async def crunch(n: int) -> int:
    """Hangs on its first attempt (the test SIGKILLs its worker meanwhile); quick after."""
    step = current_step()
    if step is not None and step.attempt == 1:
        await asyncio.sleep(120)
    return n * 2


@agent("crunching")
async def crunching(ctx: Context, n: int) -> int:
    m = await ctx.step(prepare, n)
    return await ctx.step(crunch, m)
