"""Liveness benchmark: the watchdog's start-up cost, how fast it flags a stopped worker, how fast
another worker takes the run over, and what ``heartbeat(details)`` costs a step.

Run from the repository root::

    python -m bench.liveness            # ~2 min: 20,000 live + 20,000 ended runs, 5 + 5 rounds
    python -m bench.liveness --quick    # ~30 s: 2,000 + 2,000 runs, 2 + 2 rounds

It starts its own ``EmbeddedServer`` (free port, temp dir, ``sync_interval: always``) and gives
every phase its own ``Settings`` prefix. Nothing in the runtime is patched or wrapped: instants
are wall-clock stamps taken by this process, event stamps (``at``) and lease stamps
(``heartbeat_at``) written by the workers, all on the same machine and clock.

1. **Catch-up** (what a starting watchdog pays before its first judgement). The events stream of
   a fresh prefix is filled directly, with no worker: N live runs, each two decisions
   ``[RunStarted, StepStarted]`` and ``[StepCompleted, WaitStarted]`` (half a ``sleep`` with a
   deadline one day ahead, half ``wait_for`` a signal), and M ended runs,
   ``[RunStarted, StepStarted]`` and ``[StepCompleted, RunCompleted]``, interleaved at random.
   Each is a real CAS append (``Nats-Expected-Last-Subject-Sequence``, ``Nats-Msg-Id``,
   ``Sojourn-Writer``), 500 runs at a time. Then, ``--repeats`` times interleaved:
   (a) the *raw read*: a ``StreamFollower`` over ``<prefix>.ev.*`` with the model's page size
   (1,000), reading every message and decoding nothing; (b) a fresh ``RunModel``, ``refresh()``
   until ``caught_up``. Both report messages/s and the CPU of this process and of nats-server per
   message. (c) ``assess(now)`` over every live run (median of 5 calls), and a whole
   ``Watchdog.scan()`` over the caught-up model (refresh with nothing new, assess, compare with
   the last judgement; median of the 5 after the first). (d) Memory: this
   process's RSS (``/proc/self/statm``) after ``gc.collect()`` before the first model is built
   and after it caught up, per live run; then, on a fresh model fed the same messages
   (``RunModel._on_decision`` page by page) under ``tracemalloc``, the Python heap it retains per
   live run and where. An untraced pass of the same feeding splits the per-message CPU into
   ``decode_events`` and the rest of ``_on_decision`` (fold, summary copy, bookkeeping).
2. **Detection and take-over** with ``lease_ttl=3`` (heartbeat 1 s, stall threshold 3 s): an
   in-process ``Watchdog`` (default interval: half a heartbeat, 0.5 s) records through
   ``on_change`` when it first judges a run ``stalled``. Workers are real processes
   (``python -m tests.apps.run_worker ... tests.apps.liveness``); the agent ``longstep`` runs a
   step whose first attempt loops forever reporting progress every 0.1 s (so its worker renews
   the lease every second) and whose re-run returns at once.
   After ``client.liveness`` says ``running`` the bench waits a random 0-1 s (the state shows
   right after a renewal), then SIGSTOPs the worker that holds the run (the lease's owner). The
   "last heartbeat" is that worker's last lease write (``heartbeat_at``), seen by a core
   subscription on ``<prefix>.lease.*`` or read from the flagged liveness.
   - *restart* rounds (first): one worker is up, so nobody can take over. SIGSTOP -> flag and
     last heartbeat -> flag; then SIGKILL it and start a new worker process: kill -> new worker
     ready (process start-up), ready -> it holds the lease, kill -> ``RunCompleted.at``.
   - *standby* rounds: a second worker is up and nobody intervenes. Last heartbeat -> the other
     worker holds the lease (its ``acquired_at``), against the lease expiry (last heartbeat +
     ``lease_ttl``); -> its ``StepStarted`` of attempt 2; SIGSTOP -> ``RunCompleted.at``; and
     whether the watchdog saw the run ``stalled`` at all before the take-over. Then the stopped
     worker is killed and replaced.
   Theory: flag at last heartbeat + 3 s + up to one judging interval (0.5 s) + the model's read
   lag; SIGSTOP falls 0-1 s after a heartbeat, so stop -> flag is 2-3.5 s; take-over at the
   lease expiry (last heartbeat + 3 s) plus a wake's delivery and one history load.
3. **Heartbeat cost.** An in-process ``Worker`` (``lease_ttl=30``: heartbeat every 5 s) runs the
   agent ``hb_bench`` defined here. A sync step (run in a thread, like every sync step) calls
   ``sojourn.actors.heartbeat({"i": i})`` ``--hb-calls`` times in a tight loop: µs per call, the
   CPU of this process per call (the event loop's share included), against a floor of the
   same loop calling only ``to_raw({"i": i})``; the same loop in an ``async def`` step. Lease
   writes are counted by a core subscription on ``<prefix>.lease.*`` (stamps inside the step's
   window) and by the leases stream's sequence. The tight loop is over in a fraction of a second,
   so to show the coalescing over time three more steps run ``--hb-seconds`` each: progress every
   ~1 ms, progress as fast as the loop goes (a flood), and a control that sleeps and reports
   nothing (expected: ~1 lease write per second for the first two, one per heartbeat interval
   for the control).
4. **No false flags at scale.** Phase 1's model judged at ``now``: how many of the N waiting
   runs come out as anything but ``waiting`` (expected 0). As a control the same model is judged
   two days later, when every ``sleep`` deadline is a day past: those runs must come out
   ``overdue``, the signal waits (no deadline) ``waiting``.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import random
import signal
import subprocess
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Context, Watchdog, Worker, agent, heartbeat
from sojourn.broker import Broker, Delivery, EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.follow import StreamFollower
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology
from sojourn.projections.model import RunModel
from sojourn.schemas.codec import decode_events, decode_lease_holder, encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    TriggerInfo,
    WaitStarted,
)
from sojourn.schemas.health import Liveness

from .util import (
    cpu_process,
    cpu_server,
    fmt_ms,
    fmt_rate,
    log,
    median,
    pct,
    run_bench,
    run_facts,
    start_worker,
    worker_ready,
)

SECTIONS = ("catchup", "detect", "heartbeat")
APP = "tests.apps.liveness"
FLAGGED = ("stalled", "orphaned", "overdue", "wedged")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the agent of phase 3 -----------------------------------------------------------------------


def by_state(assessed: Iterable[Liveness]) -> dict[str, int]:
    out: dict[str, int] = {}
    for liv in assessed:
        out[liv.state] = out.get(liv.state, 0) + 1
    return out


def hb_tight(n: int) -> dict[str, float]:
    """``heartbeat(details)`` n times in a tight loop (a sync step: it runs in a thread)."""
    start = time.time()
    t0 = time.perf_counter()
    for i in range(n):
        heartbeat({"i": i})
    return {"elapsed": time.perf_counter() - t0, "start": start, "end": time.time()}


async def hb_tight_async(n: int) -> dict[str, float]:
    """The same loop in an ``async def`` step (on the event loop, never yielding)."""
    start = time.time()
    t0 = time.perf_counter()
    for i in range(n):
        heartbeat({"i": i})
    return {"elapsed": time.perf_counter() - t0, "start": start, "end": time.time()}


def hb_paced(seconds: float) -> dict[str, float]:
    """Progress every ~1 ms for ``seconds``."""
    start = time.time()
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        heartbeat({"i": calls})
        calls += 1
        time.sleep(0.001)
    return {"elapsed": time.perf_counter() - t0, "start": start, "end": time.time(), "calls": calls}


def hb_flood(seconds: float) -> dict[str, float]:
    """``heartbeat(details)`` as fast as possible for ``seconds``."""
    start = time.time()
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            heartbeat({"i": calls})
            calls += 1
    return {"elapsed": time.perf_counter() - t0, "start": start, "end": time.time(), "calls": calls}


def hb_quiet(seconds: float) -> dict[str, float]:
    """No progress reports at all: the worker heartbeats for the step on its own."""
    start = time.time()
    t0 = time.perf_counter()
    time.sleep(seconds)
    return {"elapsed": time.perf_counter() - t0, "start": start, "end": time.time(), "calls": 0}


@agent("hb_bench")
async def hb_bench(ctx: Context, job: dict[str, Any]) -> dict[str, float]:
    mode = job["mode"]
    if mode == "tight":
        return await ctx.step(hb_tight, int(job["n"]))
    if mode == "tight_async":
        return await ctx.step(hb_tight_async, int(job["n"]))
    if mode == "paced":
        return await ctx.step(hb_paced, float(job["seconds"]))
    if mode == "flood":
        return await ctx.step(hb_flood, float(job["seconds"]))
    return await ctx.step(hb_quiet, float(job["seconds"]))


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    live: int = 20_000
    ended: int = 20_000
    repeats: int = 3
    rounds: int = 5
    hb_calls: int = 100_000
    hb_seconds: float = 5.0
    lease_ttl: float = 3.0
    sections: tuple[str, ...] = SECTIONS
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.liveness",
        description="sojourn liveness: watchdog catch-up, detection, take-over, heartbeat cost",
    )
    p.add_argument("--quick", action="store_true", help="< 1 min: 2,000 + 2,000 runs, 2 + 2 rounds")
    p.add_argument("--live", type=int, help="live (waiting) runs in the stream (default 20,000)")
    p.add_argument("--ended", type=int, help="ended runs in the stream (default 20,000)")
    p.add_argument("--repeats", type=int, help="raw read / catch-up repeats (default 3)")
    p.add_argument("--rounds", type=int, help="standby and restart rounds, each (default 5)")
    p.add_argument("--hb-calls", type=int, help="heartbeat calls in the tight loop (100,000)")
    p.add_argument(
        "--hb-seconds", type=float, help="paced / flood / quiet step duration (default 5)"
    )
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this phase (repeatable; phase 4 comes with catchup)",
    )
    p.add_argument("--store-dir", help="parent directory for the server's temp store")
    p.add_argument("--json", dest="json_out", help="also write all figures to this JSON file")
    a = p.parse_args(argv)
    cfg = Config(quick=a.quick, store_dir=a.store_dir, json_out=a.json_out)
    if a.quick:
        cfg.live, cfg.ended, cfg.repeats, cfg.rounds = 2_000, 2_000, 2, 2
        cfg.hb_calls, cfg.hb_seconds = 10_000, 2.0
    for name in ("live", "ended", "repeats", "rounds", "hb_calls", "hb_seconds"):
        if getattr(a, name) is not None:
            setattr(cfg, name, getattr(a, name))
    if a.only:
        cfg.sections = tuple(s for s in SECTIONS if s in a.only)
    return cfg


# --- helpers ------------------------------------------------------------------------------------

Log = Callable[[str], None]


def rss() -> int:
    """This process's resident set size in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


async def stream_info(broker: Broker, stream: str) -> dict[str, Any]:
    state: dict[str, Any] = (await broker.api(f"$JS.API.STREAM.INFO.{stream}"))["state"]
    return state


async def until(
    predicate: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            value = await predicate()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


# --- phase 1 (and 4): catch-up ------------------------------------------------------------------


async def fill(broker: Broker, names: Names, live: int, ended: int) -> dict[str, Any]:
    """Live and ended runs, two CAS appends each, written directly (no worker)."""
    now = time.time()
    writer = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}.1"
    kinds = ["sleep"] * (live // 2) + ["signal"] * (live - live // 2) + ["ended"] * ended
    random.Random(7).shuffle(kinds)
    runs = [(uuid.uuid4().hex, k) for k in kinds]

    def first(i: int, run_id: str) -> list[RunEvent]:
        return [
            RunStarted(
                run_id=run_id,
                agent="researcher",
                input=to_raw({"topic": f"topic {i}", "depth": 3}),
                trigger=TriggerInfo(inbox_seq=i + 1, received_at=now),
                at=now,
            ),
            StepStarted(position=0, name="search", at=now),
        ]

    def second(kind: str) -> list[RunEvent]:
        done = StepCompleted(
            position=0,
            name="search",
            result=to_raw({"hits": ["https://example.com/a", "https://example.com/b"]}),
            duration=0.4,
            at=now,
        )
        if kind == "sleep":
            return [done, WaitStarted(position=1, key="sleep", deadline=now + 86_400, at=now)]
        if kind == "signal":
            return [done, WaitStarted(position=1, key="signal:approve", signals=("approve",))]
        return [done, RunCompleted(output=to_raw({"summary": "done"}), at=now)]

    async def append(run_id: str, events: list[RunEvent], expected: int) -> int:
        headers = {
            h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected),
            h.MSG_ID: f"{run_id}:{expected}:{writer}",
            h.WRITER: writer,
        }
        ack = await broker.publish(names.events(run_id), encode_events(events), headers)
        return ack.seq

    t0 = time.perf_counter()
    batch = 500
    for lo in range(0, len(runs), batch):
        chunk = runs[lo : lo + batch]
        seqs = await asyncio.gather(
            *(append(r, first(lo + j, r), 0) for j, (r, _k) in enumerate(chunk))
        )
        await asyncio.gather(
            *(append(r, second(k), s) for (r, k), s in zip(chunk, seqs, strict=True))
        )
    elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "messages": 2 * len(runs), "kinds": kinds}


async def raw_read(broker: Broker, names: Names, server_pid: int | None) -> dict[str, float]:
    f = StreamFollower(broker, names.events_stream, names.events_all, page=1000)
    n = nbytes = 0
    c0, s0 = cpu_process(), cpu_server(server_pid)
    t0 = time.perf_counter()
    while True:
        msgs = await f.next_page()
        if not msgs:
            break
        n += len(msgs)
        nbytes += sum(len(m.data) for m in msgs)
        if f.pending == 0:
            break
    elapsed = time.perf_counter() - t0
    return {
        "elapsed": elapsed,
        "messages": n,
        "bytes": nbytes,
        "rate": n / elapsed,
        "py_cpu": cpu_process() - c0,
        "srv_cpu": cpu_server(server_pid) - s0,
    }


async def catch_up(model: RunModel, server_pid: int | None) -> dict[str, float]:
    calls = 0
    c0, s0 = cpu_process(), cpu_server(server_pid)
    t0 = time.perf_counter()
    while True:
        calls += 1
        if await model.refresh():
            break
    elapsed = time.perf_counter() - t0
    return {
        "elapsed": elapsed,
        "calls": calls,
        "py_cpu": cpu_process() - c0,
        "srv_cpu": cpu_server(server_pid) - s0,
    }


async def feed(broker: Broker, names: Names, model: RunModel, split: bool) -> dict[str, float]:
    """Read the stream page by page and hand each message to ``model._on_decision`` (no I/O is
    timed); with ``split``, also time ``decode_events`` alone over the same pages."""
    f = StreamFollower(broker, names.events_stream, names.events_all, page=1000)
    decode = handle = 0.0
    n = 0
    while True:
        msgs = await f.next_page()
        if not msgs:
            break
        n += len(msgs)
        if split:
            t0 = time.perf_counter()
            for m in msgs:
                decode_events(m.data)
            decode += time.perf_counter() - t0
        t0 = time.perf_counter()
        for m in msgs:
            model._on_decision(m)
        handle += time.perf_counter() - t0
        if f.pending == 0:
            break
    model.caught_up = True
    return {"messages": n, "decode": decode, "on_decision": handle}


async def phase_catchup(url: str, server_pid: int | None, cfg: Config, log: Log) -> dict[str, Any]:
    settings = Settings(prefix=f"lc{uuid.uuid4().hex[:8]}")
    names = Names(settings.prefix)
    broker = await Broker.connect(url, name="bench-liveness-catchup")
    try:
        await ensure_topology(broker, names, settings, consumers=False)
        log(f"catch-up: filling {cfg.live:,} live + {cfg.ended:,} ended runs")
        filled = await fill(broker, names, cfg.live, cfg.ended)
        kinds: list[str] = filled.pop("kinds")
        info = await stream_info(broker, names.events_stream)
        log(f"catch-up: filled {filled['messages']:,} messages in {filled['elapsed']:.1f} s")

        await raw_read(broker, names, server_pid)  # warm-up: page cache, connection buffers
        raws: list[dict[str, float]] = []
        catches: list[dict[str, float]] = []
        model: RunModel | None = None
        mem: dict[str, float] = {}
        for rep in range(cfg.repeats):
            raws.append(await raw_read(broker, names, server_pid))
            if model is not None:
                del model
                model = None
            gc.collect()
            before = rss()
            model = RunModel(broker, names, settings)
            catches.append(await catch_up(model, server_pid))
            await asyncio.sleep(0.1)  # let the reader's last subscription wind down
            gc.collect()
            if rep == 0:
                mem = {"rss_before": before, "rss_after": rss()}
            log(
                f"catch-up {rep + 1}/{cfg.repeats}: raw {raws[-1]['elapsed']:.2f} s, "
                f"model {catches[-1]['elapsed']:.2f} s"
            )
        assert model is not None
        now = time.time()
        assess_times = []
        judged: dict[str, Liveness] = {}
        for _ in range(5):
            t0 = time.perf_counter()
            judged = model.assess(now)
            assess_times.append(time.perf_counter() - t0)
        states_now = by_state(judged.values())
        # a whole watchdog scan over this model: refresh (nothing new), assess, compare, report
        wd = Watchdog(broker=broker, settings=settings, on_change=lambda _liv, _before: None)
        wd.model = model
        scan_times = []
        for _ in range(6):
            t0 = time.perf_counter()
            await wd.scan()
            scan_times.append(time.perf_counter() - t0)
        scan = {"first": scan_times[0], "steady": median(scan_times[1:]), "interval": wd.interval}
        del wd
        later = model.assess(now + 2 * 86_400)
        states_later = by_state(later.values())
        retained = {
            "runs": len(model.runs),
            "ended_seen": model.ended,
            "leases": len(model.leases),
            "wedges": len(model.wedges),
        }
        expected_later = {
            "overdue": kinds.count("sleep"),
            "waiting": kinds.count("signal"),
        }
        del model, judged, later
        gc.collect()

        log("catch-up: CPU split (decode vs the rest of _on_decision)")
        split_model = RunModel(broker, names, settings)
        split = await feed(broker, names, split_model, split=True)
        del split_model
        gc.collect()

        log("catch-up: tracemalloc pass")
        tracemalloc.start()
        traced_model = RunModel(broker, names, settings)
        await feed(broker, names, traced_model, split=False)
        await asyncio.sleep(0.1)  # let the reader's last subscription wind down
        gc.collect()
        with_model = tracemalloc.get_traced_memory()[0]
        snap1 = tracemalloc.take_snapshot()
        n_runs = len(traced_model.runs)
        del traced_model
        gc.collect()
        without_model = tracemalloc.get_traced_memory()[0]
        snap0 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        sites = []
        for st in snap1.compare_to(snap0, "lineno")[:6]:
            frame = st.traceback[0]
            where = f"{_short(frame.filename)}:{frame.lineno}"
            sites.append({"where": where, "bytes": st.size_diff, "blocks": st.count_diff})
        traced = {"bytes": with_model - without_model, "runs": n_runs, "sites": sites}
        del snap0, snap1
        gc.collect()
    finally:
        await broker.close()
    return {
        "live": cfg.live,
        "ended": cfg.ended,
        "fill": filled,
        "stream": {"messages": info["messages"], "bytes": info["bytes"]},
        "raw": raws,
        "model": catches,
        "memory": mem,
        "assess": assess_times,
        "scan": scan,
        "states_now": states_now,
        "states_later": states_later,
        "expected_later": expected_later,
        "retained": retained,
        "split": split,
        "traced": traced,
    }


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("site-packages", "main", "lib"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i + 1 :])
    return "/".join(parts[-2:])


# --- phase 2: detection and take-over -----------------------------------------------------------


class WorkerProc:
    """``python -m tests.apps.run_worker URL PREFIX tests.apps.liveness TTL`` in its own process
    (output to a file, so a chatty worker can never block on a full pipe)."""

    def __init__(self, url: str, prefix: str, ttl: float, logdir: Path) -> None:
        self.log_path = logdir / f"worker-{uuid.uuid4().hex[:6]}.log"
        self._out = open(self.log_path, "wb")  # closed by kill() / stop()
        self.spawned = time.time()
        self.proc = start_worker(url, prefix, APP, ttl, self._out)
        self.ready_at = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def ready(self, timeout: float = 60.0) -> WorkerProc:
        await worker_ready(self.proc, self.log_path, timeout, 0.01)
        self.ready_at = time.time()
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
                os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.wait(10)
        self._out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


def owner_pid(owner: str) -> int:
    """The pid in a lease owner ``<host>-<pid>-<rand>.<n>``."""
    return int(owner.rsplit(".", 1)[0].split("-")[-2])


async def phase_detect(url: str, cfg: Config, logdir: Path, log: Log) -> dict[str, Any]:
    ttl = cfg.lease_ttl
    settings = Settings(prefix=f"ld{uuid.uuid4().hex[:8]}", lease_ttl=ttl)
    names = Names(settings.prefix)
    seen: dict[str, list[tuple[str, float, Liveness]]] = {}
    flagged: dict[str, asyncio.Future[tuple[float, Liveness]]] = {}
    leases: dict[str, list[tuple[float, float, str]]] = {}

    def on_change(liv: Liveness, _before: Liveness | None) -> None:
        t = time.time()
        seen.setdefault(liv.run_id, []).append((liv.state, t, liv))
        fut = flagged.get(liv.run_id)
        if liv.state == "stalled" and fut is not None and not fut.done():
            fut.set_result((t, liv))

    async def on_lease(m: Delivery) -> None:
        with contextlib.suppress(Exception):
            lh = decode_lease_holder(m.data)
            if lh.owner:
                run_id = names.subject_token(m.subject, 1)
                leases.setdefault(run_id, []).append((lh.heartbeat_at, lh.acquired_at, lh.owner))

    observer = await Broker.connect(url, name="bench-liveness-leases")
    sub = await observer.subscribe(names.leases_all, cb=on_lease)
    await observer.flush()
    client = await Client.connect(url, settings=settings)
    wd = await Watchdog(nats=url, settings=settings, on_change=on_change).start()
    procs: list[WorkerProc] = []
    rng = random.Random(11)

    async def spawn() -> WorkerProc:
        p = WorkerProc(url, settings.prefix, ttl, logdir)
        procs.append(p)
        return await p.ready()

    async def stop_holder(pool: list[WorkerProc], k: int) -> dict[str, Any]:
        """Start a run, wait until its step runs, SIGSTOP the worker that holds it."""
        run_id = await client.start("longstep", k)
        flagged[run_id] = asyncio.get_running_loop().create_future()

        async def running() -> Liveness | None:
            liv = await client.liveness(run_id)
            return liv if liv.state == "running" and liv.owner else None

        liv = await until(running, 60, "the step to run")
        assert liv.owner is not None
        # "running" shows right after a renewal: stop at a random phase of the heartbeat
        await asyncio.sleep(rng.uniform(0, settings.heartbeat_every))
        pid = owner_pid(liv.owner)
        holder = next(p for p in pool if p.pid == pid)
        t_stop = time.time()
        os.kill(pid, signal.SIGSTOP)
        return {"run_id": run_id, "holder": holder, "t_stop": t_stop}

    async def await_flag(run_id: str, t_stop: float) -> tuple[float, Liveness]:
        try:
            return await asyncio.wait_for(asyncio.shield(flagged[run_id]), 30)
        except TimeoutError:
            states = [(st, round(t - t_stop, 2)) for st, t, _ in seen.get(run_id, [])]
            raise RuntimeError(
                f"run {run_id} not flagged 30 s after SIGSTOP: the watchdog saw {states}, "
                f"judges {wd.liveness(run_id)}; client.liveness: {await client.liveness(run_id)}"
            ) from None

    async def ending(run_id: str) -> dict[str, float]:
        await client.result(run_id, timeout=60)
        history = await client.history(run_id)
        events = [e for d in history for e in d.events]
        retake = next(e for e in events if isinstance(e, StepStarted) and e.attempt > 1)
        done = next(e for e in events if isinstance(e, RunCompleted))
        return {"retake": retake.at, "done": done.at}

    def beats(run_id: str, pid: int) -> tuple[float, float]:
        """The stopped owner's last heartbeat, and when the next owner acquired the lease."""
        mine = [hb for hb, _acq, owner in leases.get(run_id, []) if owner_pid(owner) == pid]
        others = [acq for _hb, acq, owner in leases.get(run_id, []) if owner_pid(owner) != pid]
        return max(mine, default=float("nan")), min(others, default=float("nan"))

    standby: list[dict[str, Any]] = []
    restart: list[dict[str, Any]] = []
    spawn_times: list[float] = []
    try:
        log("detect: restart rounds (one worker: nobody takes over until a new one starts)")
        pool = [await spawn()]
        for k in range(cfg.rounds):
            r = await stop_holder(pool, k)
            run_id, holder = r["run_id"], r["holder"]
            t_flag, fl = await await_flag(run_id, r["t_stop"])
            t_kill = time.time()
            holder.kill()
            pool.remove(holder)
            new = WorkerProc(url, settings.prefix, ttl, logdir)
            procs.append(new)
            end_task = asyncio.create_task(ending(run_id))
            await new.ready()
            end = await end_task
            pool.append(new)
            spawn_times.append(new.ready_at - new.spawned)
            beat = fl.last_heartbeat or float("nan")
            seen_beat, acquired = beats(run_id, holder.pid)
            restart.append(
                {
                    "stop_after_beat": r["t_stop"] - beat,
                    "stop_to_flag": t_flag - r["t_stop"],
                    "beat_to_flag": t_flag - beat,
                    "beat_mismatch": beat - seen_beat,
                    "flag_to_kill": t_kill - t_flag,
                    "kill_to_ready": new.ready_at - t_kill,
                    "ready_to_acquire": acquired - new.ready_at,
                    "ready_to_retake": end["retake"] - new.ready_at,
                    "kill_to_done": end["done"] - t_kill,
                }
            )
            rr = restart[-1]
            log(
                f"detect: restart round {k + 1}/{cfg.rounds}: flag {rr['beat_to_flag']:.2f} s "
                f"after the last heartbeat; kill -> done {rr['kill_to_done']:.2f} s "
                f"(start-up {rr['kill_to_ready']:.2f} s)"
            )
        log("detect: standby rounds (a second worker is up)")
        pool.append(await spawn())
        spawn_times.append(pool[-1].ready_at - pool[-1].spawned)
        for k in range(cfg.rounds):
            r = await stop_holder(pool, 100 + k)
            run_id, holder = r["run_id"], r["holder"]
            end = await ending(run_id)
            await asyncio.sleep(0.2)  # the observer has every lease write by now
            beat, acquired = beats(run_id, holder.pid)
            holder.kill()
            pool.remove(holder)
            stalled = [t for st, t, _ in seen.get(run_id, []) if st == "stalled"]
            standby.append(
                {
                    "stop_after_beat": r["t_stop"] - beat,
                    "beat_to_acquire": acquired - beat,
                    "expiry_to_acquire": acquired - (beat + ttl),
                    "beat_to_retake": end["retake"] - beat,
                    "stop_to_done": end["done"] - r["t_stop"],
                    "beat_to_flag": (stalled[0] - beat) if stalled else float("nan"),
                    "flagged": bool(stalled),
                }
            )
            sr = standby[-1]
            log(
                f"detect: standby round {k + 1}/{cfg.rounds}: lease taken "
                f"{sr['beat_to_acquire']:.2f} s after the last heartbeat; flagged: {sr['flagged']}"
            )
            new = await spawn()
            spawn_times.append(new.ready_at - new.spawned)
            pool.append(new)
        actions = wd.actions
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.kill()
            else:
                with contextlib.suppress(Exception):
                    p._out.close()
        await wd.stop()
        await sub.unsubscribe()
        await observer.close()
        await client.close()
    return {
        "lease_ttl": ttl,
        "heartbeat": settings.heartbeat_every,
        "stall_threshold": settings.stall_threshold,
        "interval": wd.interval,
        "standby": standby,
        "restart": restart,
        "spawn": spawn_times,
        "watchdog_actions": actions,
    }


# --- phase 3: heartbeat cost --------------------------------------------------------------------


async def phase_heartbeat(url: str, cfg: Config, log: Log) -> dict[str, Any]:
    settings = Settings(prefix=f"lh{uuid.uuid4().hex[:8]}", lease_ttl=30.0)
    names = Names(settings.prefix)
    observer = await Broker.connect(url, name="bench-liveness-observer")
    writes: list[tuple[float, float, str | None]] = []

    async def on_lease(m: Delivery) -> None:
        with contextlib.suppress(Exception):
            lh = decode_lease_holder(m.data)
            writes.append((time.time(), lh.heartbeat_at, lh.owner))

    sub = await observer.subscribe(names.leases_all, cb=on_lease)
    await observer.flush()
    client = await Client.connect(url, settings=settings)
    out: dict[str, Any] = {"heartbeat": settings.heartbeat_every}

    # the floor: the same loop encoding the details only, in a thread like a sync step
    def floor(n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            to_raw({"i": i})
        return time.perf_counter() - t0

    out["floor"] = min([await asyncio.to_thread(floor, cfg.hb_calls) for _ in range(3)])
    try:
        async with Worker([hb_bench], nats=url, settings=settings):

            async def run(job: dict[str, Any]) -> dict[str, Any]:
                info0 = await stream_info(observer, names.leases_stream)
                writes.clear()
                c0 = cpu_process()
                run_id = await client.start("hb_bench", job)
                res: dict[str, Any] = await client.result(run_id, timeout=120)
                cpu = cpu_process() - c0
                await asyncio.sleep(0.3)  # the release write reaches the observer
                info1 = await stream_info(observer, names.leases_stream)
                inside = [w for w in writes if w[2] and res["start"] <= w[1] <= res["end"]]
                res.update(
                    cpu=cpu,
                    writes_total=int(info1["last_seq"]) - int(info0["last_seq"]),
                    writes_seen=len(writes),
                    writes_inside=len(inside),
                    duration=res["end"] - res["start"],
                )
                return res

            await run({"mode": "tight", "n": 1000})  # warm-up
            log(f"heartbeat: {cfg.hb_calls:,} calls in a sync step")
            out["tight"] = await run({"mode": "tight", "n": cfg.hb_calls})
            log(f"heartbeat: {cfg.hb_calls:,} calls in an async step")
            out["tight_async"] = await run({"mode": "tight_async", "n": cfg.hb_calls})
            log(f"heartbeat: paced, flood and quiet steps, {cfg.hb_seconds:g} s each")
            out["paced"] = await run({"mode": "paced", "seconds": cfg.hb_seconds})
            out["flood"] = await run({"mode": "flood", "seconds": cfg.hb_seconds})
            out["quiet"] = await run({"mode": "quiet", "seconds": cfg.hb_seconds})
    finally:
        await sub.unsubscribe()
        await client.close()
        await observer.close()
    return out


# --- rendering ----------------------------------------------------------------------------------


def _b(n: float) -> str:
    if abs(n) >= 1024 * 1024:
        return f"{n / 1024 / 1024:,.1f} MiB"
    return f"{n:,.0f} B"


def _s(seconds: float) -> str:
    return "—" if seconds != seconds else f"{seconds:,.2f} s"


def _p3(xs: list[float]) -> str:
    return " / ".join(_s(pct(xs, q)) for q in (50, 0, 100))


def render(cfg: Config, facts: dict[str, str], res: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add("## sojourn liveness benchmark")
    add("")
    add("| machine | |")
    add("|---|---|")
    for k, v in facts.items():
        add(f"| {k} | {v} |")
    cu = res.get("catchup")
    if cu:
        raw_rate = median([r["rate"] for r in cu["raw"]])
        n_msgs = cu["raw"][0]["messages"]
        model_t = median([c["elapsed"] for c in cu["model"]])
        model_rate = n_msgs / model_t
        raw_cpu = median([r["py_cpu"] for r in cu["raw"]]) / n_msgs
        model_cpu = median([c["py_cpu"] for c in cu["model"]]) / n_msgs
        raw_srv = median([r["srv_cpu"] for r in cu["raw"]]) / n_msgs
        model_srv = median([c["srv_cpu"] for c in cu["model"]]) / n_msgs
        live = cu["live"]
        mem = cu["memory"]
        per_run = (mem["rss_after"] - mem["rss_before"]) / max(live, 1)
        tr = cu["traced"]
        sp = cu["split"]
        add("")
        add(
            f"### 1. Catch-up: {live:,} live + {cu['ended']:,} ended runs, "
            f"{n_msgs:,} messages ({_b(cu['stream']['bytes'])} stored), "
            f"median of {len(cu['raw'])}"
        )
        add("")
        add("| measurement | value | ratio / note |")
        add("|---|---|---|")
        add(
            f"| raw read: StreamFollower, 1,000 per page, no decoding | "
            f"{fmt_rate(raw_rate, 'msgs')} ({_s(n_msgs / raw_rate)}) | the read limit |"
        )
        add(
            f"| RunModel.refresh until caught_up | {fmt_rate(model_rate, 'msgs')} "
            f"({_s(model_t)}) | {model_rate / raw_rate:.2f}x the raw read |"
        )
        add(
            f"| CPU per message, this process: raw read / catch-up | "
            f"{raw_cpu * 1e6:,.1f} µs / {model_cpu * 1e6:,.1f} µs | nats-server: "
            f"{raw_srv * 1e6:,.1f} µs / {model_srv * 1e6:,.1f} µs |"
        )
        add(
            f"| of which (no I/O): decode_events / whole `_on_decision` | "
            f"{sp['decode'] / sp['messages'] * 1e6:,.1f} µs / "
            f"{sp['on_decision'] / sp['messages'] * 1e6:,.1f} µs | "
            f"decode is {sp['decode'] / max(sp['on_decision'], 1e-12):.0%} of `_on_decision` |"
        )
        add(
            f"| assess(now), all {live:,} live runs | {fmt_ms(median(cu['assess']))} | "
            f"{median(cu['assess']) / max(live, 1) * 1e6:,.2f} µs per run |"
        )
        sc = cu["scan"]
        add(
            f"| a whole watchdog scan (refresh with nothing new, assess, compare), steady / "
            f"first | {fmt_ms(sc['steady'])} / {fmt_ms(sc['first'])} | "
            f"{sc['steady'] / sc['interval']:.1%} of its {sc['interval']:g} s interval "
            f"(lease_ttl 30 s) |"
        )
        add(
            f"| RSS per live run ((after catch-up - before) / live, after gc) | {_b(per_run)} | "
            f"{_b(mem['rss_before'])} -> {_b(mem['rss_after'])} |"
        )
        add(
            f"| Python heap per live run (tracemalloc, fresh model) | "
            f"{_b(tr['bytes'] / max(tr['runs'], 1))} | {_b(tr['bytes'])} for "
            f"{tr['runs']:,} runs |"
        )
        rt = cu["retained"]
        add(
            f"| runs retained by the model / ended runs seen | {rt['runs']:,} "
            f"({rt['runs'] / max(live + cu['ended'], 1):.0%} of all) / {rt['ended_seen']:,} "
            f"| leases {rt['leases']}, wedges {rt['wedges']} |"
        )
        add(
            f"| fill (not a result: 2 CAS appends per run, 500 runs at a time) | "
            f"{_s(cu['fill']['elapsed'])} | "
            f"{fmt_rate(cu['fill']['messages'] / cu['fill']['elapsed'], 'msgs')} |"
        )
        add("")
        add("Where the model's heap is (tracemalloc, top sites):")
        add("")
        add("| site | retained | per live run |")
        add("|---|---|---|")
        for site in tr["sites"]:
            add(
                f"| {site['where']} | {_b(site['bytes'])} ({site['blocks']:+,} blocks) | "
                f"{site['bytes'] / max(tr['runs'], 1):,.0f} B |"
            )
        add("")
        add("### 4. No false flags at scale (phase 1's model)")
        add("")
        add("| judged | states | flagged |")
        add("|---|---|---|")
        sn = cu["states_now"]
        add(
            f"| now ({live:,} waiting runs, deadlines 1 day ahead or none) | "
            f"{_states(sn)} | {sum(v for k, v in sn.items() if k in FLAGGED)} |"
        )
        sl = cu["states_later"]
        ex = cu["expected_later"]
        add(
            f"| control: 2 days later (expected: {ex['overdue']:,} overdue, "
            f"{ex['waiting']:,} waiting) | {_states(sl)} | "
            f"{sum(v for k, v in sl.items() if k in FLAGGED):,} |"
        )
    dt = res.get("detect")
    if dt:
        sb, rs = dt["standby"], dt["restart"]
        thr, iv, ttl, beat = dt["stall_threshold"], dt["interval"], dt["lease_ttl"], dt["heartbeat"]
        add("")
        add(
            f"### 2. Detection and take-over: lease_ttl {ttl:g} s, heartbeat {beat:g} s, "
            f"stall threshold {thr:g} s, watchdog judging every {iv:g} s"
        )
        add("")
        add(
            f"Restart rounds ({len(rs)}): one worker; SIGSTOP it, wait for the flag, SIGKILL it, "
            "start a new worker process. p50 / min / max:"
        )
        add("")
        add("| measurement | p50 / min / max | theory |")
        add("|---|---|---|")

        def row(rows: list[dict[str, Any]], label: str, key: str, theory: str) -> None:
            xs = [r[key] for r in rows if r[key] == r[key]]
            add(f"| {label} | {_p3(xs) if xs else '—'} | {theory} |")

        row(rs, "last heartbeat -> SIGSTOP", "stop_after_beat", f"0 - {beat:g} s")
        row(rs, "SIGSTOP -> watchdog flags `stalled`", "stop_to_flag",
            f"{thr - beat:g} - {thr + iv:g} s")  # fmt: skip
        row(rs, "last heartbeat -> flag", "beat_to_flag", f"{thr:g} - {thr + iv:g} s")
        row(rs, "flag -> SIGKILL (the bench reacting)", "flag_to_kill", "")
        row(rs, "SIGKILL -> new worker process ready", "kill_to_ready", "process start-up")
        row(
            rs,
            "new worker ready -> it holds the lease",
            "ready_to_acquire",
            "~0: lease lapsed, re-wake queued",
        )
        row(rs, "new worker ready -> StepStarted (attempt 2)", "ready_to_retake", "")
        row(rs, "SIGKILL -> RunCompleted.at", "kill_to_done", "start-up + the above")
        add("")
        nflag = sum(1 for r in sb if r["flagged"])
        add(
            f"Standby rounds ({len(sb)}): two workers; SIGSTOP the one holding the run, the other "
            f"takes it over. The watchdog flagged the run `stalled` in {nflag} of {len(sb)}. "
            "p50 / min / max:"
        )
        add("")
        add("| measurement | p50 / min / max | theory |")
        add("|---|---|---|")
        row(sb, "last heartbeat -> SIGSTOP", "stop_after_beat", f"0 - {beat:g} s")
        row(sb, "last heartbeat -> the standby holds the lease", "beat_to_acquire",
            f"lease expiry: {ttl:g} s")  # fmt: skip
        row(sb, "lease expiry -> the standby holds the lease", "expiry_to_acquire",
            "a wake's delivery")  # fmt: skip
        row(sb, "last heartbeat -> the standby's StepStarted (attempt 2)", "beat_to_retake", "")
        row(sb, "SIGSTOP -> RunCompleted.at", "stop_to_done", f"{ttl:g} s - (heartbeat -> SIGSTOP)")
        row(sb, "last heartbeat -> flag (rounds that flagged)", "beat_to_flag",
            f"{thr:g} - {thr + iv:g} s")  # fmt: skip
        add("")
        add(
            f"Worker process start-up (spawn -> ready), all {len(dt['spawn'])} spawns: p50 "
            f"{_s(median(dt['spawn']))}. Watchdog re-wakes: {dt['watchdog_actions']}."
        )
    hb = res.get("heartbeat")
    if hb:
        add("")
        add(f"### 3. Heartbeat cost (lease_ttl 30 s: heartbeat every {hb['heartbeat']:g} s)")
        add("")
        t, ta = hb["tight"], hb["tight_async"]
        n = cfg.hb_calls
        add("| measurement | value | note |")
        add("|---|---|---|")
        add(
            f"| `heartbeat({{'i': i}})` in a sync step (thread), {n:,} calls | "
            f"{t['elapsed'] / n * 1e6:,.2f} µs per call | "
            f"{t['elapsed'] / max(hb['floor'], 1e-12):.1f}x the floor "
            f"(`to_raw` only: {hb['floor'] / n * 1e6:,.2f} µs) |"
        )
        add(
            f"| CPU of this process per call, sync step (the loop's share included) | "
            f"{t['cpu'] / n * 1e6:,.2f} µs | whole run, start to result |"
        )
        add(
            f"| the same loop in an async step (on the event loop) | "
            f"{ta['elapsed'] / n * 1e6:,.2f} µs per call | CPU per call "
            f"{ta['cpu'] / n * 1e6:,.2f} µs |"
        )
        for key, what in (
            ("tight", f"sync tight loop ({t['duration']:.2f} s)"),
            ("tight_async", f"async tight loop ({ta['duration']:.2f} s)"),
            ("paced", f"progress every ~1 ms for {hb['paced']['duration']:.1f} s"),
            ("flood", f"progress as fast as possible for {hb['flood']['duration']:.1f} s"),
            ("quiet", f"no progress reports, {hb['quiet']['duration']:.1f} s"),
        ):
            r = hb[key]
            calls = int(r.get("calls", n))
            if key == "flood":
                add(
                    f"| flood: calls per second / µs per call | "
                    f"{calls / max(r['elapsed'], 1e-9):,.0f}/s / "
                    f"{r['elapsed'] / max(calls, 1) * 1e6:,.2f} µs | "
                    f"CPU of this process per call {r['cpu'] / max(calls, 1) * 1e6:,.2f} µs |"
                )
            add(
                f"| lease writes during the step: {what} | {r['writes_inside']} "
                f"({r['writes_inside'] / max(r['duration'], 1e-9):.2f}/s) | "
                f"{calls:,} calls; activation total {r['writes_total']} writes "
                f"(acquire, renewals, release) |"
            )
    return "\n".join(lines)


def _states(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(d.items())) or "—"


# --- entry point --------------------------------------------------------------------------------


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.ERROR)
    facts = run_facts(cfg.store_dir)
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=cfg.store_dir, prefix="bench-liveness-") as tmp:
        async with EmbeddedServer(store_dir=Path(tmp) / "nats", port=0) as server:
            if "catchup" in cfg.sections:
                res["catchup"] = await phase_catchup(server.url, server.pid, cfg, log)
                gc.collect()
            if "detect" in cfg.sections:
                res["detect"] = await phase_detect(server.url, cfg, Path(tmp), log)
            if "heartbeat" in cfg.sections:
                res["heartbeat"] = await phase_heartbeat(server.url, cfg, log)
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, res))
    print(f"\n(bench took {elapsed:.0f} s)")
    return {"config": cfg.__dict__, "machine": facts, "results": _jsonable(res)}


def _jsonable(res: dict[str, Any]) -> Any:
    return json.loads(json.dumps(res, default=str))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
