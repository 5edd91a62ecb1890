"""Agents the gateway tests drive over HTTP (tests/actors/gateway)."""

from __future__ import annotations

from typing import Any

from sojourn.actors import Context, agent


@agent("echo-wait")
async def echo_wait(ctx: Context, value: Any) -> dict[str, Any]:
    """Waits for the signal ``go``; returns its input and the signal's payload."""
    got = await ctx.wait_for("go")
    return {"input": value, "go": got}


@agent("callback-wait")
async def callback_wait(ctx: Context, ttl: float) -> dict[str, Any]:
    """Issues a callback token for ``docs.signed`` (a test reads it from the history), waits
    for the signal, then briefly for a second one, which a repeated callback must never
    deliver."""
    ctx.callback("docs.signed", ttl=ttl)
    first = await ctx.wait_for("docs.signed")
    second = await ctx.wait_for("docs.signed", timeout=2.0)
    return {"first": first, "second": second}


@agent("chunky")
async def chunky(ctx: Context, n: int) -> int:
    """Streams ``n`` text chunks, waits for ``finish``, streams ``n`` more."""

    async def part(prefix: str) -> None:
        for i in range(n):
            await ctx.stream(f"{prefix}{i} ")

    await ctx.step(part, "a")
    await ctx.wait_for("finish")
    await ctx.step(part, "b")
    return 2 * n
