"""Two variants of the code, 1-step runs alternating between them in one process.

Run from the repository root::

    python -m bench.paired bench/variants/busy_prepare.py            # ~20 s
    python -m bench.paired bench/variants/busy_screen.py --runs 600
    python -m bench.paired bench/variants/busy_step.py --steps 100 --runs 200  # sequential, ~30 s

Runs measured apart (``bench.foundation`` at one commit, then at another) differ by more than
most changes to the hot path make: on a shared 2-core VM the same code's 1-step run moves by
0.3 ms between runs minutes apart. Here both variants run in one process, against one embedded
nats-server, each 1-step run of one variant followed by one of the other (the order swapped
every pair), so the machine's drift falls on both alike.

A variants module is a Python file with a function ``toggle(side)``, called with ``"A"`` or
``"B"`` before each run: it puts that variant's code in place (typically by setting a class's
method to one of two functions), and ``DESCRIPTION``, a line saying what A and B are. The
layout is ``bench.foundation``'s 1-step measurement: worker, client and an observer in one
process; the client calls ``Client.start`` then ``Client.result`` for the ``single`` agent,
``--gap`` seconds apart (untimed). With ``--steps N`` the runs are ``bench.foundation``'s
sequential ``chain`` of N steps instead, and the figure is its per-step time (the first
``StepStarted`` to ``RunCompleted``, from the stored history, divided by N). Its noise here,
A and B the same code: about ±5-13 µs with 200 chains of 100 steps, ±35 µs with 40 of 200 (a
chain's figure drifts with the machine; many short chains average it out).

Prints, per variant (1-step runs), the p50 of **publish -> ``RunCompleted`` seen** (an observer's
subscription, the figure ``bench.foundation`` judges against its inbox floor) and of
**``start`` -> ``result`` returned**, and the median of the pairs' differences, A - B (the
first 50 runs of each are left out).

A probe, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from sojourn.actors import Client, Worker
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.delivery import Delivery
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunCompleted, StepStarted

from .foundation import chain, single
from .util import ROOT, git_state, run_bench

WARMUP = 50
"""1-step runs of each variant left out of the figures."""
SEQ_WARMUP = 2
"""Chains (``--steps``) of each variant left out of the figures."""


def load(path: str) -> ModuleType:
    """The variants module at ``path``.

    Raises:
        SystemExit: it cannot be loaded or has no ``toggle``.
    """
    spec = importlib.util.spec_from_file_location("bench_variants", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load a variants module from {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "toggle", None)):
        raise SystemExit(f"{path}: a variants module defines toggle(side)")
    return module


async def measure(
    variants: ModuleType, runs: int, gap: float, steps: int = 0, warmup: int = WARMUP
) -> dict[str, Any]:
    """``runs`` 1-step runs (or ``steps``-step chains) of each variant, alternating; the
    figures per variant."""
    settings = Settings(prefix="paired")
    seen: dict[str, float] = {}

    async def on_event(msg: Delivery) -> None:
        if b"run.completed.v1" in msg.data:
            seen.setdefault(msg.subject.rsplit(".", 1)[-1], time.time())

    observed: dict[str, list[float]] = {"A": [], "B": []}
    e2e: dict[str, list[float]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as store:
        server = EmbeddedServer(store_dir=store)
        await server.start()
        worker = Worker([single, chain], nats=server.url, settings=settings)
        client: Client | None = None
        watcher: Broker | None = None
        try:
            await worker.start()
            client = await Client.connect(server.url, settings=settings)
            if not steps:  # the observer of 1-step runs; a chain's steps go unheard
                watcher = await Broker.connect(server.url, name="paired-watcher")
                await watcher.subscribe(client.names.events_all, cb=on_event)
                await watcher.flush()
            for i in range(runs):
                for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                    variants.toggle(side)
                    await asyncio.sleep(gap)
                    run_id = f"{side}{i}"
                    if steps:
                        done = worker.activations_completed + 1
                        await client.start("chain", steps, run_id=run_id)
                        # as bench.foundation waits: no subscription to the run's events
                        # (it would hear every step) until the worker is done
                        while worker.activations_completed < done:  # noqa: ASYNC110
                            await asyncio.sleep(0.002)
                        per_step = await _per_step(client, run_id, steps)
                        e2e[side].append(per_step)
                        observed[side].append(per_step)
                        continue
                    w0, t0 = time.time(), time.perf_counter()
                    await client.start("single", run_id=run_id)
                    await client.result(run_id, timeout=30)
                    e2e[side].append(time.perf_counter() - t0)
                    observed[side].append(await _seen(seen, run_id) - w0)
        finally:
            if watcher is not None:
                await watcher.close()
            if client is not None:
                await client.close()
            await worker.stop()
            await server.stop()
    return {
        side: {
            "observed": statistics.median(observed[side][warmup:]),
            "e2e": statistics.median(e2e[side][warmup:]),
        }
        for side in ("A", "B")
    } | {
        "difference": {
            key: statistics.median(
                a - b for a, b in zip(lists["A"][warmup:], lists["B"][warmup:], strict=True)
            )
            for key, lists in (("observed", observed), ("e2e", e2e))
        }
    }


async def _per_step(client: Client, run_id: str, steps: int) -> float:
    """A chain's time per step: its first ``StepStarted`` to its ``RunCompleted``, as stored."""
    events = [e for d in await client.history(run_id) for e in d.events]
    first = next(e.at for e in events if isinstance(e, StepStarted))
    end = next(e.at for e in events if isinstance(e, RunCompleted))
    return (end - first) / steps


async def _seen(seen: dict[str, float], run_id: str) -> float:
    """When the observer saw the run's end (it may come a moment after ``result``)."""
    deadline = time.monotonic() + 10
    while run_id not in seen:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the observer never saw {run_id} end")
        await asyncio.sleep(0.0005)
    return seen[run_id]


def main(args: argparse.Namespace) -> dict[str, Any]:
    variants = load(args.variants)
    warmup = SEQ_WARMUP if args.steps else WARMUP
    if args.runs <= warmup:
        raise SystemExit(f"--runs must be more than {warmup}")
    out: dict[str, Any] = run_bench(
        measure(variants, args.runs, args.gap, args.steps, warmup), args.json
    )
    what = getattr(variants, "DESCRIPTION", args.variants)
    print(f"sojourn {git_state(ROOT)}: {what}")
    if args.steps:
        print(f"{args.runs} runs of {args.steps} sequential steps of each variant, alternating\n")
        print("| variant | time per step, median of the runs |")
        print("|---|---|")
        for side in ("A", "B"):
            print(f"| {side} | {out[side]['e2e'] * 1e6:.1f} µs |")
        print(f"| A - B, median of the pairs | {out['difference']['e2e'] * 1e6:+.1f} µs |")
        return out
    print(f"{args.runs} 1-step runs of each variant, alternating, {args.gap * 1e3:g} ms apart\n")
    print("| variant | publish -> RunCompleted seen, p50 | start -> result returned, p50 |")
    print("|---|---|---|")
    for side in ("A", "B"):
        r = out[side]
        print(f"| {side} | {r['observed'] * 1e3:.3f} ms | {r['e2e'] * 1e3:.3f} ms |")
    d = out["difference"]
    print(
        f"| A - B, median of the pairs | {d['observed'] * 1e6:+.0f} µs | {d['e2e'] * 1e6:+.0f} µs |"
    )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", help="a variants module (a .py file defining toggle(side))")
    parser.add_argument("--runs", type=int, default=300, help="runs of each variant")
    parser.add_argument("--gap", type=float, default=0.005, help="untimed pause between runs")
    parser.add_argument(
        "--steps", type=int, default=0, help="runs of this many sequential steps instead"
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    ns = parser.parse_args()
    if not Path(ns.variants).is_file():
        sys.exit(f"no such file: {ns.variants}")
    main(ns)
