"""Agents for keyed-start tests (decision 0047), run in worker processes and in-process."""

from __future__ import annotations

from sojourn.actors import Context, agent


@agent("gate")
async def gate(ctx: Context, tag: str) -> str:
    """Stays live until it gets the signal ``go``, then takes a step (where a paused run
    suspends): a singleton key's run to attach to."""
    await ctx.wait_for("go")

    def done() -> str:
        return tag

    return await ctx.step(done)


@agent("latest")
async def latest(ctx: Context, n: int) -> int:
    """A debounced run that gets the last input of its burst."""
    return n


@agent("batch")
async def batch(ctx: Context, ns: list[int]) -> list[int]:
    """A debounced run that gets every input of its burst (``debounce_inputs="all"``)."""
    return ns
