"""Recurring-schedules benchmark (issue 14): start lateness of N ``--every`` schedules against the
raw JetStream message schedules they are built on, measured in the same run on the same server,
and what a pending schedule costs the server.

Run from the repository root::

    python -m bench.schedules            # ~6 min: 1,000 schedules every 10 s for 2 min, each side
    python -m bench.schedules --quick    # ~45 s: 100 schedules every 2 s for 12 s

It starts its own ``EmbeddedServer`` (free loopback port, temp dir, ``sync_interval: always``,
sojourn's default) and gives every phase its own ``Settings`` prefix. Nothing in the runtime is
patched or wrapped: every instant is a stored message's server timestamp (JetStream metadata),
an event stamp written by the worker (``RunStarted.at``), or the moment this process received a
message; all on one machine and clock. Fire times are epoch-anchored as sojourn's ``--every``
is: every schedule fires at each multiple of the interval, so N fires fall due at the same
instant, every interval. Each side is measured over a window of ``--duration`` seconds that
starts at the first multiple of the interval after every schedule of the side exists; a fire is
in the window when its nominal time is.

1. **Raw** (``raw``): N one-shot message schedules (``Nats-Schedule: @at <T>``) on
   ``<p>.schedule.timer.<name>`` targeting ``<p>.schedule.fire.<agent>.<name>``, in a stream
   created from ``stream_configs(...)``'s schedules stream (limits, one message per subject,
   ``allow_msg_schedules``), pulled through a durable consumer configured like a worker's
   ``fire-<agent>`` one (``fire_consumer_config``). This process re-arms each schedule when its
   fire arrives (``@at`` nominal + interval, same subject) and acks the fire, several fires in
   flight at once: what sojourn does underneath, minus sojourn (no schedule record, no run).
   Lateness = the fired message's stored timestamp (its delivery metadata) - the nominal time;
   also received by this process - nominal.
2. **Native** ``@every`` (``native``, optional): N ``@every <interval>s`` schedules kept by the
   server itself, the same consumer. They are anchored on their creation, not the epoch, so
   they have no nominal time: the figure is the spacing of consecutive fires of one schedule.
3. **sojourn** (``sojourn``): ``Client.add_schedule(name, agent="sched_bench", every="<I>s")``
   N times, served by one worker process (``python -m tests.apps.run_worker ... bench.schedules``,
   default concurrency) running ``sched_bench``, an agent whose body does nothing. After the
   window the bench reads the events stream back: lateness = ``RunStarted.at`` -
   ``RunStarted.scheduled_at`` (the nominal fire time; the run id derives from it); also the
   stored timestamp of that first append - nominal. Runs per schedule are counted in the window:
   a fire that started two runs (two ``RunStarted`` on one run's subject) or none is reported.
   Then the schedules are deleted.
4. **Server memory per schedule**: nats-server's RSS (``/proc/<pid>/status`` VmRSS) with N
   schedules pending minus just before they were created, / N; and the stream's bytes and
   messages per schedule (``STREAM.INFO``). Go's heap does not give memory back at once, so
   the later phases of a round may reuse what an earlier one freed: each side's figure is
   taken on a server that already ran the earlier phases, and is noisy at N = 1,000 (a few MB).
   ``--memory-schedules M`` also creates M pending schedules of each kind on fresh servers of
   their own (first fire an hour away; sojourn with its worker up), for a cleaner figure.

CPU per fire over the window (``/proc``, user+sys): of the process that handles the fires (this
one for raw, the worker for sojourn) and of nats-server. ``--repeats R`` runs the rounds R times
(raw, native, sojourn, raw, ...), each on a fresh prefix; the tables show medians of the
per-round figures. It is a benchmark, not a test: it asserts nothing and prints markdown (and
JSON with ``--json FILE``, ``--json -`` for stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Context, agent
from sojourn.broker import Broker, Delivery, EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.follow import read_all
from sojourn.broker.names import Names
from sojourn.broker.timers import rfc3339
from sojourn.broker.topology import fire_consumer_config, stream_configs
from sojourn.schemas.codec import decode_events
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted

from .trace import gather_limited
from .util import (
    cpu_process,
    cpu_server,
    loadavg,
    log,
    pct,
    run_bench,
    run_facts,
    start_worker,
    worker_ready,
)
from .waits import rss, stream_state

SECTIONS = ("raw", "native", "sojourn")
AGENT = "sched_bench"
APP = "bench.schedules"  # the worker process serves the agents of this module
FIRE_AT = "Bench-Fire-At"  # the raw side's nominal fire time (unix seconds), like Sojourn-Fire-At
Log = Callable[[str], None]


@agent(AGENT)
async def sched_bench(ctx: Context) -> None:
    """Does nothing: the run's start is what is measured."""
    return None


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    schedules: int = 1_000
    every: int = 10
    duration: float = 120.0
    native_duration: float = 60.0
    repeats: int = 1
    memory_schedules: int = 0
    sync_interval: str = "always"
    sections: tuple[str, ...] = SECTIONS
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.schedules",
        description="sojourn recurring schedules: start lateness against raw JetStream message "
        "schedules in the same run, and server memory per schedule (markdown tables)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="~45 s version: 100 schedules every 2 s for 12 s (native: 8 s)",
    )
    p.add_argument("--schedules", "-n", type=int, help="schedules per side (default 1,000)")
    p.add_argument(
        "--every",
        type=int,
        help="interval in whole seconds, epoch-anchored (default 10)",
    )
    p.add_argument(
        "--duration",
        type=float,
        help="seconds each side is measured for (default 120: 12 fires per schedule)",
    )
    p.add_argument(
        "--native-duration",
        type=float,
        help="seconds the native @every schedules run (default 60)",
    )
    p.add_argument("--repeats", type=int, default=1, help="rounds of every section (default 1)")
    p.add_argument(
        "--memory-schedules",
        type=int,
        default=0,
        metavar="M",
        help="also measure the server memory of M pending schedules of each kind, each on a "
        "fresh server (default 0: skip)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help="run only this section (raw, native or sojourn); repeat to pick several",
    )
    p.add_argument(
        "--sync-interval",
        default="always",
        help="the server's JetStream sync_interval (default 'always', sojourn's default; '2m' is "
        "NATS's)",
    )
    p.add_argument("--store-dir", help="parent directory for the server's temp store")
    p.add_argument(
        "--json", dest="json_out", help="also write all figures to this JSON file ('-': stdout)"
    )
    a = p.parse_args(argv)
    c = Config(quick=a.quick)
    if a.quick:
        c.schedules, c.every, c.duration, c.native_duration = 100, 2, 12.0, 8.0
    c.schedules = a.schedules or c.schedules
    c.every = a.every or c.every
    if c.every < 1:
        p.error("--every must be a whole number of seconds >= 1")
    c.duration = a.duration or c.duration
    c.native_duration = a.native_duration or c.native_duration
    if c.duration < c.every:
        p.error("--duration must cover at least one interval")
    c.repeats = max(1, a.repeats)
    c.memory_schedules = max(0, a.memory_schedules)
    c.sections = tuple(x for x in SECTIONS if not a.only or x in a.only)
    c.sync_interval = a.sync_interval
    c.store_dir = a.store_dir
    c.json_out = a.json_out
    return c


# --- helpers ------------------------------------------------------------------------------------


def _stats(xs: list[float]) -> dict[str, float]:
    return {
        "n": float(len(xs)),
        "p50": pct(xs, 50),
        "p90": pct(xs, 90),
        "p99": pct(xs, 99),
        "max": max(xs, default=float("nan")),
        "min": min(xs, default=float("nan")),
        "mean": statistics.fmean(xs) if xs else float("nan"),
    }


def _by_fire(pairs: list[tuple[float, float]]) -> list[dict[str, float]]:
    """(nominal, lateness) pairs grouped by nominal instant: each burst's count, p50 and max."""
    groups: dict[float, list[float]] = defaultdict(list)
    for nominal, late in pairs:
        groups[nominal].append(late)
    return [
        {"nominal": t, "n": float(len(v)), "p50": pct(v, 50), "max": max(v)}
        for t, v in sorted(groups.items())
    ]


def _names(n: int) -> list[str]:
    return [f"s{i:05d}" for i in range(n)]


def _window(after: float, every: int, duration: float) -> tuple[float, float, int]:
    """The first multiple of ``every`` at least 0.5 s after ``after``, the window's end, and
    how many fires of one schedule fall in it."""
    start = math.ceil((after + 0.5) / every) * every
    fires = math.ceil(duration / every)
    return float(start), float(start + fires * every), fires


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.time()))


def _cpu(pid: int | None) -> float:
    return cpu_process() if pid is None else cpu_server(pid)


class Sampler:
    """CPU seconds of the fires' handler and of the server over the window."""

    def __init__(self, handler_pid: int | None, server_pid: int | None) -> None:
        self.handler_pid = handler_pid
        self.server_pid = server_pid
        self.h0 = self.s0 = self.h1 = self.s1 = float("nan")

    def start(self) -> None:
        self.h0, self.s0 = _cpu(self.handler_pid), cpu_server(self.server_pid)

    def stop(self) -> None:
        self.h1, self.s1 = _cpu(self.handler_pid), cpu_server(self.server_pid)

    def per(self, fires: int) -> dict[str, float]:
        f = max(fires, 1)
        return {"handler": (self.h1 - self.h0) / f, "server": (self.s1 - self.s0) / f}


async def _settled_rss(pid: int | None) -> int:
    """The server's RSS once it has been idle for a moment (its writes flushed)."""
    await asyncio.sleep(1.0)
    return rss(pid)


def _schedules_stream(names: Names, settings: Settings) -> dict[str, Any]:
    """sojourn's schedules stream config, for a prefix of the bench's own."""
    return next(c for c in stream_configs(names, settings) if c["name"] == names.schedules_stream)


async def _arm(b: Broker, names: Names, name: str, schedule: str, fire_at: float | None) -> None:
    headers = {
        h.SCHEDULE: schedule,
        h.SCHEDULE_TARGET: names.schedule_fire(AGENT, name),
    }
    if fire_at is not None:
        headers[FIRE_AT] = str(int(fire_at))
    await b.publish(names.schedule_timer(name), b"", headers)


class FireConsumer:
    """Pulls ``fire-<agent>`` and hands each fire to ``handle``, up to ``width`` at once, while
    the next fetch is already waiting (a batch does not wait for the slowest fire in it)."""

    def __init__(self, b: Broker, names: Names, handle: Callable[[Delivery, float], Any]) -> None:
        self.b = b
        self.names = names
        self.handle = handle
        self._task: asyncio.Task[None] | None = None
        self._stop = False
        self._sem = asyncio.Semaphore(512)
        self._inflight: set[asyncio.Task[None]] = set()

    async def start(self, settings: Settings) -> None:
        await self.b.ensure_consumer(
            self.names.schedules_stream, fire_consumer_config(self.names, settings, AGENT)
        )
        self._pull = await self.b.pull(self.names.schedules_stream, self.names.fire_consumer(AGENT))
        self._task = asyncio.create_task(self._loop())

    async def _one(self, d: Delivery, now: float) -> None:
        try:
            await self.handle(d, now)
        finally:
            self._sem.release()

    async def _loop(self) -> None:
        while not self._stop:
            batch = await self._pull.fetch(256, timeout=0.25)
            now = time.time()
            for d in batch:
                await self._sem.acquire()
                t = asyncio.create_task(self._one(d, now))
                self._inflight.add(t)
                t.add_done_callback(self._inflight.discard)

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._pull.close()


async def _delete_stream(b: Broker, stream: str) -> None:
    with contextlib.suppress(Exception):
        await b.api(f"$JS.API.STREAM.DELETE.{stream}")


# --- 1. raw one-shot schedules, re-armed by a plain client ----------------------------------------


async def raw_round(url: str, cfg: Config, server_pid: int | None, log: Log) -> dict[str, Any]:
    n, every = cfg.schedules, cfg.every
    settings = Settings(prefix=f"rs{uuid.uuid4().hex[:8]}")
    names = Names(settings.prefix)
    b = await Broker.connect(url, name="bench-raw-schedules")
    stored: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    window = [0.0, 0.0]
    expected = n * math.ceil(cfg.duration / every)
    count = [0]
    all_in = asyncio.Event()

    async def handle(d: Delivery, received: float) -> None:
        nominal = float(d.header(FIRE_AT, "0") or 0)
        name = names.subject_token(d.subject, 3)
        stored[name].append((nominal, d.timestamp.timestamp(), received))
        count[0] += 1
        if count[0] >= expected:
            all_in.set()
        nxt = nominal + every
        if nxt < window[1]:
            await _arm(b, names, name, f"@at {rfc3339(nxt)}", nxt)
        await d.ack()

    fc = FireConsumer(b, names, handle)
    try:
        await b.ensure_stream(_schedules_stream(names, settings))
        await fc.start(settings)
        mem0 = await _settled_rss(server_pid)
        lead = 1.0 + n / 1000  # arming is ~1-2k publishes/s at sync_interval always
        w0, w1, k = _window(time.time() + lead, every, cfg.duration)
        window[:] = [w0, w1]
        log(f"raw: arming {n} @at schedules, first fire in {w0 - time.time():.1f} s, {k} each")
        t0 = time.perf_counter()
        await gather_limited([_arm(b, names, s, f"@at {rfc3339(w0)}", w0) for s in _names(n)], 256)
        arm_s = time.perf_counter() - t0
        if time.time() > w0:
            log("raw: WARNING: arming ended after the first fire was due")
        mem1 = rss(server_pid)
        st1 = await stream_state(b, names.schedules_stream)
        cpu = Sampler(None, server_pid)
        await _sleep_until(w0 - 0.2)
        cpu.start()
        await _sleep_until(w1 - 0.2)
        cpu.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), max(0.0, w1 + 60 - time.time()))
        mem2 = rss(server_pid)
        await fc.stop()
        st2 = await stream_state(b, names.schedules_stream)
        await _delete_stream(b, names.schedules_stream)
    finally:
        with contextlib.suppress(Exception):
            await fc.stop()
        await b.close()
    in_window = [x for v in stored.values() for x in v if w0 <= x[0] < w1]
    per = Counter(name for name, v in stored.items() for x in v if w0 <= x[0] < w1)
    return {
        "n": n,
        "every": every,
        "fires_per_schedule": k,
        "expected": expected,
        "fired": len(in_window),
        "twice": sum(1 for name, v in stored.items() if len({x[0] for x in v}) < len(v)),
        "short": sum(1 for s in _names(n) if per.get(s, 0) < k),
        "arm_seconds": arm_s,
        "lateness_stored": _stats([x[1] - x[0] for x in in_window]),
        "lateness_received": _stats([x[2] - x[0] for x in in_window]),
        "lateness_later": _stats([x[1] - x[0] for x in in_window if x[0] > w0]),
        "by_fire": _by_fire([(x[0], x[1] - x[0]) for x in in_window]),
        "cpu_per_fire": cpu.per(len(in_window)),
        "memory": {
            "rss_before": mem0,
            "rss_pending": mem1,
            "rss_end": mem2,
            "per_schedule": (mem1 - mem0) / n,
            "stream_pending": st1,
            "stream_end": st2,
            "stream_bytes_per_schedule": st1["bytes"] / n,
        },
    }


# --- 2. native @every schedules -------------------------------------------------------------------


async def native_round(url: str, cfg: Config, server_pid: int | None, log: Log) -> dict[str, Any]:
    n, every = cfg.schedules, cfg.every
    settings = Settings(prefix=f"ns{uuid.uuid4().hex[:8]}")
    names = Names(settings.prefix)
    b = await Broker.connect(url, name="bench-native-schedules")
    fires: dict[str, list[float]] = defaultdict(list)

    async def handle(d: Delivery, _received: float) -> None:
        fires[names.subject_token(d.subject, 3)].append(d.timestamp.timestamp())
        await d.ack()

    fc = FireConsumer(b, names, handle)
    try:
        await b.ensure_stream(_schedules_stream(names, settings))
        await fc.start(settings)
        log(f"native: {n} '@every {every}s' schedules for {cfg.native_duration:g} s")
        created = time.time()
        await gather_limited([_arm(b, names, s, f"@every {every}s", None) for s in _names(n)], 256)
        armed = time.time()
        # half an interval past the end: every schedule's last fire in the span has come
        await _sleep_until(created + cfg.native_duration + every / 2)
        await _delete_stream(b, names.schedules_stream)  # stops them
        await fc.stop()
    finally:
        with contextlib.suppress(Exception):
            await fc.stop()
        await b.close()
    gaps = [y - x for v in fires.values() for x, y in zip(sorted(v), sorted(v)[1:], strict=False)]
    first = [min(v) - created for v in fires.values() if v]
    return {
        "n": n,
        "every": every,
        "duration": cfg.native_duration,
        "arm_seconds": armed - created,
        "fired": sum(len(v) for v in fires.values()),
        "expected_about": n * int(cfg.native_duration // every),  # the first after 1 interval
        "spacing": _stats(gaps),
        "spacing_error": _stats([abs(g - every) for g in gaps]),
        "first_after_creation": _stats(first),
    }


# --- 3. sojourn schedules served by a worker process ----------------------------------------------


class WorkerProc:
    """``python -m tests.apps.run_worker URL PREFIX bench.schedules TTL`` in its own process,
    output to a file (a chatty worker never blocks on a full pipe)."""

    def __init__(self, url: str, prefix: str, logdir: Path, ttl: float = 30.0) -> None:
        self.log_path = logdir / f"worker-{prefix}.log"
        self._out = open(self.log_path, "wb")  # closed by stop()
        self.proc = start_worker(url, prefix, APP, ttl, self._out)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def ready(self, timeout: float = 60.0) -> WorkerProc:
        await worker_ready(self.proc, self.log_path, timeout, 0.02)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()

    def tail(self, lines: int = 20) -> list[str]:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return []


@dataclass
class Started:
    run_id: str
    schedule: str
    nominal: float
    at: float
    stored: float


async def _started_runs(b: Broker, names: Names) -> tuple[list[Started], Counter[str]]:
    """Every ``RunStarted`` in the events stream, and how many each run's subject holds."""
    out: list[Started] = []
    per_run: Counter[str] = Counter()
    for m in await read_all(b, names.events_stream, names.events_all):
        for e in decode_events(m.data):
            if isinstance(e, RunStarted):
                per_run[e.run_id] += 1
                sched = getattr(e, "schedule", None) or e.run_id.rsplit("-at", 1)[0]
                nominal = getattr(e, "scheduled_at", None)
                if nominal is None:
                    nominal = _nominal_from_run_id(e.run_id)
                out.append(Started(e.run_id, sched, float(nominal), e.at, m.time))
    return out, per_run


def _nominal_from_run_id(run_id: str) -> float:
    """``<schedule>-at<YYYYMMDDTHHMMSS>Z`` -> unix seconds (NaN when it is not of that form)."""
    from datetime import UTC, datetime

    try:
        stamp = run_id.rsplit("-at", 1)[1]
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except (IndexError, ValueError):
        return float("nan")


async def sojourn_round(
    url: str, cfg: Config, server_pid: int | None, logdir: Path, log: Log
) -> dict[str, Any]:
    n, every = cfg.schedules, cfg.every
    settings = Settings(prefix=f"sj{uuid.uuid4().hex[:8]}")
    names = Names(settings.prefix)
    worker = WorkerProc(url, settings.prefix, logdir)
    client: Client | None = None
    b = await Broker.connect(url, name="bench-sojourn-schedules")
    deleted = 0
    try:
        await worker.ready()
        client = await Client.connect(url, settings=settings)
        mem0 = await _settled_rss(server_pid)
        wmem0 = rss(worker.pid)
        st0: dict[str, int] | None = None
        with contextlib.suppress(Exception):
            st0 = await stream_state(b, names.schedules_stream)
        log(f"sojourn: adding {n} schedules every {every}s")
        t0 = time.perf_counter()
        await gather_limited(
            [client.add_schedule(s, agent=AGENT, every=f"{every}s") for s in _names(n)], 64
        )
        add_s = time.perf_counter() - t0
        mem1 = rss(server_pid)
        wmem1 = rss(worker.pid)
        st1 = await stream_state(b, names.schedules_stream)
        w0, w1, k = _window(time.time(), every, cfg.duration)
        log(f"sojourn: window starts in {w0 - time.time():.1f} s, {k} fires each")
        cpu = Sampler(worker.pid, server_pid)
        await _sleep_until(w0 - 0.2)
        cpu.start()
        await _sleep_until(w1 - 0.2)
        cpu.stop()
        expected = n * k
        deadline = w1 + 60
        runs: list[Started] = []
        per_run: Counter[str] = Counter()
        while time.time() < deadline:
            runs, per_run = await _started_runs(b, names)
            if sum(1 for r in runs if w0 <= r.nominal < w1) >= expected:
                break
            await asyncio.sleep(2.0)
        mem2 = rss(server_pid)
        wmem2 = rss(worker.pid)
        st2 = await stream_state(b, names.schedules_stream)
        counts: dict[str, int] = {}
        with contextlib.suppress(Exception):  # every record's fire counts, since creation
            for rec in await client.schedules():
                for key, v in _plain(rec.counts).items():
                    counts[key] = counts.get(key, 0) + int(v)
        log(f"sojourn: deleting {n} schedules")
        results = await gather_limited([_quietly(client.delete_schedule(s)) for s in _names(n)], 64)
        deleted = sum(1 for r in results if r)
        runs, per_run = await _started_runs(b, names)  # also any that started meanwhile
    finally:
        if client is not None:
            await client.close()
        worker.stop()
        await b.close()
    in_window = [r for r in runs if w0 <= r.nominal < w1]
    per_sched = Counter(r.schedule for r in in_window)
    before = [r for r in runs if r.nominal < w0]
    return {
        "n": n,
        "every": every,
        "fires_per_schedule": k,
        "expected": expected,
        "started": len({r.run_id for r in in_window}),
        "twice": sum(1 for c in per_run.values() if c > 1),
        "short": sum(1 for s in _names(n) if per_sched.get(s, 0) < k),
        "extra": sum(1 for s in _names(n) if per_sched.get(s, 0) > k),
        "before_window": len(before),
        "after_window": sum(1 for r in runs if r.nominal >= w1),
        "add_seconds": add_s,
        "deleted": deleted,
        "lateness_at": _stats([r.at - r.nominal for r in in_window]),
        "lateness_stored": _stats([r.stored - r.nominal for r in in_window if r.stored]),
        "lateness_later": _stats([r.at - r.nominal for r in in_window if r.nominal > w0]),
        # every burst, also those before the window (schedules created before it fire there)
        # and after it (until they are deleted): a slow first burst shows here
        "by_fire": _by_fire([(r.nominal, r.at - r.nominal) for r in runs]),
        "window": [w0, w1],
        "cpu_per_fire": cpu.per(len(in_window)),
        "memory": {
            "rss_before": mem0,
            "rss_pending": mem1,
            "rss_end": mem2,
            "per_schedule": (mem1 - mem0) / n,
            "stream_before": st0,
            "worker_rss": [wmem0, wmem1, wmem2],
            "stream_pending": st1,
            "stream_end": st2,
            "stream_bytes_per_schedule": st1["bytes"] / n,
        },
        "record_counts": counts,
        "worker_log_tail": worker.tail(10),
    }


async def _quietly(coro: Any) -> bool:
    try:
        await coro
        return True
    except Exception:
        return False


def _plain(x: Any) -> Any:
    """A record as JSON-able data (msgspec structs, dataclasses, pydantic models)."""
    import msgspec

    with contextlib.suppress(Exception):
        return msgspec.to_builtins(x)
    with contextlib.suppress(Exception):
        return asdict(x)
    return repr(x)


# --- 4. memory of many pending schedules, each kind on a fresh server ---------------------------


async def memory_fresh(cfg: Config, parent: str | None, log: Log) -> dict[str, Any]:
    """M pending schedules of each kind, each kind on a server of its own that ran nothing else:
    raw ``@at`` messages, then sojourn schedules (a worker process serves the requests; their
    first fire is up to an hour away, so nothing fires while the memory is read)."""
    m = cfg.memory_schedules
    out: dict[str, Any] = {"n": m}
    for kind in ("raw", "sojourn"):
        with tempfile.TemporaryDirectory(prefix="sojourn-schedmem-", dir=parent) as tmp:
            srv = EmbeddedServer(
                store_dir=Path(tmp) / "store", port=0, sync_interval=cfg.sync_interval
            )
            async with srv:
                settings = Settings(prefix=f"m{kind[0]}{uuid.uuid4().hex[:8]}")
                names = Names(settings.prefix)
                b = await Broker.connect(srv.url, name="bench-schedule-memory")
                client: Client | None = None
                worker: WorkerProc | None = None
                try:
                    if kind == "raw":
                        await b.ensure_stream(_schedules_stream(names, settings))
                    else:
                        worker = await WorkerProc(srv.url, settings.prefix, Path(tmp)).ready()
                        client = await Client.connect(srv.url, settings=settings)
                    mem0 = await _settled_rss(srv.pid)
                    at = math.ceil(time.time() / 3600 + 1) * 3600.0
                    log(f"memory: {m} pending {kind} schedules on a fresh server")
                    coros: list[Coroutine[Any, Any, object]]
                    if client is None:
                        coros = [_arm(b, names, s, f"@at {rfc3339(at)}", at) for s in _names(m)]
                    else:
                        coros = [
                            client.add_schedule(s, agent=AGENT, every="3600s") for s in _names(m)
                        ]
                    await gather_limited(coros, 64 if client else 256)
                    mem1 = await _settled_rss(srv.pid)
                    st = await stream_state(b, names.schedules_stream)
                    out[kind] = {
                        "rss_before": mem0,
                        "rss_pending": mem1,
                        "per_schedule": (mem1 - mem0) / m,
                        "stream": st,
                        "stream_bytes_per_schedule": st["bytes"] / m,
                    }
                finally:
                    if client is not None:
                        await client.close()
                    if worker is not None:
                        worker.stop()
                    await b.close()
    return out


# --- the whole run --------------------------------------------------------------------------------


async def run_all(cfg: Config, log: Log) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": loadavg(), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="sojourn-sched-", dir=cfg.store_dir) as tmp:
        async with EmbeddedServer(
            store_dir=Path(tmp) / "store", port=0, sync_interval=cfg.sync_interval
        ) as srv:
            for r in range(cfg.repeats):
                rnd: dict[str, Any] = {"load": loadavg()}
                if "raw" in cfg.sections:
                    rnd["raw"] = await raw_round(srv.url, cfg, srv.pid, log)
                if "native" in cfg.sections:
                    rnd["native"] = await native_round(srv.url, cfg, srv.pid, log)
                if "sojourn" in cfg.sections:
                    rnd["sojourn"] = await sojourn_round(srv.url, cfg, srv.pid, Path(tmp), log)
                out["rounds"].append(rnd)
                log(f"round {r + 1}/{cfg.repeats} done")
    if cfg.memory_schedules:
        out["memory_fresh"] = await memory_fresh(cfg, cfg.store_dir, log)
    out["load_after"] = loadavg()
    return out


# --- report -----------------------------------------------------------------------------------


def _med(rounds: list[dict[str, Any]], *path: str) -> float:
    vals: list[float] = []
    for r in rounds:
        x: Any = r
        for p in path:
            if not isinstance(x, dict) or p not in x:
                x = None
                break
            x = x[p]
        if isinstance(x, int | float) and x == x:
            vals.append(float(x))
    return statistics.median(vals) if vals else float("nan")


def _ms(s: float) -> str:
    return "—" if s != s else f"{s * 1e3:,.1f} ms"


def _us(s: float) -> str:
    return "—" if s != s else f"{s * 1e6:,.0f} µs"


def _bytes(n: float) -> str:
    if n != n:
        return "—"
    if abs(n) >= 1024 * 1024:
        return f"{n / 1024 / 1024:,.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:,.1f} KiB"
    return f"{n:,.0f} B"


def _n(x: float, fmt: str = ",.0f") -> str:
    return "—" if x != x else format(x, fmt)


def _ratio(a: float, b: float) -> str:
    if a != a or b != b or b <= 0:
        return "—"
    return f"{a / b:,.1f}x"


def render(cfg: Config, facts: dict[str, str], res: dict[str, Any]) -> str:
    rounds = res["rounds"]
    lines: list[str] = []
    add = lines.append
    add(
        f"## Schedules: {cfg.schedules:,} schedules every {cfg.every} s for {cfg.duration:g} s, "
        f"sync_interval {cfg.sync_interval}"
        f" ({cfg.repeats} round{'s' if cfg.repeats > 1 else ''}; medians of per-round figures)"
    )
    add("")
    add("Machine: " + "; ".join(f"{k} {v}" for k, v in facts.items()))
    add(f"Load average before / after: {res['load_before']} / {res['load_after']}")
    add("")
    raw = [r["raw"] for r in rounds if "raw" in r]
    sj = [r["sojourn"] for r in rounds if "sojourn" in r]
    nat = [r["native"] for r in rounds if "native" in r]

    def m(side: list[dict[str, Any]], *path: str) -> float:
        return _med(side, *path)

    add("| measurement | raw JetStream (same server, same run) | sojourn | ratio |")
    add("|---|---|---|---|")
    for q in ("p50", "p90", "p99", "max"):
        a, s = m(raw, "lateness_stored", q), m(sj, "lateness_at", q)
        add(
            f"| start lateness {q} (raw: fire stored; sojourn: `RunStarted.at`) - nominal "
            f"| {_ms(a)} | {_ms(s)} | {_ratio(s, a)} |"
        )
    for q in ("p50", "p99"):
        a, s = m(raw, "lateness_received", q), m(sj, "lateness_stored", q)
        add(
            f"| {q}: raw fire received by the client / sojourn `RunStarted` stored - nominal "
            f"| {_ms(a)} | {_ms(s)} | {_ratio(s, a)} |"
        )
    for q in ("p50", "p99"):
        a, s = m(raw, "lateness_later", q), m(sj, "lateness_later", q)
        add(
            f"| {q} without the window's first burst (as above) "
            f"| {_ms(a)} | {_ms(s)} | {_ratio(s, a)} |"
        )
    k = math.ceil(cfg.duration / cfg.every)
    add(
        f"| fires in the window (expected: {k} per schedule) "
        f"| {_n(m(raw, 'fired'))} ({_n(m(raw, 'expected'))}) "
        f"| {_n(m(sj, 'started'))} runs ({_n(m(sj, 'expected'))}) | |"
    )
    add(
        f"| schedules short of {k} fires / fired twice "
        f"| {_n(m(raw, 'short'))} / {_n(m(raw, 'twice'))} "
        f"| {_n(m(sj, 'short'))} / {_n(m(sj, 'twice'))} runs started twice, "
        f"{_n(m(sj, 'extra'))} with extra runs | |"
    )
    add(
        f"| CPU per fire: the handler (raw: this client; sojourn: the worker process) "
        f"| {_us(m(raw, 'cpu_per_fire', 'handler'))} | {_us(m(sj, 'cpu_per_fire', 'handler'))} "
        f"| {_ratio(m(sj, 'cpu_per_fire', 'handler'), m(raw, 'cpu_per_fire', 'handler'))} |"
    )
    add(
        f"| CPU per fire: nats-server | {_us(m(raw, 'cpu_per_fire', 'server'))} "
        f"| {_us(m(sj, 'cpu_per_fire', 'server'))} "
        f"| {_ratio(m(sj, 'cpu_per_fire', 'server'), m(raw, 'cpu_per_fire', 'server'))} |"
    )
    add(
        f"| server RSS per pending schedule (this server) "
        f"| {_bytes(m(raw, 'memory', 'per_schedule'))} "
        f"| {_bytes(m(sj, 'memory', 'per_schedule'))} | |"
    )
    add(
        f"| stream bytes per schedule (messages per schedule) "
        f"| {_bytes(m(raw, 'memory', 'stream_bytes_per_schedule'))} "
        f"({_n(m(raw, 'memory', 'stream_pending', 'messages') / cfg.schedules, '.1f')}) "
        f"| {_bytes(m(sj, 'memory', 'stream_bytes_per_schedule'))} "
        f"({_n(m(sj, 'memory', 'stream_pending', 'messages') / cfg.schedules, '.1f')}) | |"
    )
    add(
        f"| creating the N schedules | {_n(m(raw, 'arm_seconds'), '.2f')} s (publishes) "
        f"| {_n(m(sj, 'add_seconds'), '.2f')} s (`add_schedule`, 64 at a time) | |"
    )
    if nat:
        add("")
        add(
            f"Native `@every {cfg.every}s` ({cfg.schedules:,} schedules, "
            f"{cfg.native_duration:g} s, anchored on creation, so no nominal time): "
            f"{m(nat, 'fired'):,.0f} fires (~{m(nat, 'expected_about'):,.0f} expected); spacing "
            f"of consecutive fires p50 {m(nat, 'spacing', 'p50'):.3f} s, |spacing - "
            f"{cfg.every} s| p50 {_ms(m(nat, 'spacing_error', 'p50'))}, p99 "
            f"{_ms(m(nat, 'spacing_error', 'p99'))}, max {_ms(m(nat, 'spacing_error', 'max'))}."
        )
    mf = res.get("memory_fresh")
    if mf:
        add("")
        add(
            f"Fresh servers, {mf['n']:,} pending schedules each (first fire an hour away; sojourn "
            f"with its worker up): raw {_bytes(mf['raw']['per_schedule'])} RSS and "
            f"{_bytes(mf['raw']['stream_bytes_per_schedule'])} stream per schedule; sojourn "
            f"{_bytes(mf['sojourn']['per_schedule'])} RSS and "
            f"{_bytes(mf['sojourn']['stream_bytes_per_schedule'])} stream per schedule."
        )
    for i, r in enumerate(rounds):
        s = r.get("sojourn")
        if s and (s["short"] or s["twice"] or s["extra"]):
            add("")
            add(
                f"Round {i + 1}: {s['short']} schedules short of fires, {s['twice']} runs "
                f"started twice, {s['extra']} with extra runs; worker log tail:"
            )
            add("```")
            lines.extend(s["worker_log_tail"])
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
    out = {"config": cfg.__dict__, "machine": facts, "results": res}
    if cfg.json_out == "-":
        print(json.dumps(out, indent=1, default=str))
    return out


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), None if cfg.json_out == "-" else cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
