"""Agents that continue as new (tests/actors/agents/test_continue_as_new.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from sojourn.actors import Context, agent


class Talk(msgspec.Struct, frozen=True):
    gen: int = 1
    heard: tuple[str, ...] = ()
    until: int = 3


def note(heard: tuple[str, ...], said: str) -> tuple[str, ...]:
    return (*heard, said)


@agent("chat")
async def chat(ctx: Context, talk: Talk) -> list[str]:
    """One signal per generation: a conversation of ``until`` runs."""
    said = await ctx.wait_for("say", type=str)
    heard = await ctx.step(note, talk.heard, said)
    if talk.gen < talk.until:
        ctx.continue_as_new(Talk(gen=talk.gen + 1, heard=heard, until=talk.until))
    return list(heard)


def bump(n: int) -> int:
    return n + 1


@agent("looper")
async def looper(ctx: Context, n: int) -> int:
    """Continues as new until n reaches 3, then returns n * 10."""
    n = await ctx.step(bump, n)
    if n < 3:
        ctx.continue_as_new(n)
    return n * 10


@agent("chain_parent")
async def chain_parent(ctx: Context, _: Any) -> int:
    result: int = await ctx.child("looper", 0, type=int)
    return result


@agent("catcher")
async def catcher(ctx: Context, _: Any) -> str:
    """``except Exception`` cannot catch continue_as_new."""
    if ctx.run_id.endswith("-g2"):
        return "second"
    try:
        ctx.continue_as_new(None)
    except Exception:  # the point of the test: it cannot catch continue_as_new
        return "caught"
    return "fell through"
