"""``python -m bench.pull``: how long a message waits between its publish and the consumer
loop that takes it, on an idle consumer, for three ways of fetching.

One stream, three durable pull consumers on it, each with a loop that fetches
``timeout=1.0`` over and over (what the intake, the wake loops and the scheduler do); every
message published reaches all three, so each sample is paired:

- **sojourn**: ``Broker.pull(...).fetch(batch=64, timeout=1.0)`` (``broker/pull.py``);
- **nats-py batch 64**: nats-py's ``pull_subscribe_bind(...).fetch(batch=64, timeout=1.0)``,
  which sojourn used before ``broker/pull.py``;
- **nats-py batch 1**: the same with ``batch=1``: one lingering request at a time, the raw
  floor.

Messages are published one at a time, at random gaps (uniform 0 to 1.2 s, seeded), so that
they land at every phase of the loops' one-second requests, including their ends. Latency is
the moment the loop has the message minus the moment before the publish.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import nats.errors

from bench.util import fmt_ms, git_state, machine_facts, pct, run_bench
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.server import find_nats_server

ROOT = Path(__file__).resolve().parent.parent
STREAM = "PULLBENCH"
VARIANTS = ("sojourn", "nats-py batch 64", "nats-py batch 1")


async def _loop_sojourn(broker: Broker, sent: dict[bytes, float], out: list[float], n: int) -> None:
    pc = await broker.pull(STREAM, "sojourn")
    try:
        while len(out) < n:
            for d in await pc.fetch(batch=64, timeout=1.0):
                out.append(time.perf_counter() - sent[d.data])
                await d.ack()
    finally:
        await pc.close()


async def _loop_nats_py(
    nc: Any, consumer: str, batch: int, sent: dict[bytes, float], out: list[float], n: int
) -> None:
    sub = await nc.jetstream().pull_subscribe_bind(durable=consumer, stream=STREAM)
    while len(out) < n:
        try:
            msgs = await sub.fetch(batch=batch, timeout=1.0)
        except (nats.errors.TimeoutError, TimeoutError):
            continue
        for m in msgs:
            out.append(time.perf_counter() - sent[m.data])
            await m.ack()


async def measure(n: int, seed: int, gap: float) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        async with EmbeddedServer(port=0, store_dir=d) as srv:
            broker = await Broker.connect(srv.url)
            nc = await nats.connect(srv.url)
            await broker.ensure_stream({"name": STREAM, "subjects": ["pb.>"]})
            for consumer in ("sojourn", "batch64", "batch1"):
                await broker.ensure_consumer(
                    STREAM, {"durable_name": consumer, "ack_policy": "explicit"}
                )
            sent: dict[bytes, float] = {}
            lat: dict[str, list[float]] = {v: [] for v in VARIANTS}
            loops = [
                asyncio.create_task(_loop_sojourn(broker, sent, lat["sojourn"], n)),
                asyncio.create_task(
                    _loop_nats_py(nc, "batch64", 64, sent, lat["nats-py batch 64"], n)
                ),
                asyncio.create_task(
                    _loop_nats_py(nc, "batch1", 1, sent, lat["nats-py batch 1"], n)
                ),
            ]
            await asyncio.sleep(1.5)  # every loop in its fetch cycle
            for i in range(n):
                await asyncio.sleep(rng.uniform(0.0, gap))
                key = str(i).encode()
                sent[key] = time.perf_counter()
                await broker.publish(f"pb.{i}", key)
            await asyncio.wait_for(asyncio.gather(*loops), 60)
            await nc.close()
            await broker.close()
            facts = machine_facts(find_nats_server(), Path(d))
    return {"n": n, "seed": seed, "gap": gap, "latency": lat, "machine": facts}


def report(out: dict[str, Any]) -> dict[str, Any]:
    lat: dict[str, list[float]] = out["latency"]
    floor = lat["nats-py batch 1"]
    print(f"\n### Publish -> in the consumer loop's hands, idle consumer ({out['n']} messages)\n")
    print("| fetch | p50 | p90 | p99 | max | over 100 ms | p50 / floor | p99 / floor |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for v in VARIANTS:
        xs = lat[v]
        slow = sum(1 for x in xs if x > 0.1)
        row = {q: pct(xs, q) for q in (50, 90, 99)} | {"max": max(xs), "slow": slow}
        summary[v] = row
        print(
            f"| {v} | {fmt_ms(row[50])} | {fmt_ms(row[90])} | {fmt_ms(row[99])} "
            f"| {fmt_ms(row['max'])} | {slow} | {row[50] / pct(floor, 50):.2f}x "
            f"| {row[99] / pct(floor, 99):.2f}x |"
        )
    print(f"\nsojourn at {git_state(ROOT)}; seed {out['seed']}, gaps uniform 0-{out['gap']} s")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pull", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=300, help="messages (default 300, ~3 min)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--gap", type=float, default=1.2, help="largest random gap, s (1.2)")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args()

    async def run() -> dict[str, Any]:
        out = await measure(args.messages, args.seed, args.gap)
        out["summary"] = report(out)
        return out

    run_bench(run(), args.json)


if __name__ == "__main__":
    main()
