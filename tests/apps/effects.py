"""Agents whose steps leave countable traces in a log file (path from $SOJOURN_TEST_LOG).

Each step appends ``<event> <step> <idempotency key> <attempt>`` lines, so a test can count how
often each step body ran and with which key, across processes and crashes.
"""

from __future__ import annotations

import os
import time

from sojourn.actors import Context, agent, current_step


def _log(event: str) -> None:
    info = current_step()
    with open(os.environ["SOJOURN_TEST_LOG"], "a") as f:
        f.write(f"{event} {info.name} {info.idempotency_key} {info.attempt}\n")
        f.flush()
        os.fsync(f.fileno())


def quick(n: int) -> int:
    _log("exec")
    return n * 10


def slow(n: int) -> int:
    """Announces itself, then takes a while: the window in which tests kill the worker."""
    _log("exec")
    deadline = time.monotonic() + float(os.environ.get("SOJOURN_SLOW_STEP", "3"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _log("done")
    return n * 10


@agent("pipeline")
async def pipeline(ctx: Context, steps: int) -> list[int]:
    """``steps`` steps; the one at position 2 is slow."""
    out = []
    for i in range(steps):
        fn = slow if i == 2 else quick
        out.append(await ctx.step(fn, i))
    return out
