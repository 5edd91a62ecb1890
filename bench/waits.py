"""Durable-waits benchmark: parking many runs, timer lateness, signal -> next step latency.

Run from the repository root::

    python -m bench.waits            # ~2.5 min: 3 x 10,000 parked runs, 10,000 timers, 300 signals
    python -m bench.waits --quick    # ~40 s: 3 x 1,000 / 1,000 / 100

It starts its own ``EmbeddedServer`` (free port, temp dir, ``sync_interval: always``), one
in-process ``Worker`` (unique ``Settings`` prefix, default concurrency and flush delay), a
``Client``, and an *observer* connection whose core subscriptions on ``<prefix>.ev.*`` (and, in
the phases that need it, ``<prefix>.lease.*``) see every event append and lease write as it
reaches the server. Nothing in the runtime is patched or wrapped: every instant below is an event
stamp, a lease stamp, a stored message's server timestamp, or the moment the observer saw a
message. The observer shares the worker's process: each message it receives costs ~20-40 µs of
nats-py parsing there (2-3 messages per run in the timed phases).

1. **Parking**: N runs (half ``wait_for("go", timeout=3600)``, half ``ctx.sleep(3600)``) are
   triggered at once. Time to park = first trigger publish -> the observer has seen a
   ``WaitStarted`` of every run. Memory: this process's RSS (the worker, the client and the
   observer share it) before the burst, at its peak (a thread samples /proc every 20 ms), and after
   all runs are parked and ``gc.collect()``; nats-server RSS the same way; ``len(worker._active)``.
   ``--park-bursts`` more bursts of N follow: their growth is the steady-state cost per parked
   run, without the one-off growth of the first burst. Then (untimed, on a second prefix and a
   fresh worker) ``tracemalloc`` snapshots around a burst give the Python heap retained per parked
   run and where it is held.
2. **Timer lateness**: N runs each ``await ctx.sleep(until=T_i)``, T_i spread evenly over
   ``--spread`` seconds, all in the future once every run is parked; then they complete.
   Lateness = ``WaitCompleted.at`` - ``WaitStarted.deadline`` (decoded from the observer's copies
   of the appends). Split: deadline -> the fired wake was stored (its ``Nats-Time-Stamp``, read
   back afterwards: the scheduler's own lateness), -> the worker started the activation (the
   ``acquired_at`` stamp of its lease write, i.e. the wake reached the worker), -> ``WaitCompleted``
   stamped. Reference: the same number of raw ``@at`` schedules with no consumer at all. Then a
   control at a rate the worker keeps up with (``--low-rate-runs``).
3. **Signal -> next step**: one run loops ``wait_for("go")`` -> ``ctx.step`` -> wait again. Each of
   K rounds: wait until the run is parked and inactive, pause ``--gap``, then time from just before
   ``client.signal`` to the observer seeing the ``StepStarted`` that follows the ``WaitCompleted``.
   Raw floors in the same run: publish to an inbox-like work-queue stream -> pull consumer ->
   one CAS append seen by the observer; and publish-ack then CAS append from one task.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import ctypes
import gc
import logging
import random
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from sojourn.actors import Client, Context, Worker, agent, fold
from sojourn.actors.worker.activation import Activation
from sojourn.broker import Broker, Delivery, EmbeddedServer, Subscription
from sojourn.broker.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, MSG_ID, SCHEDULER
from sojourn.broker.names import Names
from sojourn.broker.timers import schedule_timer
from sojourn.broker.topology import consumer_configs, stream_configs
from sojourn.schemas.codec import decode_events, encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunCompleted,
    SignalReceived,
    StepStarted,
    WaitCompleted,
    WaitStarted,
)

from .trace import gather_limited, profile_summary
from .util import (
    cpu_process,
    cpu_server,
    fmt_ms,
    loadavg,
    log,
    pct,
    run_bench,
    run_facts,
    summarize,
)

SECTIONS = ("park", "timer", "signal")

TARGET_RETAINED_PER_RUN = 100  # bytes: "~0" (below this, noise of the measurement itself)
TARGET_SERVER_PER_RUN = 10 * 1024  # bytes
TARGET_TIMER_P99 = 0.300  # seconds
TARGET_SIGNAL_P50 = 0.005  # seconds


# --- the agents under test ----------------------------------------------------------------------


@agent("parker")
async def parker(ctx: Context, kind: str) -> None:
    """Parks at once: on a signal with a 1 h timeout, or on a 1 h durable sleep."""
    if kind == "signal":
        await ctx.wait_for("go", timeout=3600)
    else:
        await ctx.sleep(3600)


@agent("sleeper")
async def sleeper(ctx: Context, until: float) -> float:
    """Sleeps until an absolute instant, then completes."""
    await ctx.sleep(until=datetime.fromtimestamp(until, UTC))
    return until


async def bump(n: int) -> int:
    return n + 1


@agent("looper")
async def looper(ctx: Context) -> int:
    """Waits for ``go``, runs one step, waits again; ``"stop"`` ends it."""
    n = 0
    while True:
        got = await ctx.wait_for("go")
        if got == "stop":
            return n
        n = await ctx.step(bump, n)


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    park_runs: int = 10_000
    timer_runs: int = 10_000
    low_rate_runs: int = 250
    spread: float = 2.0
    rounds: int = 300
    gap: float = 0.005
    tracemalloc_runs: int = 2_000
    park_bursts: int = 3
    profile: bool = False
    sections: tuple[str, ...] = SECTIONS
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.waits",
        description="sojourn durable waits: parking, timer lateness, signal latency (a table)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="~30 s version: 1,000 parked runs, 1,000 timers, 100 signal rounds",
    )
    p.add_argument("--runs", type=int, help="runs parked at once (default 10,000)")
    p.add_argument(
        "--park-bursts",
        type=int,
        default=3,
        help="bursts of --runs parked runs, one after the other: the later ones show the "
        "steady-state growth per parked run (default 3)",
    )
    p.add_argument("--timer-runs", type=int, help="runs sleeping until T (default 10,000)")
    p.add_argument(
        "--low-rate-runs",
        type=int,
        help="also time this many timers over the same spread, a rate the worker keeps up "
        "with (default 250; --quick 100; 0 skips)",
    )
    p.add_argument(
        "--spread", type=float, default=2.0, help="seconds the timer deadlines span (default 2)"
    )
    p.add_argument("--rounds", type=int, help="signal -> step rounds (default 300)")
    p.add_argument(
        "--gap",
        type=float,
        default=0.005,
        metavar="SECONDS",
        help="untimed pause once the looping run rests, before the next signal (default 0.005)",
    )
    p.add_argument(
        "--tracemalloc-runs",
        type=int,
        help="runs parked under tracemalloc on a second prefix (default 2,000; 0 skips)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help="run only this section (park, timer or signal); repeat to pick several",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile this process while the main timer burst fires (inflates its lateness)",
    )
    p.add_argument("--store-dir", help="parent directory for the server's temp store")
    p.add_argument("--json", dest="json_out", help="also write all figures to this JSON file")
    a = p.parse_args(argv)
    c = Config(quick=a.quick)
    if a.quick:
        c.park_runs, c.timer_runs, c.low_rate_runs = 1_000, 1_000, 100
        c.rounds, c.tracemalloc_runs = 100, 500
    c.park_runs = a.runs or c.park_runs
    c.timer_runs = a.timer_runs or c.timer_runs
    if a.low_rate_runs is not None:
        c.low_rate_runs = max(0, a.low_rate_runs)
    c.spread = max(0.0, a.spread)
    c.rounds = a.rounds or c.rounds
    c.gap = max(0.0, a.gap)
    if a.tracemalloc_runs is not None:
        c.tracemalloc_runs = max(0, a.tracemalloc_runs)
    c.sections = tuple(x for x in SECTIONS if not a.only or x in a.only)
    c.profile = a.profile
    c.park_bursts = max(1, a.park_bursts)
    c.store_dir = a.store_dir
    c.json_out = a.json_out
    return c


# --- measuring instruments ----------------------------------------------------------------------


def _malloc_trim_rss() -> int:
    """RSS of this process after glibc's ``malloc_trim(0)`` hands freed heap pages back: what
    is left is live data plus pymalloc arenas that still hold a live object. 0 if unavailable."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return 0
    return rss("self")


def rss(pid: int | str | None) -> int:
    """VmRSS of ``pid`` (or ``"self"``) in bytes; 0 when unknown."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler(threading.Thread):
    """Samples the RSS of this process and of the server every ``period`` seconds."""

    def __init__(self, server_pid: Callable[[], int | None], period: float = 0.02) -> None:
        super().__init__(name="bench-rss", daemon=True)
        self.server_pid = server_pid
        self.period = period
        self.peak_self = 0
        self.peak_server = 0
        self._stop = threading.Event()

    def reset(self) -> None:
        self.peak_self = rss("self")
        self.peak_server = rss(self.server_pid())

    def run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak_self = max(self.peak_self, rss("self"))
            self.peak_server = max(self.peak_server, rss(self.server_pid()))

    def stop(self) -> None:
        self._stop.set()


class Observer:
    """Core subscriptions on every event append and lease write of one prefix.

    Callbacks only copy what they need (the subject, the bytes and the arrival time); decoding
    happens after the timed part. A plain subscriber also sees appends the stream refuses (a
    fenced writer's), so every consumer of these copies takes the first matching one per run.
    """

    def __init__(self, broker: Broker, names: Names) -> None:
        self.b = broker
        self.names = names
        self._cut = len(names.prefix) + 4  # "<prefix>.ev."
        self._lcut = len(names.prefix) + 7  # "<prefix>.lease."
        self.on_event: Callable[[float, str, bytes], None] | None = None
        self.on_lease: Callable[[float, str, bytes], None] | None = None
        self._subs: list[Subscription] = []
        self._lease_sub: Subscription | None = None

    async def start(self) -> None:
        self._subs.append(await self.b.subscribe(self.names.events_all, cb=self._ev))
        await self.b.flush()

    async def watch_leases(self, on: bool) -> None:
        """Subscribe to lease writes only while a phase needs them: every message the
        observer receives costs this process (the worker's) ~20-40 µs of nats-py parsing."""
        if on and self._lease_sub is None:
            self._lease_sub = await self.b.subscribe(f"{self.names.prefix}.lease.*", cb=self._ls)
            await self.b.flush()
        elif not on and self._lease_sub is not None:
            with contextlib.suppress(Exception):
                await self._lease_sub.unsubscribe()
            self._lease_sub = None

    async def stop(self) -> None:
        await self.watch_leases(False)
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()

    async def _ev(self, msg: Delivery) -> None:
        if self.on_event is not None:
            self.on_event(time.time(), msg.subject[self._cut :], msg.data)

    async def _ls(self, msg: Delivery) -> None:
        if self.on_lease is not None:
            self.on_lease(time.time(), msg.subject[self._lcut :], msg.data)


class _LeaseBody(msgspec.Struct):
    owner: str | None = None
    expires_at: float = 0.0
    acquired_at: float = 0.0


_lease_decoder = msgspec.json.Decoder(_LeaseBody)


async def stream_state(b: Broker, stream: str) -> dict[str, int]:
    info = await b.api(f"$JS.API.STREAM.INFO.{stream}")
    st = info.get("state", {})
    return {
        "messages": int(st.get("messages", 0)),
        "bytes": int(st.get("bytes", 0)),
        "subjects": int(st.get("num_subjects", 0)),
    }


async def lanes(fn: Callable[[Any], Awaitable[Any]], items: list[Any], width: int = 256) -> None:
    """``await fn(x)`` for every item, ``width`` at a time, from ``width`` long-lived tasks.

    Not one task per item: 10,000 tasks created at once would add ~20 MB to this process's
    peak RSS, which is the worker's RSS too.
    """
    it = iter(items)

    async def lane() -> None:
        for x in it:
            await fn(x)

    await asyncio.gather(*(lane() for _ in range(min(width, len(items)) or 1)))


async def _until(cond: Callable[[], bool], limit: float, what: str, poll: float = 0.005) -> None:
    deadline = time.perf_counter() + limit
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out after {limit:.0f} s waiting for {what}")
        await asyncio.sleep(poll)


# --- 1. parking ---------------------------------------------------------------------------------


class Bench:
    def __init__(
        self,
        worker: Worker,
        client: Client,
        observer: Observer,
        server_pid: Callable[[], int | None],
        tag: str,
        log: Callable[[str], None],
    ) -> None:
        self.w = worker
        self.c = client
        self.obs = observer
        self.server_pid = server_pid
        self.tag = tag
        self.log = log
        self.names = client.names

    async def _burst(self, agent_name: str, items: list[tuple[str, Any]]) -> float:
        """Publish every trigger (256 in flight); returns the wall time the publishing took."""
        t0 = time.perf_counter()
        await gather_limited([self.c.start(agent_name, inp, run_id=rid) for rid, inp in items], 256)
        return time.perf_counter() - t0

    def rids(self, n: int, kind_tag: str) -> list[str]:
        return [f"{kind_tag}{i}-{self.tag}" for i in range(n)]

    async def park_burst(self, rids: list[str]) -> dict[str, Any]:
        """Trigger these parker runs at once; return when every one has recorded its wait."""
        n = len(rids)
        wanted = set(rids)
        parked: set[str] = set()
        done = asyncio.Event()
        last = [0.0]

        def on_event(t: float, rid: str, data: bytes) -> None:
            if rid in wanted and b'"wait.started.v1"' in data and rid not in parked:
                parked.add(rid)
                last[0] = t
                if len(parked) >= n:
                    done.set()

        self.obs.on_event = on_event
        try:
            w0 = time.time()
            publish = await self._burst(
                "parker", [(r, "signal" if i % 2 == 0 else "sleep") for i, r in enumerate(rids)]
            )
            await asyncio.wait_for(done.wait(), 600)
            park_time = last[0] - w0
            await _until(lambda: not self.w._active, 120, "the worker to go idle")
            idle = time.time() - w0
        finally:
            self.obs.on_event = None
        return {"publish": publish, "park_time": park_time, "idle": idle}

    async def parking(self, n: int, sampler: RssSampler, bursts: int = 2) -> dict[str, Any]:
        self.log(f"parking: warm-up ({min(200, n)} runs)")
        await self.park_burst(self.rids(min(200, n), "pw"))
        rids = self.rids(n, "park")  # allocated before the baseline: not counted as retained
        base_acts = self.w.activations_completed
        gc.collect()
        await asyncio.sleep(0.5)  # let the server settle after the warm-up
        py0, srv0, blocks0 = rss("self"), rss(self.server_pid()), sys.getallocatedblocks()
        sampler.reset()
        c0, s0 = cpu_process(), cpu_server(self.server_pid())
        self.log(f"parking: burst of {n} runs")
        r = await self.park_burst(rids)
        c1, s1 = cpu_process(), cpu_server(self.server_pid())
        peak_py, peak_srv = sampler.peak_self, sampler.peak_server
        active = len(self.w._active)
        activations = self.w.activations_completed - base_acts
        gc.collect()
        py1, srv1, blocks1 = rss("self"), rss(self.server_pid()), sys.getallocatedblocks()
        py_trimmed = _malloc_trim_rss()
        # Untimed checks: the observer's count is only a hint (it also sees refused appends).
        sample = random.Random(7).sample(rids, min(50, n))
        states = await gather_limited([self.c.state(x) for x in sample], 10)
        waiting = sum(1 for s in states if s.status == "waiting")
        streams = {
            k: await stream_state(self.c.broker, s)
            for k, s in (
                ("events", self.names.events_stream),
                ("wake (timers + wakes)", self.names.wake_stream),
                ("leases", self.names.leases_stream),
                ("inbox", self.names.inbox_stream),
            )
        }
        # Further bursts of the same size reuse what the first one grew (allocator arenas,
        # buffers, free lists): their growth is what each further parked run costs.
        more = []
        for b in range(2, bursts + 1):
            self.log(f"parking: burst {b}/{bursts} of {n} runs")
            gc.collect()
            pa, sa, ba = rss("self"), rss(self.server_pid()), sys.getallocatedblocks()
            rb = await self.park_burst(self.rids(n, f"park{b}x"))
            act_b = len(self.w._active)
            gc.collect()
            pb, sb_, bb = rss("self"), rss(self.server_pid()), sys.getallocatedblocks()
            more.append(
                {
                    "burst": b,
                    "park_time": rb["park_time"],
                    "rate": n / rb["park_time"],
                    "py_rss_before": pa,
                    "py_rss_after": pb,
                    "py_blocks_delta": bb - ba,
                    "srv_rss_before": sa,
                    "srv_rss_after": sb_,
                    "active_after": act_b,
                }
            )
        return {
            "more": more,
            "n": n,
            "publish": r["publish"],
            "park_time": r["park_time"],
            "idle_time": r["idle"],
            "rate": n / r["park_time"],
            "activations": activations,
            "py_rss_before": py0,
            "py_rss_peak": peak_py,
            "py_rss_after": py1,
            "py_rss_trimmed": py_trimmed,
            "py_blocks_delta": blocks1 - blocks0,
            "srv_rss_before": srv0,
            "srv_rss_peak": peak_srv,
            "srv_rss_after": srv1,
            "active_after": active,
            "py_cpu_per_run": (c1 - c0) / n,
            "srv_cpu_per_run": (s1 - s0) / n,
            "sample_waiting": f"{waiting}/{len(sample)}",
            "streams": streams,
        }

    # --- 2. timers --------------------------------------------------------------------------

    async def timers(
        self, n: int, spread: float, park_rate: float, label: str, profile: bool = False
    ) -> dict[str, Any]:
        rids = [f"{label}{i}-{self.tag}" for i in range(n)]
        wanted = set(rids)
        evs: list[tuple[float, str, bytes]] = []
        leases: list[tuple[float, str, bytes]] = []
        parked: set[str] = set()
        completed: set[str] = set()
        all_parked, all_done = asyncio.Event(), asyncio.Event()

        def on_event(t: float, rid: str, data: bytes) -> None:
            if rid not in wanted:
                return
            if b'"wait.' in data:
                evs.append((t, rid, data))
                if b'"wait.started.v1"' in data and rid not in parked:
                    parked.add(rid)
                    if len(parked) >= n:
                        all_parked.set()
            if b'"run.completed.v1"' in data and rid not in completed:
                evs.append((t, rid, data))
                completed.add(rid)
                if len(completed) >= n:
                    all_done.set()

        def on_lease(t: float, rid: str, data: bytes) -> None:
            if rid in wanted:
                leases.append((t, rid, data))

        # Every run must be parked before the first deadline: leave the measured parking time
        # of this many runs (the slowest burst's rate), half again, plus 2 s.
        lead = 1.5 * n / max(park_rate, 50.0) + 2.0
        t_first = time.time() + lead
        deadlines = {r: t_first + spread * i / max(n - 1, 1) for i, r in enumerate(rids)}
        self.obs.on_event, self.obs.on_lease = on_event, on_lease
        await self.obs.watch_leases(True)
        try:
            self.log(f"timers ({label}): {n} runs, first deadline in {lead:.1f} s")
            w0 = time.time()
            await self._burst("sleeper", [(r, deadlines[r]) for r in rids])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_parked.wait(), max(0.1, t_first - time.time()))
            parked_at = time.time() - w0
            await _until(lambda: not self.w._active, 60, "the parking activations to end")
            acts0, local0 = self.w.activations_completed, self.w.timers_fired
            c0, s0 = cpu_process(), cpu_server(self.server_pid())
            prof = cProfile.Profile() if profile else None
            if prof is not None:
                prof.enable()
            try:
                await asyncio.wait_for(all_done.wait(), t_first + spread - time.time() + 300)
            finally:
                if prof is not None:
                    prof.disable()
            c1, s1 = cpu_process(), cpu_server(self.server_pid())
            await _until(lambda: not self.w._active, 60, "the worker to go idle")
            acts1, local1 = self.w.activations_completed, self.w.timers_fired
        finally:
            self.obs.on_event = self.obs.on_lease = None
            await self.obs.watch_leases(False)
        # Untimed: when did each fired wake reach the wake stream (server timestamp)?
        wakes = await gather_limited(
            [
                self.c.broker.direct_get_last(self.names.wake_stream, self.names.wake(r, "sleeper"))
                for r in rids
            ],
            64,
        )
        fired: dict[str, float] = {}
        for r, m in zip(rids, wakes, strict=True):
            if m is not None and m.header(SCHEDULER) and m.time:
                fired[r] = m.time
        started: dict[str, WaitStarted] = {}
        ended: dict[str, WaitCompleted] = {}
        finished: dict[str, float] = {}
        for t, rid, data in evs:
            for e in decode_events(data):
                if isinstance(e, WaitStarted):
                    started.setdefault(rid, e)
                elif isinstance(e, WaitCompleted):
                    ended.setdefault(rid, e)
                elif isinstance(e, RunCompleted):
                    finished.setdefault(rid, t)
        acquired: dict[str, list[float]] = defaultdict(list)
        for _t, rid, data in leases:
            body = _lease_decoder.decode(data)
            if body.owner is not None:
                acquired[rid].append(body.acquired_at)
        late: dict[str, list[float]] = {
            k: []
            for k in (
                "total",
                "fired",
                "to_worker",
                "to_decided",
                "durable",
                "to_worker_total",
            )
        }
        early_parked = not_parked = extra = 0
        for r in rids:
            ws, wc = started.get(r), ended.get(r)
            if ws is None:
                not_parked += 1  # the deadline passed before the wait was recorded
                continue
            assert ws.deadline is not None
            if ws.at >= ws.deadline:
                early_parked += 1
                continue
            if wc is None:
                continue
            d = ws.deadline
            late["total"].append(wc.at - d)
            if r in finished:
                late["durable"].append(finished[r] - d)
            # Activations from the deadline's neighbourhood on (parking was seconds earlier):
            # more than one means a wake was taken too early and the run parked again.
            after = sorted(a for a in acquired.get(r, []) if a >= d - 0.25)
            extra += max(0, len(after) - 1)
            f = fired.get(r)
            if f is not None:
                late["fired"].append(f - d)
                took = [a for a in after if a >= f - 0.001]
                if took:
                    late["to_worker"].append(took[0] - f)
                    late["to_worker_total"].append(took[0] - d)
                    late["to_decided"].append(wc.at - took[0])
        first_d = min(deadlines.values())
        last_wc = max((e.at for e in ended.values()), default=float("nan"))
        return {
            "n": n,
            "spread": spread,
            "lead": lead,
            "parked_after": parked_at,
            "measured": len(late["total"]),
            "not_parked_in_time": not_parked + early_parked,
            "fired_seen": len(fired),
            "extra_activations": acts1 - acts0 - len(ended) if not leases else extra,
            "woken_in_process": local1 - local0,
            "drain_rate": len(late["total"]) / (last_wc - first_d) if last_wc > first_d else 0.0,
            "drain_time": last_wc - first_d,
            "py_cpu_per_run": (c1 - c0) / n,
            "srv_cpu_per_run": (s1 - s0) / n,
            "lateness": {
                k: {**summarize(v), "max": max(v, default=float("nan"))} for k, v in late.items()
            },
            "profile": profile_summary(prof) if prof is not None else None,
        }

    # --- 3. signal -> next step ------------------------------------------------------------

    async def signals(self, k: int, gap: float) -> dict[str, Any]:
        rid = f"loop-{self.tag}"
        state: dict[str, Any] = {}
        step_fut: asyncio.Future[tuple[float, bytes]] | None = None
        park_fut: asyncio.Future[float] | None = None
        sig_at: list[float] = []
        lease_at: list[float] = []

        def on_event(t: float, r: str, data: bytes) -> None:
            if r != rid:
                return
            if b'"signal.received.v1"' in data:
                for e in decode_events(data):
                    if isinstance(e, SignalReceived):
                        sig_at.append(e.at)
            if step_fut is not None and not step_fut.done() and b'"step.started.v1"' in data:
                step_fut.set_result((t, data))
            elif (
                park_fut is not None
                and not park_fut.done()
                and step_fut is not None
                and step_fut.done()
                and b'"wait.started.v1"' in data
            ):
                park_fut.set_result(t)
            if b'"wait.started.v1"' in data:
                state["parked"] = True

        def on_lease(t: float, r: str, data: bytes) -> None:
            if r == rid:
                body = _lease_decoder.decode(data)
                if body.owner is not None:
                    lease_at.append(body.acquired_at)

        self.obs.on_event, self.obs.on_lease = on_event, on_lease
        await self.obs.watch_leases(True)
        loop = asyncio.get_running_loop()
        rows: list[dict[str, float]] = []
        try:
            await self.c.start("looper", run_id=rid)
            await _until(lambda: state.get("parked", False), 30, "the looping run to park")
            warm = 10
            for i in range(warm + k):
                await _until(lambda: rid not in self.w._active, 30, "the looping run to rest")
                await asyncio.sleep(gap)
                step_fut, park_fut = loop.create_future(), loop.create_future()
                n_sig, n_lease = len(sig_at), len(lease_at)
                w0 = time.time()
                t0 = time.perf_counter()
                await self.c.signal(rid, "go", i)
                acked = time.perf_counter() - t0
                seen, data = await asyncio.wait_for(step_fut, 30)
                await asyncio.wait_for(park_fut, 30)
                if i < warm:
                    continue
                ev = decode_events(data)
                wc = next(e for e in ev if isinstance(e, WaitCompleted))
                ss = next(e for e in ev if isinstance(e, StepStarted))
                row = {
                    "observed": seen - w0,
                    "stamped": ss.at - w0,
                    "signal_acked": acked,
                    "wait_completed": wc.at - w0,
                }
                if len(sig_at) > n_sig:
                    row["intake"] = sig_at[n_sig] - w0
                if len(lease_at) > n_lease:
                    row["lease"] = lease_at[n_lease] - w0
                rows.append(row)
            await self.c.signal(rid, "go", "stop")
            await self.c.result(rid, timeout=30)
        finally:
            self.obs.on_event = self.obs.on_lease = None
            await self.obs.watch_leases(False)
        hist = await self.c.history(rid)
        costs = await self._history_costs(rid, hist)

        def col(key: str, sel: slice = slice(None)) -> list[float]:
            return [r[key] for r in rows[sel] if key in r]

        def phases(sel: slice) -> dict[str, float]:
            rs = rows[sel]
            got = {
                "client.signal: publish -> inbox ack": [r["signal_acked"] for r in rs],
                "publish -> intake stamped SignalReceived (inbox hop + history load)": [
                    r["intake"] for r in rs if "intake" in r
                ],
                "SignalReceived -> worker's lease write (append, wake publish, wake fetch)": [
                    r["lease"] - r["intake"] for r in rs if "lease" in r and "intake" in r
                ],
                "lease write -> WaitCompleted stamped (lease CAS, history load, replay)": [
                    r["wait_completed"] - r["lease"] for r in rs if "lease" in r
                ],
                "WaitCompleted -> StepStarted stamped": [
                    r["stamped"] - r["wait_completed"] for r in rs
                ],
                "StepStarted stamped -> seen by the observer (the append)": [
                    r["observed"] - r["stamped"] for r in rs
                ],
                "total: before client.signal -> StepStarted seen": [r["observed"] for r in rs],
            }
            return {p: pct(v, 50) for p, v in got.items()}

        tenth = max(1, k // 6)
        return {
            "k": k,
            "observed": summarize(col("observed")),
            "stamped": summarize(col("stamped")),
            "first": summarize(col("observed", slice(0, tenth))),
            "last": summarize(col("observed", slice(-tenth, None))),
            "tenth": tenth,
            "history_msgs": len(hist),
            "phases": phases(slice(None)),
            "phases_first": phases(slice(0, tenth)),
            "phases_last": phases(slice(-tenth, None)),
            **costs,
        }

    async def _history_costs(self, rid: str, hist: list[Any]) -> dict[str, float]:
        """Untimed: what reading and replaying the looping run's history costs at its end."""
        loads = []
        for _ in range(5):
            t = time.perf_counter()
            await self.w.store.load(rid)
            loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        await self.w.store.last_seq(rid)
        last = time.perf_counter() - t
        events = [e for d in hist for e in d.events]
        t = time.perf_counter()
        fold(events)
        folded = time.perf_counter() - t
        # Replay as a wake would: the history up to the last park (before "stop"), an
        # Activation that replays every round and parks again without any I/O.
        before_stop = hist[:-2]
        replays = []
        for _ in range(3):
            t = time.perf_counter()
            act = Activation(
                agent=looper,
                run_id=rid,
                store=self.w.store,
                history=before_stop,
                writer="bench-replay",
                flush_delay=3600,
            )
            outcome = await act.run()
            replays.append(time.perf_counter() - t)
        assert outcome == "waiting", outcome
        return {
            "load": pct(loads, 50),
            "load_last": last,
            "fold": folded,
            "replay": pct(replays, 50),
            "replayed_msgs": len(before_stop),
        }


# --- raw floor for the signal round trip ---------------------------------------------------------


async def signal_floor(
    url: str, settings: Settings, tag: str, k: int, gap: float
) -> dict[str, dict[str, float]]:
    """The least JetStream work a durable signal -> step start needs, with no sojourn code.

    ``hop``: publish to a stream configured like sojourn's inbox (await the ack), a pull consumer
    (``fetch(batch=64)`` like the intake) receives it and makes one CAS append, timed to the moment
    an observer sees that append. ``direct``: one task publishes (awaits the ack), then makes the
    CAS append, timed the same way.
    """
    names = Names(f"rw{tag}")
    pub = await Broker.connect(url, name="bench-floor-client")
    srv = await Broker.connect(url, name="bench-floor-service")
    obs = await Broker.connect(url, name="bench-floor-observer")
    cfgs = stream_configs(names, settings)
    await srv.ensure_stream(cfgs[0])
    await srv.ensure_stream(cfgs[1])
    for stream, ccfg in consumer_configs(names, settings):
        if stream == names.inbox_stream:
            await srv.ensure_consumer(stream, ccfg)
    pc = await srv.pull(names.inbox_stream, names.intake_consumer)
    body = encode_events(
        [
            WaitCompleted(
                position=1,
                key="signal:go",
                outcome="signal",
                payload=to_raw(1),
                signal="go",
                signal_id=uuid.uuid4().hex,
                at=time.time(),
            ),
            StepStarted(position=2, name="bump", attempt=1, at=time.time()),
        ]
    )
    seqs: dict[str, int] = defaultdict(int)
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[float]] = {}

    async def append(b: Broker, run: str) -> None:
        ack = await b.publish_raw(
            names.events(run),
            body,
            {
                EXPECTED_LAST_SUBJECT_SEQUENCE: str(seqs[run]),
                MSG_ID: f"{run}:{seqs[run]}:w",
            },
        )
        if "error" in ack:
            raise RuntimeError(ack["error"])
        seqs[run] = int(ack["seq"])

    async def consumer() -> None:
        while True:
            for m in await pc.fetch(batch=64, timeout=1.0):
                run = names.subject_token(m.subject, 1)
                if run.startswith("floorhop"):  # the direct half appends by itself
                    await append(srv, run)
                await m.ack()

    async def seen(msg: Delivery) -> None:
        fut = waiting.pop(msg.subject, None)
        if fut is not None and not fut.done():
            fut.set_result(time.time())

    sub = await obs.subscribe(names.events_all, cb=seen)
    await obs.flush()
    task = asyncio.create_task(consumer())
    hop: list[float] = []
    direct: list[float] = []
    try:
        for i in range(k + 10):
            for kind, out in (("hop", hop), ("direct", direct)):
                await asyncio.sleep(gap)
                run = f"floor{kind}-{tag}"
                fut = waiting[names.events(run)] = loop.create_future()
                w0 = time.time()
                ack = await pub.publish_raw(
                    names.signal(run, "go"), b"1", {MSG_ID: uuid.uuid4().hex}
                )
                if "error" in ack:
                    raise RuntimeError(ack["error"])
                if kind == "direct":
                    await append(pub, run)
                t = await asyncio.wait_for(fut, 10)
                if i >= 10:
                    out.append(t - w0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sub.unsubscribe()
        for b in (pub, srv, obs):
            await b.close()
    return {"hop": summarize(hop), "direct": summarize(direct)}


# --- raw scheduler reference ---------------------------------------------------------------------


async def raw_schedules(
    url: str, settings: Settings, tag: str, n: int, spread: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """The server's own timer lateness at the same rate: ``n`` ``@at`` schedules spread over
    ``spread`` s in a stream configured like sojourn's wake stream, with no consumer at all.

    Lateness = the fired message's ``Nats-Time-Stamp`` - its deadline.
    """
    names = Names(f"rs{tag}{n}")
    b = await Broker.connect(url, name="bench-raw-schedules")
    try:
        await b.ensure_stream(stream_configs(names, settings)[2])
        lead = 2.0 + n / 1500  # publishing 10k schedules takes ~3-4 s at sync_interval always
        first = time.time() + lead
        deadlines = {f"r{i}": first + spread * i / max(n - 1, 1) for i in range(n)}
        log(f"raw schedules: {n} over {spread:g} s, first in {lead:.1f} s")
        await gather_limited(
            [schedule_timer(b, names, r, "0", d, agent=None) for r, d in deadlines.items()],
            256,
        )
        margin = first - time.time()
        await asyncio.sleep(max(0.0, first + spread - time.time()) + 0.5)
        fired: dict[str, float] = {}
        while True:  # the scheduler may still be catching up
            got = await gather_limited(
                [
                    b.direct_get_last(names.wake_stream, names.wake(r))
                    for r in deadlines
                    if r not in fired
                ],
                64,
            )
            for m in got:
                if m is not None and m.time:
                    fired[names.subject_token(m.subject, 1)] = m.time
            if len(fired) >= n or time.time() > first + spread + 120:
                break
            await asyncio.sleep(1.0)
        late = [fired[r] - d for r, d in deadlines.items() if r in fired]
        return {
            "n": n,
            "margin": margin,
            "fired": len(fired),
            "lateness": {**summarize(late), "max": max(late, default=float("nan"))},
            "rate": len(late) / max(max(fired.values()) - first, 1e-9) if fired else 0.0,
        }
    finally:
        await b.close()


# --- tracemalloc pass -----------------------------------------------------------------------------


async def heap_pass(url: str, n: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Python heap retained per parked run, on a fresh worker and prefix, under tracemalloc."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(prefix=f"heap{tag}")
    worker = Worker([parker], nats=url, settings=settings)
    await worker.start()
    client = await Client.connect(url, settings=settings)
    try:

        async def burst(k: int, kind: str) -> None:
            base = worker.activations_completed
            items = [(f"{kind}{i}-{tag}", "signal" if i % 2 == 0 else "sleep") for i in range(k)]
            await lanes(lambda x: client.start("parker", x[1], run_id=x[0]), items)
            await _until(
                lambda: worker.activations_completed >= base + k and not worker._active,
                300,
                "the runs to park",
            )

        # A first burst of the same size grows every high-water buffer (nats-py's pending-
        # request map, socket buffers, asyncio free lists) to its size: the second one then
        # shows what each run leaves behind, not one-off growth.
        await burst(n, "hw")
        tracemalloc.start(1)
        try:
            gc.collect()
            before = tracemalloc.take_snapshot()
            log(f"tracemalloc: burst of {n} runs on a fresh worker")
            await burst(n, "h")
            await asyncio.sleep(0.2)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        flt = [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "*/bench/*"),
        ]
        diff = after.filter_traces(flt).compare_to(before.filter_traces(flt), "lineno")
        total = sum(d.size_diff for d in diff)
        top = sorted(diff, key=lambda d: -d.size_diff)[:5]
        sites = [
            {
                "where": _short(str(d.traceback[0])),
                "bytes": d.size_diff,
                "blocks": d.count_diff,
            }
            for d in top
            if d.size_diff > 0
        ]
        return {
            "n": n,
            "retained": total,
            "per_run": total / n,
            "sites": sites,
            "active": len(worker._active),
        }
    finally:
        await client.close()
        await worker.stop()


def _short(where: str) -> str:
    for marker in ("/site-packages/", "/work/main/", "/lib/python3"):
        i = where.find(marker)
        if i >= 0:
            return where[i + len(marker) :].lstrip("/")
    return where


# --- the whole run --------------------------------------------------------------------------------


async def run_all(cfg: Config, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": loadavg()}
    parent = cfg.store_dir or None
    with tempfile.TemporaryDirectory(prefix="sojourn-waits-", dir=parent) as tmp:
        srv = EmbeddedServer(store_dir=tmp, port=0)  # sync_interval: always (the default)
        async with srv:
            tag = uuid.uuid4().hex[:8]
            settings = Settings(prefix=f"waits{tag}")
            worker = Worker([parker, sleeper, looper], nats=srv.url, settings=settings)
            await worker.start()
            client = await Client.connect(srv.url, settings=settings)
            ob = await Broker.connect(srv.url, name="bench-observer")
            obs = Observer(ob, client.names)
            await obs.start()
            sampler = RssSampler(lambda: srv.pid)
            sampler.start()
            bench = Bench(worker, client, obs, lambda: srv.pid, tag, log)
            try:
                park_rate = 400.0
                if "park" in cfg.sections:
                    out["park"] = await bench.parking(cfg.park_runs, sampler, cfg.park_bursts)
                    park_rate = min(
                        [out["park"]["rate"], *(b["rate"] for b in out["park"]["more"])]
                    )
                if "timer" in cfg.sections:
                    out["raw_timer"] = await raw_schedules(
                        srv.url, settings, tag, cfg.timer_runs, cfg.spread, log
                    )
                    out["timer"] = await bench.timers(
                        cfg.timer_runs, cfg.spread, park_rate, "sl", cfg.profile
                    )
                    if cfg.low_rate_runs:
                        out["raw_timer_low"] = await raw_schedules(
                            srv.url, settings, tag, cfg.low_rate_runs, cfg.spread, log
                        )
                        out["timer_low"] = await bench.timers(
                            cfg.low_rate_runs, cfg.spread, park_rate, "slow"
                        )
                if "signal" in cfg.sections:
                    log(f"signal -> step: {cfg.rounds} rounds")
                    out["signal"] = await bench.signals(cfg.rounds, cfg.gap)
                    log(f"signal floor: {cfg.rounds} rounds")
                    out["signal_floor"] = await signal_floor(
                        srv.url, settings, tag, cfg.rounds, cfg.gap
                    )
                if "park" in cfg.sections and cfg.tracemalloc_runs:
                    out["heap"] = await heap_pass(srv.url, cfg.tracemalloc_runs, log)
            finally:
                sampler.stop()
                await obs.stop()
                await client.close()
                await worker.stop()
                await ob.close()
    out["load_after"] = loadavg()
    return out


# --- report -----------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _b(n: float) -> str:
    if n != n:
        return "—"
    if abs(n) >= 1024 * 1024:
        return f"{n / 1024 / 1024:,.1f} MiB"
    if abs(n) >= 10 * 1024:
        return f"{n / 1024:,.1f} KiB"
    return f"{n:,.0f} B"


def _p(s: dict[str, float], keys: tuple[str, ...] = ("p50", "p90", "p99", "max")) -> str:
    return " / ".join(fmt_ms(s.get(k, float("nan"))) for k in keys)


def render(cfg: Config, facts: dict[str, str], res: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add("## Machine")
    add("")
    for k, v in facts.items():
        add(f"- {k}: {v}")
    add("")
    add(
        f"Parameters: {cfg.park_bursts} x {cfg.park_runs:,} parked runs; "
        f"{cfg.timer_runs:,} timers over "
        f"{cfg.spread:g} s (control: {cfg.low_rate_runs:,}); {cfg.rounds} signal rounds with "
        f"{cfg.gap * 1e3:g} ms idle before each; tracemalloc pass {cfg.tracemalloc_runs:,} runs; "
        f"sync_interval always; sections: {', '.join(cfg.sections)}. Load average before / "
        f"after: {res['load_before']} / {res['load_after']}."
    )
    add("")
    add("| measurement | sojourn | reference (same server, same run) | target | verdict |")
    add("|---|---|---|---|---|")
    pk = res.get("park")
    heap = res.get("heap")
    if pk:
        n = pk["n"]
        add(
            f"| park {n:,} runs at once: first trigger -> every WaitStarted seen "
            f"| {pk['park_time']:.2f} s ({pk['rate']:,.0f} runs/s) "
            f"| publishing the {n:,} triggers alone: {pk['publish']:.2f} s | none set | — |"
        )
        per = (pk["py_rss_after"] - pk["py_rss_before"]) / n
        add(
            f"| worker process RSS retained per parked run ((after gc - before) / N) "
            f"| {_b(per)} ({_b(pk['py_rss_before'])} -> peak {_b(pk['py_rss_peak'])} -> "
            f"{_b(pk['py_rss_after'])}) "
            f"| allocated blocks: {pk['py_blocks_delta'] / n:+.2f} per run "
            f"| ~0 (<= {TARGET_RETAINED_PER_RUN} B) | {_verdict(per <= TARGET_RETAINED_PER_RUN)} |"
        )
        sb = pk["more"][-1] if pk.get("more") else None
        if sb:
            per2 = (sb["py_rss_after"] - sb["py_rss_before"]) / n
            add(
                f"| the same for burst {sb['burst']} of {n:,} (steady state: arenas and buffers "
                f"already grown) | {_b(per2)} ({_b(sb['py_rss_before'])} -> "
                f"{_b(sb['py_rss_after'])}) "
                f"| allocated blocks: {sb['py_blocks_delta'] / n:+.2f} per run "
                f"| ~0 (<= {TARGET_RETAINED_PER_RUN} B) "
                f"| {_verdict(per2 <= TARGET_RETAINED_PER_RUN)} |"
            )
        if heap:
            top = heap["sites"][0] if heap["sites"] else None
            add(
                f"| Python heap retained per parked run (tracemalloc, {heap['n']:,} runs, "
                f"fresh worker) | {_b(heap['per_run'])} "
                f"| largest: {top['where'] if top else '—'} "
                f"{'(' + _b(top['bytes'] / heap['n']) + ' per run)' if top else ''} "
                f"| ~0 (<= {TARGET_RETAINED_PER_RUN} B) "
                f"| {_verdict(heap['per_run'] <= TARGET_RETAINED_PER_RUN)} |"
            )
        add(
            f"| `len(worker._active)` once all are parked | {pk['active_after']} | — | 0 "
            f"| {_verdict(pk['active_after'] == 0)} |"
        )
        sper = (pk["srv_rss_after"] - pk["srv_rss_before"]) / n
        add(
            f"| nats-server RSS per parked run | {_b(sper)} ({_b(pk['srv_rss_before'])} -> "
            f"peak {_b(pk['srv_rss_peak'])} -> {_b(pk['srv_rss_after'])}) "
            f"| on disk: {_b(sum(st['bytes'] for st in pk['streams'].values()) / n)} per run "
            f"(all streams) "
            f"| <= 10 KB | {_verdict(sper <= TARGET_SERVER_PER_RUN)} |"
        )
        if sb:
            sper2 = (sb["srv_rss_after"] - sb["srv_rss_before"]) / n
            add(
                f"| nats-server RSS per parked run, burst {sb['burst']} "
                f"({sb['burst'] * n:,} parked in all) "
                f"| {_b(sper2)} ({_b(sb['srv_rss_before'])} -> {_b(sb['srv_rss_after'])}) "
                f"| — | <= 10 KB | {_verdict(sper2 <= TARGET_SERVER_PER_RUN)} |"
            )
    for key, what in (("timer", "timer lateness"), ("timer_low", "timer lateness, control")):
        tm = res.get(key)
        if not tm:
            continue
        lt = tm["lateness"]
        raw = res.get("raw_" + key)
        ref = (
            f"raw `@at` schedules, same count and spread, no consumer: {_p(raw['lateness'])}"
            if raw
            else "—"
        )
        add(
            f"| {what}: {tm['n']:,} runs due over {tm['spread']:g} s, WaitCompleted.at - "
            f"deadline, p50 / p90 / p99 / max | {_p(lt['total'])} | {ref} "
            f"| p99 <= 300 ms | {_verdict(lt['total']['p99'] <= TARGET_TIMER_P99)} |"
        )
        add(
            f"| {what}: the fired wake reached the worker (deadline -> activation's lease "
            f"stamp) | {_p(lt['to_worker_total'])} | deadline -> wake stored by the scheduler "
            f"(same runs): {_p(lt['fired'])} | — | — |"
        )
    sg = res.get("signal")
    fl = res.get("signal_floor")
    if sg:
        ref = "—"
        if fl:
            ref = (
                f"publish -> pull consumer -> CAS append seen: "
                f"{_p(fl['hop'], ('p50', 'p90', 'p99'))}; publish, then CAS append (one task): "
                f"{_p(fl['direct'], ('p50', 'p90', 'p99'))}"
            )
        ob = sg["observed"]
        ratio = f" ({ob['p50'] / fl['hop']['p50']:.1f}x the hop floor)" if fl else ""
        add(
            f"| signal -> next StepStarted seen, 1 run x {sg['k']} rounds, p50 / p90 / p99 "
            f"| {_p(ob, ('p50', 'p90', 'p99'))}{ratio} | {ref} | p50 <= 5 ms "
            f"| {_verdict(ob['p50'] <= TARGET_SIGNAL_P50)} |"
        )
    add("")
    add("Details:")
    add("")
    add("| figure | value |")
    add("|---|---|")
    if pk:
        add(f"| parking: worker idle (`_active` empty) after the burst | {pk['idle_time']:.2f} s |")
        add(f"| parking: activations for {pk['n']:,} runs | {pk['activations']:,} |")
        for mb in pk.get("more", []):
            add(
                f"| parking, burst {mb['burst']}: time to park; RSS growth per run, this "
                f"process / nats-server; allocated blocks per run; `len(worker._active)` after "
                f"| {mb['park_time']:.2f} s ({mb['rate']:,.0f} runs/s); "
                f"{_b((mb['py_rss_after'] - mb['py_rss_before']) / n)} / "
                f"{_b((mb['srv_rss_after'] - mb['srv_rss_before']) / n)}; "
                f"{mb['py_blocks_delta'] / n:+.2f}; {mb['active_after']} |"
            )
        if pk.get("py_rss_trimmed"):
            add(
                f"| parking: worker process RSS after `malloc_trim(0)` (freed C heap returned), "
                f"per run above the baseline | {_b(pk['py_rss_trimmed'])}, "
                f"{_b((pk['py_rss_trimmed'] - pk['py_rss_before']) / pk['n'])} |"
            )
        add(
            f"| parking: CPU per parked run, Python process / nats-server "
            f"| {pk['py_cpu_per_run'] * 1e6:,.0f} µs / {pk['srv_cpu_per_run'] * 1e6:,.0f} µs |"
        )
        add(
            f"| parking: sampled `client.state` reads that say `waiting` | {pk['sample_waiting']} |"
        )
        for k, st in pk["streams"].items():
            add(
                f"| server streams after parking: {k} | {st['messages']:,} msgs, "
                f"{_b(st['bytes'])}, {st['subjects']:,} subjects |"
            )
    if heap:
        for site in heap["sites"]:
            add(
                f"| tracemalloc: retained at {site['where']} | {_b(site['bytes'])} "
                f"({site['blocks']:+,} blocks, {site['bytes'] / heap['n']:.0f} B per run) |"
            )
        add(f"| tracemalloc pass: `_active` after | {heap['active']} |")
    for key, what in (("timer", "timers"), ("timer_low", "timers (control)")):
        tm = res.get(key)
        if not tm:
            continue
        lt = tm["lateness"]
        raw = res.get("raw_" + key)
        add(
            f"| {what}: runs measured / deadline passed before the wait was recorded "
            f"| {tm['measured']:,} / {tm['not_parked_in_time']:,} (first deadline "
            f"{tm['lead']:.1f} s after the burst; all parked after {tm['parked_after']:.1f} s) |"
        )
        if raw:
            add(
                f"| {what}: raw schedules fired per second while catching up / margin before "
                f"the first deadline | {raw['rate']:,.0f}/s / {raw['margin']:.1f} s "
                f"({raw['fired']:,} of {raw['n']:,} read back) |"
            )
        add(
            f"| {what}: deadline -> wake stored (scheduler), p50 / p90 / p99 / max "
            f"| {_p(lt['fired'])} ({tm['fired_seen']:,} fired wakes read back) |"
        )
        add(
            f"| {what}: wake stored -> activation's lease stamp, p50 / p90 / p99 / max "
            f"| {_p(lt['to_worker'])} |"
        )
        add(
            f"| {what}: lease stamp -> WaitCompleted stamped, p50 / p90 / p99 / max "
            f"| {_p(lt['to_decided'])} |"
        )
        add(
            f"| {what}: deadline -> RunCompleted seen (durable end), p50 / p90 / p99 / max "
            f"| {_p(lt['durable'])} |"
        )
        add(
            f"| {what}: completion rate, first deadline -> last WaitCompleted "
            f"| {tm['drain_rate']:,.0f} runs/s over {tm['drain_time']:.2f} s "
            f"(deadlines fall at {tm['n'] / max(tm['spread'], 1e-9):,.0f}/s) |"
        )
        add(
            f"| {what}: CPU per run while firing, Python / nats-server "
            f"| {tm['py_cpu_per_run'] * 1e6:,.0f} µs / {tm['srv_cpu_per_run'] * 1e6:,.0f} µs |"
        )
        add(
            f"| {what}: activations after the park beyond the one that completed it "
            f"| {tm['extra_activations']} |"
        )
        add(
            f"| {what}: runs woken by the worker's in-process timers (the rest by the "
            f"broker's copy) | {tm.get('woken_in_process', 0):,} of {tm['measured']:,} |"
        )
    if sg:
        add(
            f"| signal: StepStarted.at (worker stamp) - before client.signal, p50 / p90 / p99 "
            f"| {_p(sg['stamped'], ('p50', 'p90', 'p99'))} |"
        )
        add(
            f"| signal: first {sg['tenth']} rounds vs last {sg['tenth']} rounds, p50 "
            f"| {fmt_ms(sg['first']['p50'])} vs {fmt_ms(sg['last']['p50'])} |"
        )
        add(
            f"| signal: the looping run's history at the end: full load (`EventStore.load`) / "
            f"last message only | {sg['history_msgs']} msgs: {fmt_ms(sg['load'])} "
            f"({sg['load'] / max(sg['history_msgs'], 1) * 1e6:,.0f} µs per msg) / "
            f"{fmt_ms(sg['load_last'])} |"
        )
        add(
            f"| signal: fold of that history / Activation built and replayed to its park "
            f"({sg['replayed_msgs']} msgs, no I/O) | {fmt_ms(sg['fold'])} / "
            f"{fmt_ms(sg['replay'])} |"
        )
        add("")
        add("Signal -> next step, where the time goes (p50 of each phase; same clock):")
        add("")
        add(
            f"| phase | all {sg['k']} rounds | first {sg['tenth']} rounds "
            f"| last {sg['tenth']} rounds |"
        )
        add("|---|---|---|---|")
        for p, v in sg["phases"].items():
            add(
                f"| {p} | {fmt_ms(v)} | {fmt_ms(sg['phases_first'][p])} "
                f"| {fmt_ms(sg['phases_last'][p])} |"
            )
    tm = res.get("timer")
    if tm and tm.get("profile"):
        add("")
        add("```")
        add(tm["profile"].rstrip())
        add("```")
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    facts = run_facts(cfg.store_dir)
    t0 = time.perf_counter()
    res = await run_all(cfg, log)
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, res))
    print(f"\n(bench took {elapsed:.0f} s)")
    return {"config": cfg.__dict__, "machine": facts, "results": res}


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
