"""Agents for tests/actors/cli/test_cli.py (``sojourn worker --app tests.apps.cli_agents``)."""

from __future__ import annotations

import asyncio

import msgspec

from sojourn.actors import Context, agent


class EchoIn(msgspec.Struct, frozen=True):
    text: str


def shout(text: str) -> str:
    return text.upper()


async def tick(i: int) -> int:
    await asyncio.sleep(0.1)
    return i


def explode() -> str:
    raise ValueError("boom")


@agent("cli_echo")
async def cli_echo(ctx: Context, req: EchoIn) -> dict[str, str]:
    loud = await ctx.step(shout, req.text)
    return {"echo": req.text, "loud": loud}


@agent("cli_slow")
async def cli_slow(ctx: Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(tick, i)
    return total


@agent("cli_fail")
async def cli_fail(ctx: Context) -> str:
    return await ctx.step(explode)
