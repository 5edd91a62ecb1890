"""Agents that gather steps and children (``ctx.gather``), for tests that run them in a worker
process and kill it.

Each step appends ``<event> <step> <idempotency key> <attempt>`` lines to $SOJOURN_TEST_LOG
(when set), so a test can count how often each step body ran, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import msgspec

from sojourn.actors import Context, RetryPolicy, agent, current_step, step


def _log(event: str) -> None:
    path = os.environ.get("SOJOURN_TEST_LOG")
    if not path:
        return
    info = current_step()
    with open(path, "a") as f:
        f.write(f"{event} {info.name} {info.idempotency_key} {info.attempt}\n")
        f.flush()
        os.fsync(f.fileno())


class Naps(msgspec.Struct, frozen=True):
    seed: int
    n: int = 5
    low: float = 0.2
    high: float = 1.0


async def nap(i: int, seconds: float) -> int:
    """Sleeps ``seconds`` (async): several of these overlap in one gather."""
    _log("exec")
    await asyncio.sleep(seconds)
    _log("done")
    return i * 10


def durations(naps: Naps) -> list[float]:
    """Seeded, so the agent's code computes the same on every replay."""
    rng = random.Random(naps.seed)
    return [round(rng.uniform(naps.low, naps.high), 3) for _ in range(naps.n)]


@agent("gather_naps")
async def gather_naps(ctx: Context, naps: Naps) -> list[int]:
    """``n`` async steps of different lengths, gathered; then one more step after them."""
    got: list[int] = await ctx.gather(*(ctx.step(nap, i, s) for i, s in enumerate(durations(naps))))
    total = await ctx.step(nap, 99, 0.0)
    return [*got, total]


def double(x: int) -> int:
    return 2 * x


@agent("gkid")
async def gkid(ctx: Context, x: int) -> int:
    if x < 0:
        raise ValueError(f"gkid refuses {x}")
    return await ctx.step(double, x)


class Kids(msgspec.Struct, frozen=True):
    inputs: list[int]
    return_exceptions: bool = False


@agent("gather_kids")
async def gather_kids(ctx: Context, kids: Kids) -> list[Any]:
    """A child per input (negative ones fail), gathered with a step and an earlier handle."""
    early = await ctx.start_child("gkid", 100)
    got = await ctx.gather(
        *(ctx.child("gkid", x, type=int) for x in kids.inputs),
        ctx.step(double, 7),
        early.result(type=int),
        return_exceptions=kids.return_exceptions,
    )
    return [repr(g) if isinstance(g, BaseException) else g for g in got]


def first(x: int) -> int:
    return x + 1


def second(x: int) -> int:
    return x + 2


@agent("gather_two_calls")
async def gather_two_calls(ctx: Context, _: None) -> list[int]:
    """A branch that makes two journaled calls: refused with ``GatherError``."""

    async def both() -> int:
        a = await ctx.step(first, 1)
        return await ctx.step(second, a)

    got: list[int] = await ctx.gather(ctx.step(first, 0), both())
    return got


@step(retry=RetryPolicy(retry_on=(RuntimeError,), attempts=2, initial_interval=6.0, jitter=0))
async def later(i: int) -> int:
    """Fails its first attempt; the retry is due after 6 s, longer than a worker sleeps
    (``IN_PROCESS_BACKOFF``): the run parks on the broker's timer meanwhile."""
    _log("exec")
    if current_step().attempt == 1:
        raise RuntimeError("not yet")
    return i * 10


@agent("gather_backoff")
async def gather_backoff(ctx: Context, _: None) -> list[int]:
    """A branch that parks on a long backoff while the others run on."""
    got: list[int] = await ctx.gather(
        ctx.step(nap, 0, 0.5), ctx.step(later, 1), ctx.step(nap, 2, 1.0)
    )
    return got
