"""Agents with large values (tests/actors/history/test_value_refs.py, bench/values.py)."""

from __future__ import annotations

import hashlib
import random

import msgspec

from sojourn.actors import Context, agent


class Grow(msgspec.Struct, frozen=True):
    messages: int = 200
    """Messages in the first state."""
    size: int = 1000
    """Bytes of text per message."""
    steps: int = 20
    """Steps, each returning the state with one more small message."""
    wait: bool = False
    """Park on the signal ``go`` after the steps (so a later activation replays them)."""
    seed: int = 7


def seed_state(messages: int, size: int, seed: int) -> dict[str, object]:
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    return {
        "title": "a long conversation",
        "messages": [
            {"role": "user" if i % 2 else "assistant", "n": i,
             "text": "".join(rnd.choice(letters) for _ in range(size))}
            for i in range(messages)
        ],
    }  # fmt: skip


def add_message(state: dict[str, object], i: int) -> dict[str, object]:
    messages = list(state["messages"])  # type: ignore[call-overload]
    messages.append({"role": "user", "n": len(messages), "text": f"turn {i}: ok"})
    return {**state, "messages": messages}


def fingerprint(state: dict[str, object]) -> str:
    return hashlib.sha256(msgspec.json.encode(state)).hexdigest()


@agent("grow")
async def grow(ctx: Context, g: Grow) -> dict[str, object]:
    state = await ctx.step(seed_state, g.messages, g.size, g.seed)
    for i in range(g.steps):
        state = await ctx.step(add_message, state, i)
    if g.wait:
        await ctx.wait_for("go")
    return {"messages": len(state["messages"]), "sha": fingerprint(state)}  # type: ignore[arg-type]


def expected(g: Grow) -> dict[str, object]:
    state = seed_state(g.messages, g.size, g.seed)
    for i in range(g.steps):
        state = add_message(state, i)
    return {"messages": len(state["messages"]), "sha": fingerprint(state)}  # type: ignore[arg-type]


@agent("big_out")
async def big_out(ctx: Context, items: list[str]) -> list[str]:
    """A large continue_as_new input, then a large output (both by reference)."""
    if ctx.run_id.endswith("-g2"):
        return [*items, "last"]
    ctx.continue_as_new([*items, "more"])
