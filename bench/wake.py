"""Wake benchmark: what waking a parked run costs as its history grows (issue 13).

Run from the repository root::

    python -m bench.wake           # ~5 min: 100 / 1,000 / 10,000 / 100,000 steps, 1,000 turns
    python -m bench.wake --quick   # ~1 min: 100 / 1,000 / 10,000 steps, 200 turns

It starts its own ``EmbeddedServer`` (free port, temp dir, ``sync_interval: always``), a
``Client``, and an observer connection whose core subscription on the run's event subject sees
each append as it reaches the server. Nothing in the runtime is patched.

1. **Where a cold wake's time goes** (in this process, no worker): for each size, the history
   read (``EventStore.load``: a batched direct get), the fold (``Activation``'s constructor,
   ``fold_history``) and the code replay (``Activation.run`` to the wait it parks on again,
   every step answered from the journal).
2. **Signal -> next step** for runs of 100 / 1,000 / 10,000 / 100,000 recorded steps: from just
   before ``client.signal`` to the observer seeing the ``StepStarted`` that follows the wait,
   K rounds per run, through a real ``Worker``, in three set-ups on the same deployment:
   *warm* (the default: the worker keeps the parked activation, ``sticky_runs``), *cold with
   snapshot* (``sticky_runs=0``, a history cache big enough for the run: the fold starts from
   the cached snapshot; the code still replays) and *cold* (``sticky_runs=0``, no cache: the
   whole history is read, folded and replayed). The histories are written directly (one
   decision per step, as an activation writes them: ``[StepCompleted k-1, StepStarted k]``),
   pipelined, much faster than executing the steps; the agent's code replays them.
3. **A 1,000-turn conversation**: one run, ``wait_for("msg")`` -> ``ctx.step`` -> wait again;
   each turn is timed from the signal's publish to the observer seeing the turn's
   ``StepStarted`` and then its next ``WaitStarted``; medians at turns 10, 100 and 1,000
   (a window of turns around each), warm and cold, against a raw JetStream publish+ack (a
   stream configured like the events stream) measured in the same run.
4. **Memory** of kept activations: ``tracemalloc`` around 1,000 parked conversations, kept
   and not kept.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.worker.activation import Activation
from sojourn.broker import Broker, EmbeddedServer, find_nats_server
from sojourn.broker import headers as h
from sojourn.broker.eventstore import EventStore
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology, stream_configs
from sojourn.schemas.codec import decode_events, encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted, StepCompleted, StepStarted, WaitStarted

from .util import git_state, machine_facts, pct, run_bench

RESULT = "x" * 40


async def tick(i: int) -> str:
    return RESULT


@agent("woken")
async def woken(ctx: Context, n: int) -> None:
    """``n`` recorded steps, then turns for ever: a signal ``go``, a step."""
    for i in range(n):
        await ctx.step(tick, i)
    while True:
        await ctx.wait_for("go")
        await ctx.step(tick, -1)


@agent("talker")
async def talker(ctx: Context) -> int:
    """A conversation: each ``msg`` a turn with one step; ``bye`` ends it."""
    turns = 0
    while True:
        text = await ctx.wait_for("msg")
        if text == "bye":
            return turns
        turns += 1
        await ctx.step(tick, turns)


# --- observing appends ---------------------------------------------------------------------------


class Observer:
    """Sees each decision appended to one run's subject, as the server publishes it."""

    def __init__(self, broker: Broker, subject: str) -> None:
        self.broker = broker
        self.subject = subject
        self.seen: list[tuple[float, list[str]]] = []
        self._changed = asyncio.Event()

    async def start(self) -> Observer:
        async def on(msg: Any) -> None:
            kinds = [type(e).__name__ for e in decode_events(msg.data)]
            self.seen.append((time.perf_counter(), kinds))
            self._changed.set()

        self._sub = await self.broker.subscribe(self.subject, cb=on)
        await self.broker.flush()
        return self

    async def until(self, kind: str, after: int, timeout: float = 120.0) -> tuple[float, int]:
        """When a decision holding ``kind`` was seen, the first after index ``after``."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(after, len(self.seen)):
                if kind in self.seen[i][1]:
                    return self.seen[i][0], i + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} on {self.subject}")
            self._changed.clear()
            with _suppress_timeout():
                await asyncio.wait_for(self._changed.wait(), 1.0)

    async def close(self) -> None:
        await self._sub.unsubscribe()


class _suppress_timeout:
    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: Any, *_: Any) -> bool:
        return tp is TimeoutError


# --- histories written directly -----------------------------------------------------------------


async def build(broker: Broker, names: Names, run_id: str, n: int) -> float:
    """Write the history of ``woken(n)`` parked on its first ``go``; seconds taken."""
    t0 = time.perf_counter()
    now = time.time()
    res = to_raw(RESULT)
    started = RunStarted(run_id=run_id, agent="woken", input=to_raw(n), at=now)
    msgs = [encode_events([started, StepStarted(position=0, name="tick", at=now)])]
    for i in range(1, n):
        msgs.append(
            encode_events(
                [
                    StepCompleted(position=i - 1, name="tick", result=res, at=now),
                    StepStarted(position=i, name="tick", at=now),
                ]
            )
        )
    wait = WaitStarted(position=n, key="signal:go", signals=("go",), at=now)
    msgs.append(
        encode_events([StepCompleted(position=n - 1, name="tick", result=res, at=now), wait])
    )
    subject = names.events(run_id)
    window = 500  # in flight at once on one connection: stored in publish order
    for k in range(0, len(msgs), window):
        await asyncio.gather(
            *(broker.publish(subject, m, {h.WRITER: "bench.1"}) for m in msgs[k : k + window])
        )
    return time.perf_counter() - t0


# --- 1. where a cold wake's time goes -----------------------------------------------------------


async def phases(store: EventStore, run_id: str, repeats: int) -> dict[str, float]:
    loads, folds, replays = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        history = await store.load(run_id)
        t1 = time.perf_counter()
        act = Activation(agent=woken, run_id=run_id, store=store, history=history, writer="b.1")
        t2 = time.perf_counter()
        outcome = await act.run()
        t3 = time.perf_counter()
        assert outcome == "waiting", outcome
        loads.append(t1 - t0)
        folds.append(t2 - t1)
        replays.append(t3 - t2)
        # From a snapshot of all but the last decision: what a cached wake folds.
        snap = Activation(
            agent=woken, run_id=run_id, store=store, history=history[:-1], writer="b.1"
        ).snapshot
        t4 = time.perf_counter()
        Activation(
            agent=woken,
            run_id=run_id,
            store=store,
            history=history,
            writer="b.1",
            snapshot=snap,
        )
        folds_snap = time.perf_counter() - t4
    return {
        "decisions": float(len(history)),
        "load": statistics.median(loads),
        "fold": statistics.median(folds),
        "fold_from_snapshot": folds_snap,
        "replay": statistics.median(replays),
    }


# --- 2. signal -> next step ----------------------------------------------------------------------


async def rounds(
    client: Client, ob: Observer, run_id: str, k: int, gap: float, ready: Callable[[], bool]
) -> list[float]:
    """``k`` signals, each timed to the ``StepStarted`` that follows; the run rests between."""
    out = []
    idx = len(ob.seen)
    for _ in range(k):
        await _until(ready)
        await asyncio.sleep(gap)
        idx = len(ob.seen)
        t0 = time.perf_counter()
        await client.signal(run_id, "go")
        t1, idx = await ob.until("StepStarted", idx)
        await ob.until("WaitStarted", idx - 1)
        out.append(t1 - t0)
    return out


async def _until(check: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition")
        await asyncio.sleep(0.002)


Mode = tuple[str, dict[str, Any]]
MODES: list[Mode] = [
    ("warm (kept activation)", {}),
    (
        "cold, snapshot (cache holds it)",
        {"sticky_runs": 0, "history_cache": 400_000, "history_cache_bytes": 1 << 30},
    ),
    ("cold, no cache", {"sticky_runs": 0, "history_cache": 0}),
]


async def wakes(
    url: str,
    settings: Settings,
    client: Client,
    ob_broker: Broker,
    runs: dict[int, str],
    k: int,
    log: Callable[[str], None],
) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {}
    for label, options in MODES:
        out[label] = {}
        async with Worker([woken], nats=url, settings=settings, **options) as w:
            for n, run_id in runs.items():
                n_rounds = k if n < 100_000 or label.startswith("warm") else max(3, k // 5)
                ob = await Observer(ob_broker, client.names.events(run_id)).start()
                try:

                    def resting(run_id: str = run_id) -> bool:
                        return run_id not in w._active

                    # The first wake on a fresh worker is cold in every set-up: not timed.
                    await rounds(client, ob, run_id, 1, 0.05, resting)
                    got = await rounds(client, ob, run_id, n_rounds, 0.05, resting)
                finally:
                    await ob.close()
                out[label][n] = got
                log(f"  {label}, {n:,} steps: p50 {pct(got, 50) * 1e3:.2f} ms")
    return out


# --- 3. the 1,000-turn conversation -------------------------------------------------------------


async def conversation(
    url: str,
    settings: Settings,
    client: Client,
    ob_broker: Broker,
    turns: int,
    options: dict[str, Any],
) -> tuple[list[float], list[float]]:
    """Per turn: signal -> the turn's StepStarted, and signal -> its next WaitStarted."""
    async with Worker([talker], nats=url, settings=settings, **options) as w:
        run_id = await client.start("talker", None)
        ob = await Observer(ob_broker, client.names.events(run_id)).start()
        to_step, to_rest = [], []
        try:
            await ob.until("WaitStarted", 0)
            for t in range(turns):
                await _until(lambda: run_id not in w._active)
                idx = len(ob.seen)
                t0 = time.perf_counter()
                await client.signal(run_id, "msg", f"turn {t}")
                t1, idx = await ob.until("StepStarted", idx)
                t2, _ = await ob.until("WaitStarted", idx - 1)
                to_step.append(t1 - t0)
                to_rest.append(t2 - t0)
            await client.signal(run_id, "msg", "bye")
            await client.result(run_id, timeout=60)
        finally:
            await ob.close()
    return to_step, to_rest


async def raw_floor(broker: Broker, settings: Settings, n: int) -> list[float]:
    """Sequential JetStream publish+ack on a stream configured like the events stream."""
    names = Names(f"raw{uuid.uuid4().hex[:6]}")
    config = stream_configs(names, settings)[0]
    await broker.ensure_stream(config)
    body = encode_events(
        [
            StepCompleted(position=1, name="tick", result=to_raw(RESULT), at=time.time()),
            StepStarted(position=2, name="tick", at=time.time()),
        ]
    )
    subject = names.events("floor")
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await broker.publish_raw(subject, body, {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(i)})
        out.append(time.perf_counter() - t0)
    return out


def window(xs: list[float], at: int, half: int = 5) -> float:
    """The median of the turns around turn ``at`` (1-based)."""
    lo, hi = max(0, at - 1 - half), min(len(xs), at + half)
    return statistics.median(xs[lo:hi]) if xs[lo:hi] else float("nan")


# --- 4. memory ----------------------------------------------------------------------------------


async def memory(url: str, settings: Settings, client: Client, n: int) -> dict[str, float]:
    out = {}
    for label, sticky in (("kept", 2000), ("not kept", 0)):
        async with Worker([talker], nats=url, settings=settings, sticky_runs=sticky) as w:
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            runs = [await client.start("talker", None) for _ in range(n)]
            if label == "kept":
                await _until(lambda: len(w.sticky) >= n)
            else:
                await _until(lambda: w.activations_completed >= n and not w._active)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            out[label] = (after - before) / n
            for r in runs:
                await client.signal(r, "msg", "bye")
            for r in runs:
                await client.result(r, timeout=60)
    return out


# --- the whole run ------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    sizes = [100, 1_000, 10_000] if args.quick else [100, 1_000, 10_000, 100_000]
    turns = 200 if args.quick else args.turns
    out: dict[str, Any] = {"sizes": sizes, "turns": turns}
    with tempfile.TemporaryDirectory(prefix="sojourn-wake-") as tmp:
        srv = EmbeddedServer(store_dir=tmp, port=0)
        async with srv:
            out["machine"] = machine_facts(find_nats_server(), srv.store_dir)
            settings = Settings(prefix=f"wake{uuid.uuid4().hex[:8]}")
            names = Names(settings.prefix)
            b = await Broker.connect(srv.url, name="bench-wake")
            ob = await Broker.connect(srv.url, name="bench-observer")
            await ensure_topology(b, names, settings)
            client = await Client.connect(srv.url, settings=settings)
            store = EventStore(b, names, settings)
            try:
                runs: dict[int, str] = {}
                out["phases"] = {}
                for n in sizes:
                    run_id = f"woken-{n}"
                    took = await build(b, names, run_id, n)
                    log(f"built {n:,} steps in {took:.1f}s")
                    runs[n] = run_id
                    out["phases"][n] = await phases(store, run_id, 3 if n < 100_000 else 1)
                log("signal -> next step")
                out["wakes"] = await wakes(srv.url, settings, client, ob, runs, args.rounds, log)
                log(f"conversation: {turns} turns")
                out["floor"] = await raw_floor(b, settings, 300)
                conv: dict[str, Any] = {}
                cold: dict[str, Any] = {"sticky_runs": 0}
                for label, options in (("warm", {}), ("cold", cold)):
                    conv[label] = await conversation(srv.url, settings, client, ob, turns, options)
                    log(f"  {label}: done")
                out["conversation"] = conv
                out["floor_after"] = await raw_floor(b, settings, 300)
                log("memory")
                out["memory"] = await memory(srv.url, settings, client, args.memory_runs)
            finally:
                await client.close()
                await ob.close()
                await b.close()
    return out


def report(out: dict[str, Any], head: str) -> str:
    lines = [f"# Wake benchmark ({head})", ""]
    lines += ["## Where a cold wake's time goes (in process, no worker)", ""]
    lines += [
        "| recorded steps | load | fold | fold from a snapshot | code replay |",
        "|---|---|---|---|---|",
    ]
    for n, p in out["phases"].items():
        lines.append(
            f"| {n:,} | {p['load'] * 1e3:,.1f} ms | {p['fold'] * 1e3:,.1f} ms | "
            f"{p['fold_from_snapshot'] * 1e3:,.2f} ms | {p['replay'] * 1e3:,.1f} ms |"
        )
    lines += ["", "## Signal -> next step (p50 / p90 ms)", ""]
    labels = list(out["wakes"])
    lines += ["| recorded steps | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for n in out["sizes"]:
        cells = []
        for label in labels:
            xs = out["wakes"][label][n]
            cells.append(f"{pct(xs, 50) * 1e3:,.2f} / {pct(xs, 90) * 1e3:,.2f} (n={len(xs)})")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    warm = out["wakes"][labels[0]]
    small, big = out["sizes"][0], out["sizes"][-1]
    ratio = pct(warm[big], 50) / pct(warm[small], 50)
    lines += [
        "",
        f"Warm: {big:,} steps p50 {pct(warm[big], 50) * 1e3:.2f} ms = {ratio:.2f}x "
        f"{small:,} steps (target <= 20 ms and <= 1.5x).",
    ]
    floor = out["floor"] + out["floor_after"]
    f50 = pct(floor, 50)
    lines += ["", f"## {out['turns']}-turn conversation (median of turns around each)", ""]
    lines += [
        f"Raw JetStream publish+ack (events-like stream, same run): p50 {f50 * 1e3:.2f} ms.",
        "",
        "| worker | to | turn 10 | turn 100 | last turn | last / turn 10 | turn 100 / raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, (to_step, to_rest) in out["conversation"].items():
        for what, xs in (("signal -> step started", to_step), ("signal -> parked", to_rest)):
            a, b_, c = window(xs, 10), window(xs, 100), window(xs, len(xs))
            lines.append(
                f"| {label} | {what} | {a * 1e3:.2f} ms | {b_ * 1e3:.2f} ms | {c * 1e3:.2f} ms |"
                f" {c / a:.2f}x | {b_ / f50:.1f}x |"
            )
    mem = out["memory"]
    lines += [
        "",
        "## Memory per parked conversation (tracemalloc, Python heap)",
        "",
        f"kept: {mem['kept']:,.0f} B; not kept: {mem['not kept']:,.0f} B "
        f"(difference {mem['kept'] - mem['not kept']:,.0f} B per kept run).",
    ]
    lines += ["", "Machine: " + "; ".join(f"{k} {v}" for k, v in out["machine"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=20, help="timed wakes per run and set-up")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--memory-runs", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    async def go() -> dict[str, Any]:
        out = await run_all(args, log)
        print(report(out, f"sojourn {git_state(_root())}"))
        return out

    run_bench(go(), args.json)


def _root() -> Any:
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    main()
