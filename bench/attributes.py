"""Search attributes benchmark (issue 31): a filtered listing by attribute and status from the
SQLite read model.

Run from the repository root::

    python -m bench.attributes              # 10,000 runs, 500 listings per query
    python -m bench.attributes --runs 100000

An ``SqliteModel`` is filled directly (``apply``, batches of 1,000, the projector's page) with
N runs' views: 10 agents, statuses spread over the vocabulary, update times over 7 days, each
run with four attributes, ``customer`` (one of N/100 values: ~100 runs each), ``tier`` (one
of 3), ``region`` (one of 8) and ``vip`` (a boolean, 1 in 10). Then ``SqliteModel.query`` (the
listing service's call, limit 50, the CLI's default) is timed for: a selective attribute and a
status (``customer`` + ``waiting``), a broad attribute and a status (``tier`` + ``waiting``:
a third of the runs), two attributes (``region`` + ``vip``), and no filter, against the same
status-only listing. p50/p99 over the repetitions, milliseconds.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from sojourn.projections.sink import Applied
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.events import RunStarted
from sojourn.schemas.views import RunsQuery, RunView
from sojourn.schemas.vocabulary import RUN_STATUSES

_TIERS = ("gold", "silver", "bronze")
_REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "ap-south", "ap-east", "sa-east", "af")


def _views(n: int, now: float) -> list[RunView]:
    rng = random.Random(31)
    customers = max(1, n // 100)
    statuses = [s for s in RUN_STATUSES if s != "new"]
    views = []
    for i in range(n):
        updated = now - rng.uniform(0, 7 * 86_400)
        views.append(
            RunView(
                run_id=f"run-{i:07d}",
                agent=f"agent-{i % 10}",
                status=statuses[i % len(statuses)],  # type: ignore[arg-type]
                started_at=updated - 60,
                updated_at=updated,
                last_seq=i + 1,
                attributes={
                    "customer": f"c{rng.randrange(customers)}",
                    "tier": _TIERS[rng.randrange(3)],
                    "region": _REGIONS[rng.randrange(8)],
                    "vip": rng.random() < 0.1,
                },
            )
        )
    return views


async def _time(model: SqliteModel, q: RunsQuery, reps: int) -> tuple[float, float, int]:
    for _ in range(20):  # warm the caches
        await model.query(q)
    samples = []
    found = 0
    for _ in range(reps):
        t = time.perf_counter()
        page = await model.query(q)
        samples.append((time.perf_counter() - t) * 1000)
        found = len(page.runs)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], found


async def main(runs: int, reps: int) -> None:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model = await SqliteModel.open(Path(tmp) / "model.db", events_stream="BENCH_EVENTS")
        try:
            views = _views(runs, now)
            t = time.perf_counter()
            for start in range(0, len(views), 1000):
                batch = [
                    Applied(seq=v.last_seq, view=v, events=(_started(v),))
                    for v in views[start : start + 1000]
                ]
                await model.apply(batch)
            fill = time.perf_counter() - t
            sample = views[0].attributes
            queries = {
                "status `waiting` (no attribute)": RunsQuery(status=("waiting",), limit=50),
                "`customer` + status `waiting`": RunsQuery(
                    status=("waiting",), attributes={"customer": str(sample["customer"])}, limit=50
                ),
                "`tier` + status `waiting`": RunsQuery(
                    status=("waiting",), attributes={"tier": "gold"}, limit=50
                ),
                "`region` + `vip`": RunsQuery(
                    attributes={"region": "eu-west", "vip": "true"}, limit=50
                ),
                "`customer` alone": RunsQuery(
                    attributes={"customer": str(sample["customer"])}, limit=50
                ),
                "no filter": RunsQuery(limit=50),
            }
            print(f"## Search attributes ({runs:,} runs, {reps} listings each, limit 50)\n")
            print(f"Filled in {fill:.1f} s ({runs / fill:,.0f} views/s with 4 attributes).\n")
            print("| listing | runs found | p50 ms | p99 ms | plan |")
            print("|---|---|---|---|---|")
            for name, q in queries.items():
                p50, p99, found = await _time(model, q, reps)
                plan = "; ".join(await model.explain(q))
                print(f"| {name} | {found} | {p50:.2f} | {p99:.2f} | {plan[:90]} |")
        finally:
            await model.close()


def _started(v: RunView) -> RunStarted:
    return RunStarted(run_id=v.run_id, agent=v.agent, input=b"null", attributes=v.attributes)  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.reps))
