"""Mixed-fleet benchmark: a start's wait for its run when each worker serves one agent.

Run from the repository root::

    python -m bench.mixed_fleet               # ~10 s
    python -m bench.mixed_fleet --runs 200

Two workers in this process on a fresh embedded nats-server, one serving agent ``alpha``, one
``beta``. Every intake pulls from the same inbox consumer, and the server hands a message to
the oldest pull request waiting, so a start of ``alpha`` may reach the ``beta`` worker, which
hands it back for a worker that serves its agent (``Starts.hand_back``). ``--runs`` 1-step runs
of ``alpha`` are started one after another (``--gap`` seconds apart, untimed), each waited for;
the figure is ``client.start`` called -> ``RunStarted.at`` (the intake that created the run).
It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted

from .util import ROOT, fmt_ms, git_state, pct, run_bench


def _one() -> int:
    return 1


@agent("alpha")
async def alpha(ctx: Context) -> int:
    return await ctx.step(_one)


@agent("beta")
async def beta(ctx: Context) -> int:
    return await ctx.step(_one)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as store:
        server = EmbeddedServer(store_dir=store)
        await server.start()
        settings = Settings(prefix="mixed")
        workers = [
            await Worker([a], nats=server.url, settings=settings).start() for a in (alpha, beta)
        ]
        client = await Client.connect(server.url, settings=settings)
        waits: list[float] = []
        try:
            for i in range(args.runs):
                await asyncio.sleep(args.gap)
                t0 = time.time()
                run_id = await client.start("alpha", None, run_id=f"a{i}")
                await client.result(run_id, timeout=60)
                history = await client.history(run_id)
                started = next(e for d in history for e in d.events if isinstance(e, RunStarted))
                waits.append(started.at - t0)
        finally:
            await client.close()
            for w in workers:
                await w.stop()
            await server.stop()
    over = sum(1 for w in waits if w > 0.5)
    out = {
        "p50": pct(waits, 50),
        "p90": pct(waits, 90),
        "p99": pct(waits, 99),
        "max": max(waits),
        "over_half_second": over,
        "runs": len(waits),
    }
    print(f"sojourn {git_state(ROOT)}: two workers, one agent each; {len(waits)} runs of one\n")
    print("| start -> RunStarted | p50 | p90 | p99 | max | over 0.5 s |")
    print("|---|---|---|---|---|---|")
    print(
        f"| agent `alpha` | {fmt_ms(out['p50'])} | {fmt_ms(out['p90'])} | {fmt_ms(out['p99'])} "
        f"| {fmt_ms(out['max'])} | {over} of {len(waits)} |"
    )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.02, help="untimed pause between runs (s)")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args()
    run_bench(main(ns), ns.json)
