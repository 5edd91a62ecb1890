"""Shared rate limits benchmark (decision 0046, issue 30).

Run from the repository root::

    python -m bench.limits                  # ~1 min
    python -m bench.limits --steps 500 --repeats 5 --seconds 10

Two figures, each against a floor measured in the same run on the same embedded nats-server:

1. **Per-step cost of a limited step**, paired: one run of N trivial steps with no limit, then
   one of N steps under a limit whose rate never makes them wait (10^9/s: the slot is always
   now), interleaved ``--repeats`` times in one worker in this process. Per-step time is
   (``RunCompleted.at`` - first ``StepStarted.at``) / N from the recorded stamps; the ratio is
   taken per repeat. What a limited step adds is its reservation: one compare-and-set of the
   limit's record before the attempt.
2. **Grant throughput of one limit under 3 workers**: three processes, each with its own
   connection and ``SharedLimits``, reserve slots of one limit (10^9/s) from 256 concurrent
   tasks for ``--seconds``; grants/s summed, with the compare-and-set writes and conflicts
   behind them. The floor: one process writing the same record by compare-and-set as fast as
   it can, one write at a time (raw ``Broker.publish`` with the fence header), for as long.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Context, Limit, Worker, agent, step
from sojourn.broker import Broker, EmbeddedServer, ensure_topology
from sojourn.broker.names import Names
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunCompleted, StepStarted

from .util import fmt_us, run_bench

FAST = Limit(requests="1000000000/s")


async def _noop(n: int) -> int:
    return n


@step(limit="bench")
async def _limited(n: int) -> int:
    return n


@agent("free")
async def free(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step(_noop, i)
    return n


@agent("limited", limits={"bench": FAST})
async def limited(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step(_limited, i)
    return n


async def _per_step(client: Client, agent_name: str, n: int, run_id: str) -> float:
    await client.start(agent_name, n, run_id=run_id)
    await client.result(run_id, timeout=300)
    events = [e for d in await client.history(run_id) for e in d.events]
    first = next(e.at for e in events if isinstance(e, StepStarted))
    end = next(e.at for e in events if isinstance(e, RunCompleted))
    return (end - first) / n


async def paired(url: str, settings: Settings, steps: int, repeats: int) -> dict[str, Any]:
    async with Worker([free, limited], nats=url, settings=settings):
        client = await Client.connect(url, settings=settings)
        try:
            await _per_step(client, "free", 20, "warm-free")
            await _per_step(client, "limited", 20, "warm-limited")
            rows = []
            for r in range(repeats):
                a = await _per_step(client, "free", steps, f"free-{r}")
                b = await _per_step(client, "limited", steps, f"limited-{r}")
                rows.append((a, b, b / a))
        finally:
            await client.close()
    return {
        "unlimited_s": statistics.median(r[0] for r in rows),
        "limited_s": statistics.median(r[1] for r in rows),
        "ratio": statistics.median(r[2] for r in rows),
        "ratios": [r[2] for r in rows],
    }


async def _grant_worker(url: str, prefix: str, seconds: float, tasks: int) -> None:
    """One of the three processes: reserve slots as fast as ``tasks`` tasks can, then print
    ``grants writes conflicts``."""
    from sojourn.actors.ops import metrics
    from sojourn.actors.worker.clock import Clock
    from sojourn.actors.worker.limits import SharedLimits

    broker = await Broker.connect(url)
    names = Names(prefix)
    limits = SharedLimits(broker, names, f"bench-{id(broker)}", Clock(), {"bench": FAST})
    await limits.start()
    grants = 0
    end = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal grants
        while time.monotonic() < end:
            await limits.reserve("bench")
            grants += 1

    await asyncio.gather(*(loop() for _ in range(tasks)))
    conflicts = metrics.LIMIT_CONFLICTS.labels("bench")._value.get()
    await limits.stop()
    await broker.close()
    print(f"{grants} {int(conflicts)}", flush=True)


async def _cas_floor(url: str, names: Names, seconds: float) -> float:
    """Sequential compare-and-set writes of one record: writes/s."""
    from sojourn.broker.limits import LimitStore
    from sojourn.schemas.limits import LimitRecord

    broker = await Broker.connect(url)
    store = LimitStore(broker, names)
    rec = LimitRecord(name="floor", limit=FAST)
    seq, n = await store.put(rec, 0), 0
    end = time.monotonic() + seconds
    t0 = time.monotonic()
    while time.monotonic() < end:
        seq = await store.put(rec, seq)
        n += 1
    elapsed = time.monotonic() - t0
    await broker.close()
    return n / elapsed


async def grants(url: str, settings: Settings, seconds: float) -> dict[str, Any]:
    names = Names(settings.prefix)
    floor = await _cas_floor(url, names, seconds)
    cmd = [sys.executable, "-m", "bench.limits", "--grant-worker", url, settings.prefix]
    procs = [
        await asyncio.create_subprocess_exec(*cmd, str(seconds), stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    outs = [await p.communicate() for p in procs]
    total, conflicts = 0, 0
    for out, _ in outs:
        g, c = (int(x) for x in out.decode().split())
        total += g
        conflicts += c
    return {
        "grants_per_s": total / seconds,
        "conflicts": conflicts,
        "cas_floor_per_s": floor,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedServer(store_dir=Path(tmp), port=0) as server:
            settings = Settings(prefix="benchlim")
            broker = await Broker.connect(server.url)
            await ensure_topology(broker, Names(settings.prefix), settings)
            await broker.close()
            pair = await paired(server.url, settings, args.steps, args.repeats)
            grant = await grants(server.url, settings, args.seconds)
    print("| figure | value |")
    print("|---|---|")
    print(
        f"| sequential step, no limit (median of {args.repeats}) | {fmt_us(pair['unlimited_s'])} |"
    )
    print(f"| sequential step under a limit that never waits | {fmt_us(pair['limited_s'])} |")
    ratios = ", ".join(f"{r:.2f}" for r in pair["ratios"])
    print(f"| limited / unlimited, per repeat (median) | {pair['ratio']:.2f}x ({ratios}) |")
    print(
        f"| grants/s of one limit, 3 worker processes x 256 tasks | {grant['grants_per_s']:,.0f} |"
    )
    print(f"| compare-and-set conflicts behind them | {grant['conflicts']:,} |")
    floor = grant["cas_floor_per_s"]
    print(f"| floor: sequential CAS writes/s of one record, one process | {floor:,.0f} |")
    return {"paired": pair, "grants": grant}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--grant-worker":
        url, prefix, secs = sys.argv[2], sys.argv[3], float(sys.argv[4])
        run_bench(_grant_worker(url, prefix, secs, 256), None)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", default=None)
    ns = parser.parse_args()
    run_bench(main(ns), ns.json)
