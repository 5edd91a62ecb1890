"""Run a Worker for the agents of one module, in its own process (for crash tests).

Usage: python -m tests.apps.run_worker URL PREFIX MODULE [LEASE_TTL]
Prints "ready <pid>" once it takes work; runs until killed or SIGTERM.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys

from sojourn.actors import Agent, Worker
from sojourn.schemas.config import Settings


async def main() -> None:
    url, prefix, module = sys.argv[1:4]
    ttl = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    mod = importlib.import_module(module)
    agents = [v for v in vars(mod).values() if isinstance(v, Agent)]
    limit = int(os.environ.get("SOJOURN_TEST_CRASH_LOOP_LIMIT", "0"))
    # SOJOURN_TEST_DEAD_AFTER: how long a silent worker has before it counts as dead.
    dead_after = float(os.environ.get("SOJOURN_TEST_DEAD_AFTER", Settings().worker_dead_after))
    # SOJOURN_TEST_BEAT_INTERVAL: seconds between its heartbeats.
    beat = float(os.environ.get("SOJOURN_TEST_BEAT_INTERVAL", Settings().worker_beat_interval))
    settings = Settings(
        prefix=prefix,
        lease_ttl=ttl,
        crash_loop_limit=limit,
        worker_dead_after=dead_after,
        worker_beat_interval=beat,
    )
    concurrency = int(os.environ.get("SOJOURN_TEST_CONCURRENCY", "256"))
    worker = Worker(agents, nats=url, settings=settings, concurrency=concurrency)
    await worker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"ready {os.getpid()}", flush=True)
    await stop.wait()
    await worker.stop()


if __name__ == "__main__":
    asyncio.run(main())
