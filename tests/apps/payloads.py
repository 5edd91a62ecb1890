"""Agents that produce large values, for tests/actors/history/test_payload_limits.py.

Step executions are counted in a file (one line per execution) named by the agent's input, so
a test can tell how often a step body ran, across activations and replays.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import msgspec

from sojourn.actors import ChildRunError, Context, RetryPolicy, StepError, agent


class Spec(msgspec.Struct, frozen=True, kw_only=True):
    """What ``blob_step`` does: a step returning a JSON value of exactly ``size`` bytes."""

    size: int
    log: str
    catch: bool = False
    """Catch the ``StepError`` and wait for the signal ``go`` (which makes the run replay)."""
    pause: float = 0.0
    """Seconds to sleep (unjournaled) after the step, so its completion is flushed alone."""


def blob(size: int) -> str:
    """A string whose JSON encoding is exactly ``size`` bytes (the quotes included)."""
    return "x" * (size - 2)


def executions(log: str) -> int:
    """How many times a step logging to ``log`` ran."""
    try:
        with open(log) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _count(log: str) -> None:
    with open(log, "a") as f:
        f.write("exec\n")


def make_blob(size: int, log: str) -> str:
    _count(log)
    return blob(size)


async def _blob_body(ctx: Context, spec: Spec) -> dict[str, Any]:
    try:
        out = await ctx.step(make_blob, spec.size, spec.log)
    except StepError as e:
        if not spec.catch:
            raise
        got: dict[str, Any] = {"error_type": e.error_type, "message": e.message}
        await ctx.wait_for("go")
        return got
    if spec.pause:
        await asyncio.sleep(spec.pause)
    if spec.catch:
        await ctx.wait_for("go")
    return {"length": len(out)}


@agent("blob_step")
async def blob_step(ctx: Context, spec: Spec) -> dict[str, Any]:
    return await _blob_body(ctx, spec)


@agent("blob_step_retrying", retry=RetryPolicy(retry_on=(Exception,), initial_interval=0))
async def blob_step_retrying(ctx: Context, spec: Spec) -> dict[str, Any]:
    """Like ``blob_step``, with a policy that retries every exception."""
    return await _blob_body(ctx, spec)


@agent("blob_output")
async def blob_output(ctx: Context, size: int) -> str:
    """Returns a run output of exactly ``size`` bytes of JSON."""
    return blob(size)


class ParentSpec(msgspec.Struct, frozen=True, kw_only=True):
    size: int
    gate: bool = False
    """Wait for the signal ``go`` between starting the child and awaiting it, so that the
    child has ended when the parent evaluates its wait (read from the child's last event)."""


@agent("blob_parent")
async def blob_parent(ctx: Context, spec: ParentSpec) -> dict[str, Any]:
    handle = await ctx.start_child("blob_output", spec.size)
    if spec.gate:
        await ctx.wait_for("go")
    try:
        out = await handle.result(type=str)
    except ChildRunError as e:
        return {"status": e.status, "message": e.message}
    return {"status": "completed", "length": len(out)}


def total(lengths: list[int]) -> int:
    return sum(lengths)


@agent("many_signals")
async def many_signals(ctx: Context, n: int) -> int:
    """Takes ``n`` buffered ``data`` signals in a row (no append between them), then a step:
    one decision carrying all ``n`` payloads, larger than one message if they are big."""
    await ctx.wait_for("go")
    lengths: list[int] = []
    for _ in range(n):
        data = await ctx.wait_for("data", type=str)
        assert data is not None  # no timeout: the wait ends only with the signal
        lengths.append(len(data))
    result: int = await ctx.step(total, lengths)
    return result


GATE = threading.Event()
"""Released by the test: ``gated_blob`` returns only then."""


def gated_blob(size: int, log: str) -> str:
    _count(log)
    if not GATE.wait(60):
        raise TimeoutError("the test never opened the gate")
    return blob(size)


def small() -> int:
    return 1


@agent("gated")
async def gated(ctx: Context, spec: Spec) -> int:
    """A step whose result is flushed alone (the code pauses), then another step."""
    out = await ctx.step(gated_blob, spec.size, spec.log)
    await asyncio.sleep(spec.pause)
    return len(out) + await ctx.step(small)
