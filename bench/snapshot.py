"""Snapshot benchmark: a watchdog's start-up (connect to first ``caught_up``) with and without
the run model's snapshot.

Run from the repository root::

    python -m bench.snapshot             # ~2-3 min: 200,000 decisions (20,000 live runs)
    python -m bench.snapshot --quick     # ~30 s: 20,000 decisions (2,000 live runs)

It starts its own ``EmbeddedServer`` (free port, temp dir, ``sync_interval: always``). The events
stream of a fresh prefix is filled directly, with no worker, as ``bench.liveness`` fills it
(``fill``: live runs parked on a sleep or a signal, ended runs completed, two CAS appends each,
interleaved at random). A ``Projector`` (no SQLite model) then folds everything, writes every
view as leader, and at its graceful stop stores a snapshot at the last sequence. Then ``--after``
more runs are written (two decisions each): what a starting watchdog reads past the snapshot.
Finally, ``--repeats`` times interleaved, a ``Watchdog`` is opened (connect, topology check,
snapshot read and restore, or none) and its model refreshed until caught up, with
``from_snapshot=False`` (the whole stream from sequence 1) and ``True``. Reported: the median
wall time of each, the decisions each read, the snapshot's size, and the time to encode and
store it (``write_snapshot``) and to read and decode it (``read_snapshot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.liveness import fill
from sojourn.actors.ops.watchdog import Watchdog
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.topology import ensure_topology
from sojourn.projections.model import read_snapshot, write_snapshot
from sojourn.projections.projector import Projector
from sojourn.schemas.config import Settings


async def start_up(url: str, settings: Settings, from_snapshot: bool) -> dict[str, float]:
    """One watchdog start: open, then refresh until caught up (nothing is judged)."""
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    wd = Watchdog(nats=url, settings=settings, from_snapshot=from_snapshot)
    await wd._open()
    try:
        while not await wd.model.refresh():
            pass
        return {
            "seconds": time.perf_counter() - t0,
            "cpu": time.process_time() - cpu0,
            "read": wd.model.decisions_read,
            "restored_from": wd.model.restored_from,
            "live": len(wd.model.runs),
        }
    finally:
        assert wd._broker is not None
        await wd._broker.close()


async def run(url: str, live: int, ended: int, after: int, repeats: int) -> dict[str, Any]:
    settings = Settings(prefix=f"sn{uuid.uuid4().hex[:8]}")
    names = Names(settings.prefix)
    broker = await Broker.connect(url, name="bench-snapshot")
    try:
        await ensure_topology(broker, names, settings, consumers=False)
        filled = await fill(broker, names, live, ended)
        print(f"filled {filled['messages']:,} decisions in {filled['elapsed']:.1f} s", flush=True)
        t0 = time.perf_counter()
        async with Projector(broker=broker, settings=settings, snapshot_every=3600) as p:
            while not (p.leading and p.written >= filled["messages"]):
                await p.wait_scanned()
        projected = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = await read_snapshot(broker, names)
        read_s = time.perf_counter() - t0
        assert snap is not None, "the projector stored no snapshot"
        t0 = time.perf_counter()
        size = await write_snapshot(broker, names, snap)
        write_s = time.perf_counter() - t0
        print(f"snapshot at {snap.position:,}: {size:,} bytes", flush=True)
        more = await fill(broker, names, after // 2, after - after // 2)
        rounds: dict[str, list[dict[str, float]]] = {"from 1": [], "snapshot": []}
        for _ in range(repeats):
            rounds["from 1"].append(await start_up(url, settings, False))
            rounds["snapshot"].append(await start_up(url, settings, True))
        out: dict[str, Any] = {
            "decisions": filled["messages"] + more["messages"],
            "snapshot_position": snap.position,
            "snapshot_bytes": size,
            "snapshot_live_runs": len(snap.runs),
            "projector_fold_and_write_s": round(projected, 2),
            "write_snapshot_s": round(write_s, 3),
            "read_snapshot_s": round(read_s, 3),
        }
        for name, rs in rounds.items():
            out[name] = {
                "median_s": round(statistics.median(r["seconds"] for r in rs), 3),
                "all_s": [round(r["seconds"], 3) for r in rs],
                "cpu_s": round(statistics.median(r["cpu"] for r in rs), 3),
                "decisions_read": rs[0]["read"],
                "live_runs": rs[0]["live"],
            }
        return out
    finally:
        await broker.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.snapshot", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a tenth of the size")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    scale = 10 if args.quick else 1
    live, ended, after = 20_000 // scale, 80_000 // scale, 2_000 // scale

    async def go() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            async with EmbeddedServer(store_dir=Path(tmp) / "nats", port=0) as server:
                return await run(server.url, live, ended, after, args.repeats)

    result = asyncio.run(go())
    result["uptime"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
