"""What-if experiments behind the suggestions in docs/benchmarks.md.

Run from the repository root::

    python -m bench.experiments            # ~1.2 min
    python -m bench.experiments --quick

Nothing in the runtime is edited: each variant is a ``Worker`` built through its public
constructor, or a subclass defined here, on its own deployment prefix of one embedded server.

- ``baseline``: ``Worker`` as shipped.
- ``no flush timer``: ``Worker(flush_delay=3600)``. The benchmark agent always has a next
  decision, so a step's completion never needs the timer; this isolates what the timer costs
  (see "flush timer" in docs/benchmarks.md). Not a fix by itself: a completion followed by a
  long wait would then stay unflushed.
- ``concurrent intake``: a ``Worker`` subclass whose intake handles the messages of one fetch
  concurrently (the shipped loop awaits them one by one).
- ``both``.

Plus an in-memory measurement of the executor's own Python cost per step (an ``Activation``
over a store whose ``append`` returns at once), for several run lengths, and how many
recorded decisions per second ``sojourn replay`` checks against those histories.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from sojourn.actors import Client, Worker
from sojourn.actors.core.replay import replay_run
from sojourn.actors.worker.activation import Activation
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.connection import PullConsumer
from sojourn.broker.eventstore import Decision
from sojourn.schemas.codec import encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import RunEvent, RunStarted

from .foundation import RESULT, RawBench, SojournBench, _sample_decision, chain, single
from .util import fmt_rate, fmt_us, median


class ConcurrentIntakeWorker(Worker):
    """The shipped worker, except that one fetch's intake messages are handled concurrently."""

    async def _intake_loop(self, sub: PullConsumer) -> None:
        async def one(m: Any) -> None:
            try:
                await self.intake.handle(m)
            except SojournError:
                await m.nak(delay=1.0)

        while not self._stopping.is_set():
            msgs = await sub.fetch(batch=64, timeout=1.0)
            if msgs:
                await asyncio.gather(*(one(m) for m in msgs))


class _InstantStore:
    """An event store whose appends succeed at once (encoding included, no broker). It keeps
    what was appended, for the replay measurement."""

    settings = Settings()
    max_decision = 1024 * 1024
    broker = None  # the benchmark agent ends without children or timers: no broker call
    names = None

    def __init__(self) -> None:
        self.seq = 1
        self.appends = 0
        self.events: list[RunEvent] = []

    async def append(
        self,
        run_id: str,
        events: list[RunEvent],
        *,
        expected_seq: int,
        writer: str,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        encode_events(events)
        self.events.extend(events)
        self.seq += 1
        self.appends += 1
        return self.seq


async def in_memory_run(n: int) -> tuple[float, list[RunEvent]]:
    """Seconds of executor + context + machine + fold work per step with no broker at all,
    and the history the run wrote."""
    store = _InstantStore()
    started = RunStarted(run_id="r", agent="chain", input=to_raw(n), at=time.time())
    history = [Decision(seq=1, events=(started,), writer="i", msg_id="m")]
    act = Activation(
        agent=chain,
        run_id="r",
        store=store,  # type: ignore[arg-type]
        history=history,
        writer="w",
    )
    t0 = time.perf_counter()
    outcome = await act.run()
    assert outcome == "completed", outcome
    return (time.perf_counter() - t0) / n, [started, *store.events]


async def in_memory_step_cost(n: int) -> float:
    return (await in_memory_run(n))[0]


def replay_rate(events: list[RunEvent]) -> float:
    """Recorded decisions per second that ``sojourn replay`` checks (fold included)."""
    t0 = time.perf_counter()
    result = replay_run(chain, events)
    elapsed = time.perf_counter() - t0
    assert result.ok and result.checked > 0, result.describe()
    return result.checked / elapsed


VARIANTS: list[tuple[str, type[Worker], dict[str, Any]]] = [
    ("baseline", Worker, {}),
    ("no flush timer (flush_delay=3600)", Worker, {"flush_delay": 3600.0}),
    ("concurrent intake", ConcurrentIntakeWorker, {}),
    ("both", ConcurrentIntakeWorker, {"flush_delay": 3600.0}),
]


async def amain(a: argparse.Namespace) -> None:
    steps, runs, m, reps = (500, 200, 10, 1) if a.quick else (2000, 200, 50, 2)
    print("## In-memory executor cost per step (no broker)\n")
    print("| steps in the run | µs per step |\n|---|---|")
    histories: dict[int, list[RunEvent]] = {}
    for n in (100, 1000, 2000, 10000):
        await in_memory_step_cost(n)
        samples = [await in_memory_run(n) for _ in range(3)]
        histories[n] = samples[0][1]
        print(f"| {n} | {median([cost for cost, _ in samples]) * 1e6:.1f} |")
    print("\n## `sojourn replay`: recorded decisions checked per second (offline)\n")
    print("| steps in the history | decisions/s |\n|---|---|")
    for n, events in histories.items():
        replay_rate(events)
        print(f"| {n} | {median([replay_rate(events) for _ in range(5)]):,.0f} |")
    with tempfile.TemporaryDirectory(prefix="sojourn-exp-") as tmp:
        async with EmbeddedServer(store_dir=tmp, port=0, sync_interval=a.sync_interval) as srv:
            rb = await Broker.connect(srv.url, name="exp-raw")
            raw = RawBench(
                rb, f"raw{uuid.uuid4().hex[:6]}", _sample_decision(RESULT), lambda: srv.pid
            )
            await raw.setup(Settings())
            await raw.sequential(300)
            raw_seq = [await raw.sequential(steps) for _ in range(reps)]
            raw_conc = [await raw.concurrent(runs, m) for _ in range(reps)]
            p50 = median([r["p50"] for r in raw_seq])
            craw = median([r["rate"] for r in raw_conc])
            print(
                f"\n## Variants (sync_interval: {a.sync_interval}; raw CAS append p50 "
                f"{fmt_us(p50)}; raw {runs}-subject concurrent {fmt_rate(craw, 'appends')})\n"
            )
            print(
                f"| variant | sequential per step (N={steps}) | ratio to raw p50 | appends/step "
                f"| {runs}x{m} aggregate | ratio to raw | appends/step | last RunStarted "
                "after the burst |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for name, cls, kw in VARIANTS:
                tag = uuid.uuid4().hex[:6]
                settings = Settings(prefix=f"exp{tag}")
                w = cls([chain, single], nats=srv.url, settings=settings, **kw)
                await w.start()
                c = await Client.connect(srv.url, settings=settings)
                sb = SojournBench(w, c, lambda: srv.pid, tag)
                try:
                    await sb.sequential(200)
                    await sb.concurrent(50, 5)
                    seq = [await sb.sequential(steps) for _ in range(reps)]
                    conc = [await sb.concurrent(runs, m) for _ in range(reps)]
                finally:
                    await c.close()
                    await w.stop()
                ps = median([r["per_step"] for r in seq])
                cr = median([r["rate"] for r in conc])
                print(
                    f"| {name} | {fmt_us(ps)} | {ps / p50:.2f}x "
                    f"| {median([r['appends_per_step'] for r in seq]):.3f} "
                    f"| {fmt_rate(cr, 'steps')} | {cr / craw:.2f}x "
                    f"| {median([r['appends_per_step'] for r in conc]):.3f} "
                    f"| {statistics.median([r['last_started'] for r in conc]) * 1e3:,.0f} ms |",
                    flush=True,
                )
            await rb.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.experiments")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sync-interval", default="always")
    a = p.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(amain(a))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(amain(a))


if __name__ == "__main__":
    main(sys.argv[1:])
