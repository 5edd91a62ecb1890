"""The agent of the shared-rate-limit tests (decision 0046): one step under the limit ``api``
that plays a provider. Every call it answers is a line ``<run> <ok|429> <unix time>`` in the
file the test owns (``$SOJOURN_TEST_EFFECTS``); while the time in ``$SOJOURN_TEST_429_UNTIL``
(a file the test may write) lies ahead, it answers 429 with ``Retry-After`` up to then.
The limit's rate is ``$SOJOURN_TEST_LIMIT`` (default 600/min)."""

from __future__ import annotations

import os
import time

from sojourn.actors import Context, Limit, agent, step
from sojourn.schemas.errors import RateLimited


def _answer(run_id: str, outcome: str) -> None:
    with open(os.environ["SOJOURN_TEST_EFFECTS"], "a") as f:
        f.write(f"{run_id} {outcome} {time.time():.6f}\n")


def _blocked_until() -> float:
    path = os.environ.get("SOJOURN_TEST_429_UNTIL", "")
    try:
        with open(path) as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0


@step(limit="api")
async def provider(run_id: str) -> str:
    until = _blocked_until()
    now = time.time()
    if now < until:
        _answer(run_id, "429")
        raise RateLimited("too many requests", retry_after=until - now)
    _answer(run_id, "ok")
    return "ok"


@agent("limited", limits={"api": Limit(requests=os.environ.get("SOJOURN_TEST_LIMIT", "600/min"))})
async def limited(ctx: Context) -> str:
    return await ctx.step(provider, ctx.run_id)
