"""Read-side benchmark (issue 11): the projector, change messages, the SQLite model, token
streams and ``sojourn runs``, each against a raw JetStream (or raw SQLite) figure taken in the
same run on the same server.

Run from the repository root::

    python -m bench.readside            # ~6 min: every section; catch-up under both fsyncs
    python -m bench.readside --quick    # ~1.5 min: smaller sizes, same sections
    python -m bench.readside --only catchup --sync-interval always

Sections (``--only``, repeatable):

``catchup`` (for each ``--sync-interval``, default ``always`` then ``2m``, each on its own
``EmbeddedServer``): N runs x D decisions are appended with ``EventStore.append`` (valid
histories: ``[RunStarted, StepStarted]``, D-2 x ``[StepCompleted, StepStarted]``,
``[StepCompleted, RunCompleted]``, 500 runs at a time) with no projector up. Then
(a) a raw nats-py ordered push consumer over ``<prefix>.ev.>``, messages/s, and the
``StreamFollower`` (batched direct gets, what the projector's fold reads with); (b) a fresh
in-process ``Projector`` on an empty read side, from ``start()`` until ``written`` reaches the
stream's last sequence (every change message and KV view stored), decisions/s, without and
(on a second, identically filled prefix) with an ``SqliteModel``; (c) the first projector
stopped (it resigns, recording how far it wrote) and a new one started: time until its fold has
caught up, skipping every write. Paired raw: (d) concurrent JetStream publishes (1,024 in
flight, the projector's pipeline) of view-sized bodies with a ``Nats-Msg-Id`` into the changes
stream: the ceiling of anything that stores two messages per decision.

``lag`` (first ``--sync-interval`` only): a worker process (``tests.apps.run_worker`` serving
this module's agents) executes R concurrent runs of ``rs_steps`` (S steps, each sleeping
P seconds), a ``sojourn projector`` process (with its SQLite model, the default) writes the
views, and this process subscribes (core) to ``<prefix>.runs.>`` and, raw, to
``<prefix>.ev.*``. Lag = receive time - the decision's stored time in the events stream (read
back afterwards by direct get; the server's clock, same machine). The raw subscriber gets the
worker's publish itself; its lag can be negative (delivered before the stream stamps it).

``sqlite``: histories like the catch-up's, folded in memory with the real fold
(``summarize``/``close_decision``/``view_of``), applied to a fresh ``SqliteModel`` in batches
of 1,000 (the projector's page) and of 50; paired raw: aiosqlite ``executemany`` of the same
run and step row tuples (precomputed) into plain tables with the same primary keys, one
transaction per batch, same pragmas (WAL, ``synchronous=NORMAL``).

``chunk``: the worker process runs ``rs_stream``, one step calling ``ctx.stream`` T times,
G seconds apart; this process reads it with ``read_output`` (the client's reader) and with a
core subscription on the output subject; latency = receive time - ``Chunk.at`` (stamped by the
worker just before its publish). Paired raw: another process publishes (JetStream, awaited
ack, same pace) into the output stream, a core subscriber here; latency from the same kind of
stamp.

``listing``: an ``SqliteModel`` filled directly with K runs (10 agents; statuses and update
times spread over 7 days), a ``ListingService`` on it, ``list_runs`` round trips for no filter,
``--agent``, ``--status waiting``, ``--since 1h`` (limit 50, the CLI's default); the wall time
of ``sojourn runs`` subprocesses (Python start-up included), against ``python -c pass`` and
``python -c "import sojourn.actors.cli"``; paired raw: a NATS request/reply to a trivial
responder.

It is a benchmark, not a test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import nats

from sojourn.actors import Client, Context, agent
from sojourn.actors.client.listing import list_runs
from sojourn.actors.client.output import read_output
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.eventstore import EventStore
from sojourn.broker.follow import StreamFollower
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology
from sojourn.projections.listing import ListingService
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import Applied, SqliteModel
from sojourn.projections.summary import RunSummary, close_decision, summarize
from sojourn.projections.tables import run_row, step_rows
from sojourn.projections.views import view_of
from sojourn.schemas.codec import decode_events, encode, encode_events, from_raw, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    TriggerInfo,
)
from sojourn.schemas.views import Chunk, RunView

from .util import fmt_ms, fmt_rate, loadavg, log, median, run_bench, run_facts, tag
from .util import summarize as pcts

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("catchup", "lag", "sqlite", "chunk", "listing")
PYTHON = sys.executable
APP = "bench.readside"

TARGET_CATCHUP = 0.8
TARGET_LAG_P99 = 0.050
TARGET_SQLITE = 10_000.0
TARGET_CHUNK_P50 = 0.002
TARGET_LISTING = 0.200

Log = Callable[[str], None]


# --- the agents the worker process runs (it imports this module) --------------------------------


async def nap(i: int, pause: float) -> int:
    """A step that waits (a tool call's latency)."""
    await asyncio.sleep(pause)
    return i


@agent("rs_steps")
async def rs_steps(ctx: Context, job: dict[str, Any]) -> int:
    for i in range(int(job["steps"])):
        await ctx.step(nap, i, float(job["pause"]))
    return int(job["steps"])


@agent("rs_stream")
async def rs_stream(ctx: Context, job: dict[str, Any]) -> int:
    tokens, gap = int(job["tokens"]), float(job["gap"])

    async def speak() -> int:
        for i in range(tokens):
            await asyncio.sleep(gap)
            await ctx.stream(f" token{i}")
        return tokens

    return await ctx.step(speak)


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    runs: int = 1000
    decisions: int = 20
    lag_runs: int = 200
    lag_steps: int = 8
    lag_pause: float = 0.1
    sqlite_runs: int = 1000
    tokens: int = 300
    token_gap: float = 0.005
    stream_runs: int = 3
    listing_runs: int = 100_000
    list_requests: int = 100
    cli_runs: int = 5
    sync_intervals: list[str] = field(default_factory=lambda: ["always", "2m"])
    sections: tuple[str, ...] = SECTIONS
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.readside",
        description="sojourn's read side vs raw JetStream / SQLite (prints markdown)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes: 200 x 10 decisions, 20,000 listed runs, 100 lag runs",
    )
    p.add_argument("--runs", type=int, help="catch-up: runs written (default 1000)")
    p.add_argument("--decisions", type=int, help="catch-up: decisions per run (default 20)")
    p.add_argument("--lag-runs", type=int, help="lag: concurrent runs (default 200)")
    p.add_argument("--lag-steps", type=int, help="lag: steps per run (default 8)")
    p.add_argument("--lag-pause", type=float, help="lag: seconds each step sleeps (default 0.1)")
    p.add_argument("--listing-runs", type=int, help="listing: runs in the model (default 100000)")
    p.add_argument(
        "--sync-interval",
        action="append",
        dest="sync_intervals",
        metavar="DUR",
        help="JetStream sync_interval of the embedded server; repeat to compare (default: "
        "always and 2m for the catch-up; the other sections run on the first only)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help=f"run only this section ({', '.join(SECTIONS)}); repeatable",
    )
    p.add_argument("--store-dir", help="parent directory for the temp stores")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write raw figures as JSON")
    a = p.parse_args(argv)
    c = Config(quick=a.quick)
    if a.quick:
        c.runs, c.decisions, c.lag_runs, c.sqlite_runs = 200, 10, 100, 300
        c.tokens, c.stream_runs, c.listing_runs, c.list_requests, c.cli_runs = (
            150,
            2,
            20_000,
            50,
            3,
        )
    c.runs = a.runs or c.runs
    c.decisions = max(2, a.decisions or c.decisions)
    c.lag_runs = a.lag_runs or c.lag_runs
    c.lag_steps = a.lag_steps or c.lag_steps
    c.lag_pause = c.lag_pause if a.lag_pause is None else a.lag_pause
    c.listing_runs = a.listing_runs or c.listing_runs
    c.sync_intervals = a.sync_intervals or ["always", "2m"]
    c.sections = tuple(s for s in SECTIONS if not a.only or s in a.only)
    c.store_dir = a.store_dir
    c.json_out = a.json_out
    return c


# --- helpers ------------------------------------------------------------------------------------


async def until(predicate: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.005)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def history(run_id: str, n: int, now: float, rng: random.Random) -> list[list[RunEvent]]:
    """A valid history of ``n`` decisions: start + first step, n-2 steps, last step + end."""
    agent_name = f"agent{rng.randrange(10)}"
    out: list[list[RunEvent]] = [
        [
            RunStarted(
                run_id=run_id,
                agent=agent_name,
                input=to_raw({"topic": f"topic {run_id[:6]}", "depth": 3}),
                trigger=TriggerInfo(inbox_seq=1, received_at=now),
                at=now,
            ),
            StepStarted(position=0, name="search", attempt=1, at=now),
        ]
    ]
    result = to_raw({"hits": ["https://example.com/a", "https://example.com/b"]})
    for pos in range(n - 1):
        done = StepCompleted(
            position=pos, name="search", attempt=1, result=result, duration=0.01, at=now
        )
        if pos < n - 2:
            out.append([done, StepStarted(position=pos + 1, name="search", attempt=1, at=now)])
        else:
            out.append([done, RunCompleted(output=to_raw({"summary": "done"}), at=now)])
    return out


async def fill(
    broker: Broker, names: Names, settings: Settings, runs: int, n: int
) -> dict[str, Any]:
    """``runs`` x ``n`` decisions through ``EventStore.append``, 500 runs at a time, decision
    by decision across the runs (so runs interleave in the stream as they would live)."""
    store = EventStore(broker, names, settings)
    writer = f"bench-{os.getpid()}-{tag()}.1"
    rng = random.Random(11)
    now = time.time()
    t0 = time.perf_counter()
    for lo in range(0, runs, 500):
        ids = [uuid.uuid4().hex for _ in range(min(500, runs - lo))]
        hists = {r: history(r, n, now, rng) for r in ids}
        last = dict.fromkeys(ids, 0)

        async def one(r: str, events: list[RunEvent], last: dict[str, int] = last) -> None:
            last[r] = await store.append(r, events, expected_seq=last[r], writer=writer)

        for d in range(n):
            await asyncio.gather(*(one(r, hists[r][d]) for r in ids))
    elapsed = time.perf_counter() - t0
    info = await broker.api(f"$JS.API.STREAM.INFO.{names.events_stream}")
    state = info["state"]
    return {
        "elapsed": elapsed,
        "decisions": runs * n,
        "rate": runs * n / elapsed,
        "last_seq": int(state["last_seq"]),
        "bytes": int(state["bytes"]),
    }


# --- 1. catch-up ----------------------------------------------------------------------------------


async def raw_ordered(url: str, names: Names, total: int) -> dict[str, float]:
    """A nats-py ordered push consumer over the whole events stream, decoding nothing."""
    nc = await nats.connect(url, name="bench-raw-ordered")
    js = nc.jetstream()
    n = 0
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        nonlocal n
        n += 1
        if n >= total:
            done.set()

    t0 = time.perf_counter()
    sub = await js.subscribe(
        names.events_all,
        stream=names.events_stream,
        ordered_consumer=True,
        cb=cb,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    try:
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        await nc.close()
    return {"messages": n, "elapsed": elapsed, "rate": n / elapsed}


async def raw_follower(broker: Broker, names: Names) -> dict[str, float]:
    """The read the projector's fold does, without the fold: batched direct gets, 1,000 a page."""
    f = StreamFollower(broker, names.events_stream, names.events_all, page=1000)
    n = 0
    t0 = time.perf_counter()
    while True:
        msgs = await f.next_page()
        n += len(msgs)
        if not msgs or f.pending == 0:
            break
    elapsed = time.perf_counter() - t0
    return {"messages": n, "elapsed": elapsed, "rate": n / elapsed}


async def raw_publish(url: str, names: Names, count: int, body: bytes) -> dict[str, float]:
    """``count`` JetStream publishes with a Nats-Msg-Id into the changes stream, 1,024 in
    flight (the projector's pipeline), awaiting every ack."""
    nc = await nats.connect(url, name="bench-raw-publish")
    js = nc.jetstream()
    base = tag()
    subject = names.change("rawagent", f"raw{base}")
    t0 = time.perf_counter()
    try:
        for lo in range(0, count, 1024):
            await asyncio.gather(
                *(
                    js.publish(subject, body, headers={h.MSG_ID: f"raw{base}:{i}"})
                    for i in range(lo, min(count, lo + 1024))
                )
            )
        elapsed = time.perf_counter() - t0
    finally:
        await nc.close()
    return {"messages": count, "elapsed": elapsed, "rate": count / elapsed}


async def projector_catchup(
    url: str, settings: Settings, last_seq: int, sink: SqliteModel | None
) -> tuple[Projector, dict[str, float]]:
    p = Projector(nats=url, settings=settings, sink=sink, interval=1.0)
    t0 = time.perf_counter()
    await p.start()

    def done() -> bool:  # the views written and, with a model, its rows too
        return p.leading and p.written >= last_seq and (sink is None or sink.position >= last_seq)

    await until(done, 600, "the projector to catch up")
    elapsed = time.perf_counter() - t0
    out = {
        "elapsed": elapsed,
        "rate": last_seq / elapsed,
        "views_written": float(p.views_written),
        "changes_published": float(p.changes_published),
        "rows_written": float(p.rows_written),
        # step records (decision 0040) written by then; 0 before they existed
        "steps_written": float(getattr(p._store, "steps_written", 0)),
    }
    return p, out


async def projector_restart(url: str, settings: Settings, last_seq: int) -> dict[str, float]:
    p = Projector(nats=url, settings=settings, interval=1.0)
    t0 = time.perf_counter()
    await p.start()
    try:
        await until(
            lambda: p.leading and p.model.caught_up and p.model.position >= last_seq,
            600,
            "the restarted projector to catch up",
        )
        elapsed = time.perf_counter() - t0
        return {
            "elapsed": elapsed,
            "rate": last_seq / elapsed,
            "views_written": float(p.views_written),
            "changes_published": float(p.changes_published),
        }
    finally:
        await p.stop()


def sample_view_body() -> bytes:
    rng = random.Random(3)
    s = RunSummary()
    for seq, events in enumerate(history("r" * 32, 3, time.time(), rng), 1):
        for e in events:
            s = summarize(s, e)
        s = close_decision(s, seq, 300)
    return encode(view_of(s, "running"))


async def phase_catchup(
    srv: EmbeddedServer, si: str, cfg: Config, tmp: Path, log: Log
) -> dict[str, Any]:
    url = srv.url
    broker = await Broker.connect(url, name="bench-readside-catchup")
    out: dict[str, Any] = {"sync_interval": si, "load_before": loadavg()}
    try:
        # two identically filled prefixes: one for the projector without, one with SQLite
        prefixes = {}
        for variant in ("kv", "sqlite"):
            settings = Settings(prefix=f"rc{tag()}")
            names = Names(settings.prefix)
            await ensure_topology(broker, names, settings)
            log(f"[{si}] catch-up: writing {cfg.runs} x {cfg.decisions} decisions ({variant})")
            out[f"fill_{variant}"] = await fill(broker, names, settings, cfg.runs, cfg.decisions)
            prefixes[variant] = (settings, names)
        total = out["fill_kv"]["last_seq"]
        settings, names = prefixes["kv"]
        log(f"[{si}] catch-up: raw reads")
        await raw_ordered(url, names, total)  # warm-up (page cache, code paths)
        out["raw_ordered"] = [await raw_ordered(url, names, total) for _ in range(3)]
        out["raw_follower"] = [await raw_follower(broker, names) for _ in range(3)]
        log(f"[{si}] catch-up: fresh projector, no SQLite")
        p, out["fresh_kv"] = await projector_catchup(url, settings, total, None)
        await p.stop()
        out["raw_ordered_after"] = await raw_ordered(url, names, total)
        log(f"[{si}] catch-up: restarted projector")
        out["restart"] = await projector_restart(url, settings, total)
        s2, n2 = prefixes["sqlite"]
        model = await SqliteModel.open(tmp / f"{s2.prefix}.sqlite3", events_stream=n2.events_stream)
        log(f"[{si}] catch-up: fresh projector with SQLite")
        p2, out["fresh_sqlite"] = await projector_catchup(
            url, s2, out["fill_sqlite"]["last_seq"], model
        )
        await p2.stop()
        await model.close()
        out["raw_ordered_sqlite"] = await raw_ordered(url, n2, out["fill_sqlite"]["last_seq"])
        log(f"[{si}] catch-up: raw concurrent publishes")
        body = sample_view_body()
        out["view_bytes"] = len(body)
        raw_settings = Settings(prefix=f"rp{tag()}")
        raw_names = Names(raw_settings.prefix)
        await ensure_topology(broker, raw_names, raw_settings, consumers=False)
        await raw_publish(url, raw_names, 2000, body)
        out["raw_publish"] = await raw_publish(url, raw_names, total, body)
    finally:
        await broker.close()
    out["load_after"] = loadavg()
    return out


# --- worker and projector processes --------------------------------------------------------------


class Proc:
    def __init__(self, args: list[str], logfile: Path) -> None:
        self.log = logfile.open("wb")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, env=child_env()
        )

    async def ready(self, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line.startswith(b"ready"):
            raise RuntimeError(f"worker did not start: {line!r} (see {self.log.name})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def worker_proc(url: str, prefix: str, logdir: Path) -> Proc:
    return Proc(
        [PYTHON, "-m", "tests.apps.run_worker", url, prefix, APP, "30"],
        logdir / f"worker-{prefix}.log",
    )


_POLLING_PROJECTOR = """
import asyncio, sys
from sojourn.broker.names import Names
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.config import Settings
async def main():
    url, prefix, path, poll = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    model = await SqliteModel.open(path, events_stream=Names(prefix).events_stream)
    await Projector(nats=url, settings=Settings(prefix=prefix), sink=model, poll=poll).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


def projector_proc(url: str, prefix: str, logdir: Path, poll: float | None = None) -> Proc:
    """``sojourn projector`` (its defaults: SQLite on, poll 0.25 s, woken at once by a hint of
    each append); with ``poll``, the same
    ``Projector`` + ``SqliteModel`` from a short script with that poll interval (a what-if)."""
    if poll is not None:
        path = str(logdir / f"runs-{prefix}.sqlite3")
        return Proc(
            [PYTHON, "-c", _POLLING_PROJECTOR, url, prefix, path, str(poll)],
            logdir / f"projector-{prefix}.log",
        )
    return Proc(
        [
            PYTHON,
            "-m",
            "sojourn.actors.cli",
            "projector",
            "--nats",
            url,
            "--prefix",
            prefix,
            "--sqlite",
            str(logdir / f"runs-{prefix}.sqlite3"),
            "--log-level",
            "warning",
        ],
        logdir / f"projector-{prefix}.log",
    )


# --- 2. change-message lag ------------------------------------------------------------------------


async def phase_lag(url: str, cfg: Config, tmp: Path, log: Log) -> dict[str, Any]:
    out = {"default": await lag_run(url, cfg, tmp, log, None)}
    out["poll_5ms"] = await lag_run(url, cfg, tmp, log, 0.005)
    return out


async def lag_run(url: str, cfg: Config, tmp: Path, log: Log, poll: float | None) -> dict[str, Any]:
    settings = Settings(prefix=f"rl{tag()}")
    names = Names(settings.prefix)
    broker = await Broker.connect(url, name="bench-readside-lag")
    await ensure_topology(broker, names, settings)
    worker = worker_proc(url, settings.prefix, tmp)
    projector = projector_proc(url, settings.prefix, tmp, poll)
    client = await Client.connect(url, settings=settings)
    nc = await nats.connect(url, name="bench-lag-subscriber")
    changes: list[tuple[float, bytes]] = []
    raw: list[tuple[float, str, bytes]] = []

    async def on_change(msg: Any) -> None:
        changes.append((time.time(), msg.data))

    async def on_event(msg: Any) -> None:
        raw.append((time.time(), (msg.headers or {}).get(h.MSG_ID, ""), msg.data))

    completed: set[str] = set()
    out: dict[str, Any] = {"load_before": loadavg()}
    try:
        await worker.ready()
        await nc.subscribe(f"{names.prefix}.runs.>", cb=on_change)
        await nc.subscribe(names.events_all, cb=on_event)
        await nc.flush()

        scanned = [0]

        def scan() -> None:
            """Note the runs whose completed view has arrived (decoding only what is new)."""
            for _t, data in changes[scanned[0] :]:
                v = from_raw(data, RunView)
                if v.status == "completed":
                    completed.add(v.run_id)
            scanned[0] = len(changes)

        # warm-up: the projector leads and the worker's code paths are hot
        warm = [f"warm{i}-{tag()}" for i in range(20)]
        for r in warm:
            await client.start("rs_steps", {"steps": 2, "pause": 0.01}, run_id=r)

        def warmed() -> bool:
            scan()
            return all(r in completed for r in warm)

        await until(warmed, 120, "the warm-up runs' views")
        changes.clear()
        raw.clear()
        scanned[0] = 0
        what = "sojourn projector" if poll is None else f"projector, poll {poll:g} s"
        log(f"lag ({what}): {cfg.lag_runs} concurrent runs x {cfg.lag_steps} steps")
        job = {"steps": cfg.lag_steps, "pause": cfg.lag_pause}
        ids = [f"lag{i}-{tag()}" for i in range(cfg.lag_runs)]
        t0 = time.time()
        await asyncio.gather(*(client.start("rs_steps", job, run_id=r) for r in ids))

        no_change: list[str] = []
        looked = [time.monotonic()]

        async def done() -> bool:
            """Every run's completed view has arrived; once a second, the KV entries of the
            runs still missing are read, so a lost change message is counted, not waited on."""
            scan()
            left = [r for r in ids if r not in completed]
            if left and time.monotonic() - looked[0] > 1.0:
                looked[0] = time.monotonic()
                for r in left:
                    m = await broker.direct_get_last(names.runs_kv_stream, names.run_key(r))
                    if m is None or not m.data:
                        continue  # no view yet, or a delete marker
                    if from_raw(m.data, RunView).status == "completed":
                        scan()
                        if r not in completed:
                            no_change.append(r)
                            completed.add(r)
            return not left

        stuck: dict[str, str] = {}
        try:
            await until(done, 120, "every lag run's completed view")
        except TimeoutError:
            # Reported, not fatal: which runs lack a completed view, and what their history says.
            for r in (r for r in ids if r not in completed):
                last = await broker.direct_get_last(names.events_stream, names.events(r))
                kinds = [type(e).__name__ for e in decode_events(last.data)] if last else []
                stuck[r] = f"last decision #{last.seq if last else 0}: {kinds}"
            log(f"lag: {len(stuck)} runs without a completed view: {list(stuck.items())[:3]}")
        wall = time.time() - t0
        await asyncio.sleep(0.5)  # late raw deliveries
        stored = await broker.direct_get_range(names.events_stream, names.events_all)
        by_seq = {m.seq: m.time for m in stored}
        by_id = {m.header(h.MSG_ID): m.time for m in stored}
        mine = set(ids)
        first: dict[tuple[str, int], tuple[float, float]] = {}
        for t, data in changes:
            v = from_raw(data, RunView)
            if v.run_id in mine and v.last_seq > 0:
                first.setdefault((v.run_id, v.last_seq), (t, v.updated_at))
        lags = [t - by_seq[seq] for (_r, seq), (t, _at) in first.items() if seq in by_seq]
        lags_at = [t - at for t, at in first.values()]
        raw_lags, raw_lags_at = [], []
        for t, mid, data in raw:
            run = mid.split(":", 1)[0]
            if run in mine and mid in by_id:
                raw_lags.append(t - by_id[mid])
                raw_lags_at.append(t - max(e.at for e in decode_events(data)))
        decisions = sum(1 for m in stored if names.subject_token(m.subject, 1) in mine)
        times = [m.time for m in stored if names.subject_token(m.subject, 1) in mine]
        span = max(times) - min(times) if times else float("nan")
        out.update(
            {
                "runs": cfg.lag_runs,
                "decisions": decisions,
                "changes": len(first),
                "wall": wall,
                "decision_rate": decisions / span if span else float("nan"),
                "poll": poll,
                "no_change_message": no_change,
                "stuck": stuck,
                "lag": pcts(lags),
                "raw_lag": pcts(raw_lags),
                "lag_at": pcts(lags_at),
                "raw_lag_at": pcts(raw_lags_at),
                "lag_max": max(lags) if lags else float("nan"),
            }
        )
    finally:
        await nc.close()
        await client.close()
        projector.stop()
        worker.stop()
        await broker.close()
    out["load_after"] = loadavg()
    return out


# --- 3. the SQLite model ----------------------------------------------------------------------


def folded(runs: int, n: int) -> list[Applied]:
    """Decisions of ``runs`` histories of ``n`` decisions, interleaved, with the views the real
    fold makes after each (what the projector hands the model)."""
    rng = random.Random(5)
    now = time.time()
    hists = {uuid.uuid4().hex: None for _ in range(runs)}
    decs = {r: history(r, n, now, rng) for r in hists}
    summaries = {r: RunSummary() for r in hists}
    order = [r for _ in range(n) for r in rng.sample(list(hists), len(hists))]
    nxt = dict.fromkeys(hists, 0)
    out = []
    for seq, r in enumerate(order, 1):
        events = tuple(decs[r][nxt[r]])
        nxt[r] += 1
        s = summaries[r]
        for e in events:
            s = summarize(s, e)
        s = close_decision(s, seq, len(encode_events(list(events))))
        summaries[r] = s
        out.append(Applied(seq, view_of(s, None if s.terminal else "running"), events))
    return out


_RAW_SCHEMA = (
    "CREATE TABLE runs (run_id TEXT PRIMARY KEY, agent, status, liveness, parent_run_id, "
    "started_at, updated_at, ended_at, step, steps_done, attempts, spent_usd, spent_tokens, "
    "budget_usd, budget_tokens, error_type, error_message, last_seq, view)",
    "CREATE TABLE steps (run_id TEXT, position INTEGER, name, status, attempts, started_at, "
    "ended_at, duration, error_type, error_message, PRIMARY KEY (run_id, position)) "
    "WITHOUT ROWID",
)


async def raw_sqlite(path: Path, batches: list[list[Applied]]) -> dict[str, float]:
    """The same rows, precomputed, by plain executemany, one transaction per batch."""
    rows = []
    for b in batches:
        runs = {a.view.run_id: run_row(a.view) for a in b}
        steps = [r for a in b for r in step_rows(a.view.run_id, a.events)]
        rows.append((list(runs.values()), steps))
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode = WAL")
        await db.execute("PRAGMA synchronous = NORMAL")
        for s in _RAW_SCHEMA:
            await db.execute(s)
        t0 = time.perf_counter()
        for runs_rows, steps_rows in rows:
            await db.execute("BEGIN IMMEDIATE")
            await db.executemany(
                f"INSERT OR REPLACE INTO runs VALUES ({', '.join('?' * 19)})", runs_rows
            )
            await db.executemany(
                f"INSERT OR REPLACE INTO steps VALUES ({', '.join('?' * 10)})", steps_rows
            )
            await db.execute("COMMIT")
        elapsed = time.perf_counter() - t0
    finally:
        await db.close()
    return {"elapsed": elapsed}


async def model_apply(path: Path, batches: list[list[Applied]]) -> dict[str, float]:
    model = await SqliteModel.open(path, events_stream="BENCH_EVENTS")
    try:
        t0 = time.perf_counter()
        for b in batches:
            await model.apply(b)
        elapsed = time.perf_counter() - t0
    finally:
        await model.close()
    return {"elapsed": elapsed}


async def phase_sqlite(cfg: Config, tmp: Path, log: Log) -> dict[str, Any]:
    log(f"sqlite: folding {cfg.sqlite_runs} x {cfg.decisions} decisions")
    items = folded(cfg.sqlite_runs, cfg.decisions)
    n_dec = len(items)
    n_ev = sum(len(a.events) for a in items)
    out: dict[str, Any] = {"decisions": n_dec, "events": n_ev, "by_batch": {}}
    for size in (1000, 50):
        batches = [items[i : i + size] for i in range(0, n_dec, size)]
        reps: dict[str, list[float]] = {"model": [], "raw": []}
        for rep in range(3):
            log(f"sqlite: batches of {size}, repeat {rep + 1}/3")
            d = tmp / f"sq{size}-{rep}"
            d.mkdir()
            reps["model"].append((await model_apply(d / "model.sqlite3", batches))["elapsed"])
            reps["raw"].append((await raw_sqlite(d / "raw.sqlite3", batches))["elapsed"])
        out["by_batch"][size] = {
            "model_s": reps["model"],
            "raw_s": reps["raw"],
            "model_dec_rate": n_dec / median(reps["model"]),
            "model_ev_rate": n_ev / median(reps["model"]),
            "raw_dec_rate": n_dec / median(reps["raw"]),
            "raw_ev_rate": n_ev / median(reps["raw"]),
        }
    return out


# --- 4. token chunks ----------------------------------------------------------------------------

_RAW_STREAMER = """
import asyncio, sys, time, msgspec, nats
from sojourn.schemas.views import Chunk
async def main():
    url, subject, n, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    nc = await nats.connect(url)
    js = nc.jetstream()
    await asyncio.sleep(0.5)
    for i in range(n):
        await asyncio.sleep(gap)
        body = msgspec.json.encode(Chunk(run_id="raw", position=0, attempt=1, execution=1,
                                         index=i, text=f" token{i}", at=time.time()))
        await js.publish(subject, body, headers={"Nats-Msg-Id": f"raw:{subject}:{i}"})
    await nc.close()
asyncio.run(main())
"""


async def phase_chunk(url: str, cfg: Config, tmp: Path, log: Log) -> dict[str, Any]:
    settings = Settings(prefix=f"rt{tag()}")
    names = Names(settings.prefix)
    broker = await Broker.connect(url, name="bench-readside-chunk")
    await ensure_topology(broker, names, settings)
    worker = worker_proc(url, settings.prefix, tmp)
    client = await Client.connect(url, settings=settings)
    nc = await nats.connect(url, name="bench-chunk-subscriber")
    reader_lat: list[float] = []
    core_lat: list[float] = []
    raw_lat: list[float] = []
    out: dict[str, Any] = {"load_before": loadavg()}
    try:
        await worker.ready()

        async def on_core(msg: Any) -> None:
            t = time.time()
            core.append((t, msg.data))

        job = {"tokens": cfg.tokens, "gap": cfg.token_gap}
        for i in range(cfg.stream_runs + 1):  # the first is a warm-up
            run_id = f"tok{i}-{tag()}"
            core: list[tuple[float, bytes]] = []
            sub = await nc.subscribe(names.output(run_id), cb=on_core)
            await nc.flush()
            lat: list[float] = []

            async def read(run_id: str = run_id, lat: list[float] = lat) -> None:
                async for c in read_output(broker, names, run_id, timeout=120):
                    lat.append(time.time() - c.chunk.at)

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.05)
            log(f"chunk: streaming run {i + 1}/{cfg.stream_runs + 1} ({cfg.tokens} tokens)")
            await client.start("rs_stream", job, run_id=run_id)
            await asyncio.wait_for(reader, 180)
            await sub.unsubscribe()
            if i:
                reader_lat.extend(lat)
                core_lat.extend(t - from_raw(d, Chunk).at for t, d in core)
        log("chunk: raw publishes from another process")
        for i in range(cfg.stream_runs + 1):
            subject = names.output(f"raw{i}-{tag()}")
            core = []
            sub = await nc.subscribe(subject, cb=on_core)
            await nc.flush()
            proc = await asyncio.create_subprocess_exec(
                PYTHON,
                "-c",
                _RAW_STREAMER,
                url,
                subject,
                str(cfg.tokens),
                str(cfg.token_gap),
                cwd=ROOT,
                env=child_env(),
            )
            await asyncio.wait_for(proc.wait(), 120)
            await asyncio.sleep(0.1)
            await sub.unsubscribe()
            if i:
                raw_lat.extend(t - from_raw(d, Chunk).at for t, d in core)
        out.update(
            {
                "reader": pcts(reader_lat),
                "core": pcts(core_lat),
                "raw": pcts(raw_lat),
            }
        )
    finally:
        await nc.close()
        await client.close()
        worker.stop()
        await broker.close()
    out["load_after"] = loadavg()
    return out


# --- 5. listing -------------------------------------------------------------------------------

_STATUSES = (
    ("completed", 0.55),
    ("running", 0.15),
    ("waiting", 0.15),
    ("failed", 0.08),
    ("suspended", 0.02),
    ("cancelled", 0.05),
)


def listing_views(n: int, now: float) -> list[Applied]:
    rng = random.Random(9)
    names, weights = zip(*_STATUSES, strict=True)
    out = []
    for i in range(n):
        status = rng.choices(names, weights)[0]
        updated = now - rng.uniform(0, 7 * 86_400)
        ended = status in ("completed", "failed", "cancelled")
        v = RunView(
            run_id=f"run{i:06d}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
            agent=f"agent{rng.randrange(10)}",
            status=status,
            liveness="ended" if ended else status,
            step=None if ended or status == "waiting" else "search",
            steps_done=rng.randrange(1, 30),
            attempts=rng.randrange(1, 35),
            waiting_on=("approve",) if status == "waiting" else (),
            started_at=updated - rng.uniform(1, 3600),
            updated_at=updated,
            ended_at=updated if ended else None,
            last_seq=i + 1,
            events=rng.randrange(4, 60),
        )
        out.append(Applied(i + 1, v, ()))
    return out


async def timed_cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = await proc.communicate()
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{args[2:5]} failed: {err.decode()[-500:]}")
    return elapsed


async def phase_listing(url: str, cfg: Config, tmp: Path, log: Log) -> dict[str, Any]:
    settings = Settings(prefix=f"rs{tag()}")
    names = Names(settings.prefix)
    broker = await Broker.connect(url, name="bench-readside-listing")
    client = await Broker.connect(url, name="bench-readside-lister")
    await ensure_topology(broker, names, settings, consumers=False)
    model = await SqliteModel.open(tmp / "listing.sqlite3", events_stream=names.events_stream)
    out: dict[str, Any] = {"runs": cfg.listing_runs, "filters": {}, "cli": {}}
    service = ListingService(broker, names, model)
    responder = None
    try:
        log(f"listing: filling the model with {cfg.listing_runs} runs")
        now = time.time()
        items = listing_views(cfg.listing_runs, now)
        t0 = time.perf_counter()
        for i in range(0, len(items), 5000):
            await model.apply(items[i : i + 5000])
        out["fill_s"] = time.perf_counter() - t0
        out["file_mib"] = (tmp / "listing.sqlite3").stat().st_size / 2**20
        await service.start()
        await broker.flush()  # the subscription is known to the server before the first ask
        filters: dict[str, dict[str, Any]] = {
            "none": {},
            "--agent agent3": {"agent": "agent3"},
            "--status waiting": {"status": ("waiting",)},
            "--since 1h": {"since": now - 3600},
        }
        for label, kw in filters.items():
            for _ in range(10):  # warm the page cache and the code paths
                await list_runs(client, names, limit=50, **kw)
            lat = []
            count = 0
            for _ in range(cfg.list_requests):
                t = time.perf_counter()
                page = await list_runs(client, names, limit=50, **kw)
                lat.append(time.perf_counter() - t)
                count = len(page.runs)
            out["filters"][label] = {**pcts(lat), "returned": count}
        log("listing: raw request/reply")
        nc = await nats.connect(url, name="bench-raw-responder")
        responder = nc

        async def echo(msg: Any) -> None:
            await msg.respond(b"{}")

        subject = f"raw{tag()}.q"
        await nc.subscribe(subject, cb=echo)
        await nc.flush()
        lat = []
        for i in range(cfg.list_requests + 10):
            t = time.perf_counter()
            await client.request(subject, b"{}", timeout=5)
            if i >= 10:
                lat.append(time.perf_counter() - t)
        out["raw_rr"] = pcts(lat)
        log("listing: `sojourn runs` subprocesses")
        cli = [PYTHON, "-m", "sojourn.actors.cli", "runs", "--nats", url, "--prefix", names.prefix]
        cases = {
            "python -c pass": [PYTHON, "-c", "pass"],
            "python -c 'import sojourn.actors.cli'": [PYTHON, "-c", "import sojourn.actors.cli"],
            "sojourn runs": cli,
            "sojourn runs --agent agent3": [*cli, "--agent", "agent3"],
            "sojourn runs --status waiting": [*cli, "--status", "waiting"],
            "sojourn runs --since 1h": [*cli, "--since", "1h"],
        }
        for label, args in cases.items():
            await timed_cli(args)  # warm the OS caches
            walls = [await timed_cli(args) for _ in range(cfg.cli_runs)]
            out["cli"][label] = {"median": median(walls), "min": min(walls), "max": max(walls)}
    finally:
        await service.stop()
        if responder is not None:
            await responder.close()
        await model.close()
        await client.close()
        await broker.close()
    return out


# --- report ---------------------------------------------------------------------------------


def verdict(ok: bool, near: bool = False) -> str:
    if ok:
        return "MET"
    return "AT TARGET (inside the noise)" if near else "MISS"


def render(cfg: Config, facts: dict[str, str], res: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add("### Machine")
    add("")
    for k, v in facts.items():
        add(f"- {k}: {v}")
    add("")
    add(
        f"Parameters: catch-up {cfg.runs} runs x {cfg.decisions} decisions; lag {cfg.lag_runs} "
        f"concurrent runs x {cfg.lag_steps} steps sleeping {cfg.lag_pause:g} s; SQLite "
        f"{cfg.sqlite_runs} x {cfg.decisions} decisions; chunks {cfg.stream_runs} runs x "
        f"{cfg.tokens} tokens {cfg.token_gap * 1e3:g} ms apart; listing {cfg.listing_runs:,} runs, "
        f"{cfg.list_requests} requests per filter, {cfg.cli_runs} CLI runs per case."
    )
    for c in res.get("catchup", []):
        si = c["sync_interval"]
        raw = median([r["rate"] for r in c["raw_ordered"]])
        fol = median([r["rate"] for r in c["raw_follower"]])
        pub = c["raw_publish"]["rate"]
        fk = c["fresh_kv"]
        pubs = (fk["changes_published"] + fk["views_written"]) / fk["elapsed"]
        add("")
        add(f"#### 1. Catch-up, sync_interval: {si}")
        add("")
        add(
            f"{c['fill_kv']['decisions']:,} decisions ({c['fill_kv']['bytes'] / 2**20:.1f} MiB "
            f"stored), written at {fmt_rate(c['fill_kv']['rate'], 'decisions')}; load "
            f"{c['load_before']} -> {c['load_after']}."
        )
        add("")
        add("| measurement | rate | vs raw ordered read | target | verdict |")
        add("|---|---|---|---|---|")
        add(
            f"| (a) raw ordered consumer, whole events stream (median of 3; "
            f"{fmt_rate(c['raw_ordered_after']['rate'], 'msgs')} after (b)) "
            f"| {fmt_rate(raw, 'msgs')} | 1.00x | | |"
        )
        add(
            f"| (a') raw StreamFollower (batched direct gets, the fold's read) "
            f"| {fmt_rate(fol, 'msgs')} | {fol / raw:.2f}x | | |"
        )
        for key, label in (
            ("fresh_kv", "(b) fresh projector, KV views + change messages"),
            ("fresh_sqlite", "(b) fresh projector, + SQLite model"),
            ("restart", "(c) restarted projector (views already written)"),
        ):
            r = c[key]
            ratio = r["rate"] / raw
            add(
                f"| {label} ({r['elapsed']:.2f} s) | {fmt_rate(r['rate'], 'decisions')} "
                f"| {ratio:.3f}x | >= {TARGET_CATCHUP}x | "
                f"{verdict(ratio >= TARGET_CATCHUP, ratio >= 0.9 * TARGET_CATCHUP)} |"
            )
        add(
            f"| (d) raw concurrent JetStream publish, {c['view_bytes']} B bodies, 1,024 in "
            f"flight | {fmt_rate(pub, 'msgs')} | {pub / raw:.3f}x (as msgs) | | |"
        )
        add("")
        add(
            f"Writes by (b): {c['fresh_kv']['changes_published']:.0f} change messages, "
            f"{c['fresh_kv']['views_written']:.0f} KV views, "
            f"{c['fresh_kv'].get('steps_written', 0):.0f} step records; with SQLite "
            f"{c['fresh_sqlite']['rows_written']:.0f} decisions applied; (c) wrote "
            f"{c['restart']['changes_published']:.0f} + {c['restart']['views_written']:.0f}. "
            f"(b)'s publishes: {fmt_rate(pubs, 'msgs')}, {pubs / pub:.2f}x the raw concurrent "
            "publish rate (d)."
        )
    lag = res.get("lag")
    if lag:
        d = lag["default"]
        add("")
        add("#### 2. Change-message lag from the decision's append")
        add("")
        add(
            f"{d['runs']} concurrent runs, {d['decisions']:,} decisions at "
            f"{fmt_rate(d['decision_rate'], 'decisions')} (stored-time span), "
            f"{d['changes']:,} change messages received; load {d['load_before']} -> "
            f"{d['load_after']}. Origin: the decision's stored time in the events stream "
            "(server clock) or its last event's `at` (worker clock, stamped before the append)."
        )
        add("")
        add("| path | origin | p50 | p90 | p99 | target | verdict |")
        add("|---|---|---|---|---|---|---|")
        for key, label in (
            ("default", "`sojourn projector` (defaults: SQLite on, poll 0.25 s woken by appends)"),
            ("poll_5ms", "what-if: the same Projector + SQLite, poll 5 ms"),
        ):
            r = lag[key]
            for origin, a, b in (
                ("stored", r["raw_lag"], r["lag"]),
                ("event `at`", r["raw_lag_at"], r["lag_at"]),
            ):
                add(
                    f"| raw: core subscriber on `<prefix>.ev.*` ({label} run) | {origin} "
                    f"| {fmt_ms(a['p50'])} | {fmt_ms(a['p90'])} | {fmt_ms(a['p99'])} | | |"
                )
                ok = b["p99"] <= TARGET_LAG_P99
                near = b["p99"] <= 1.15 * TARGET_LAG_P99
                add(
                    f"| change message on `<prefix>.runs.>`, {label} | {origin} "
                    f"| {fmt_ms(b['p50'])} | {fmt_ms(b['p90'])} | {fmt_ms(b['p99'])} "
                    f"| p99 <= 50 ms | {verdict(ok, near)} |"
                )
            if r.get("stuck"):
                add(f"| ({label}: {len(r['stuck'])} runs never got a completed view) |||||||")
            add(
                f"| ({label}: {r['decisions']:,} decisions at "
                f"{fmt_rate(r['decision_rate'], 'decisions')}, max lag "
                f"{fmt_ms(r['lag_max'])}) | | | | | | |"
            )
    sq = res.get("sqlite")
    if sq:
        add("")
        add("#### 3. SQLite model")
        add("")
        add(
            f"{sq['decisions']:,} decisions ({sq['events']:,} events) from the real fold, "
            "median of 3 fresh files."
        )
        add("")
        add("| batch | SqliteModel.apply | raw executemany | ratio | target | verdict |")
        add("|---|---|---|---|---|---|")
        for size, b in sq["by_batch"].items():
            rate = b["model_dec_rate"]
            add(
                f"| {size} decisions | {fmt_rate(rate, 'decisions')} "
                f"({fmt_rate(b['model_ev_rate'], 'events')}) "
                f"| {fmt_rate(b['raw_dec_rate'], 'decisions')} "
                f"({fmt_rate(b['raw_ev_rate'], 'events')}) | {rate / b['raw_dec_rate']:.2f}x "
                f"| >= 10,000/s | {verdict(rate >= TARGET_SQLITE, rate >= 0.9 * TARGET_SQLITE)} "
                "(judged on decisions) |"
            )
    ch = res.get("chunk")
    if ch:
        add("")
        add("#### 4. Token chunk, `ctx.stream` -> subscriber (worker and reader in two processes)")
        add("")
        add("| path | p50 | p90 | p99 | n | target | verdict |")
        add("|---|---|---|---|---|---|---|")
        r = ch["raw"]
        add(
            f"| raw: JetStream publish (another process) -> core subscriber | {fmt_ms(r['p50'])} "
            f"| {fmt_ms(r['p90'])} | {fmt_ms(r['p99'])} | {r['n']:.0f} | | |"
        )
        c = ch["core"]
        add(
            f"| sojourn chunk -> core subscriber on `<prefix>.out.<run>` | {fmt_ms(c['p50'])} "
            f"| {fmt_ms(c['p90'])} | {fmt_ms(c['p99'])} | {c['n']:.0f} | | |"
        )
        s = ch["reader"]
        add(
            f"| sojourn chunk -> `read_output` (hint + direct get) | {fmt_ms(s['p50'])} "
            f"| {fmt_ms(s['p90'])} | {fmt_ms(s['p99'])} | {s['n']:.0f} | p50 <= 2 ms "
            f"| {verdict(s['p50'] <= TARGET_CHUNK_P50, s['p50'] <= 1.15 * TARGET_CHUNK_P50)} |"
        )
    li = res.get("listing")
    if li:
        add("")
        add(f"#### 5. Listing over {li['runs']:,} runs")
        add("")
        add(
            f"Model filled directly in {li['fill_s']:.1f} s ({li['file_mib']:.0f} MiB). "
            "Round trips: `list_runs` through NATS to a `ListingService` in this process, "
            "limit 50."
        )
        add("")
        add("| request | p50 | p90 | p99 | runs returned | target | verdict |")
        add("|---|---|---|---|---|---|---|")
        r = li["raw_rr"]
        add(
            f"| raw NATS request/reply, trivial responder | {fmt_ms(r['p50'])} | "
            f"{fmt_ms(r['p90'])} | {fmt_ms(r['p99'])} | | | |"
        )
        for label, f in li["filters"].items():
            add(
                f"| `list_runs` {label} | {fmt_ms(f['p50'])} | {fmt_ms(f['p90'])} "
                f"| {fmt_ms(f['p99'])} | {f['returned']} | <= 200 ms "
                f"| {verdict(f['p99'] <= TARGET_LISTING)} (p99) |"
            )
        add("")
        add("| subprocess (wall, Python start-up included) | median | min | max | target |")
        add("|---|---|---|---|---|")
        for label, w in li["cli"].items():
            tgt = ""
            if label.startswith("sojourn"):
                tgt = verdict(w["median"] <= TARGET_LISTING, w["median"] <= 1.1 * TARGET_LISTING)
            add(
                f"| `{label}` | {fmt_ms(w['median'])} | {fmt_ms(w['min'])} | "
                f"{fmt_ms(w['max'])} | {tgt} |"
            )
    return "\n".join(lines)


async def other_phases(
    url: str, si: str, cfg: Config, root: Path, log: Log, res: dict[str, Any]
) -> None:
    """Sections 2-5, on the first server only."""
    phases: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "lag": lambda: phase_lag(url, cfg, root, log),
        "sqlite": lambda: phase_sqlite(cfg, root, log),
        "chunk": lambda: phase_chunk(url, cfg, root, log),
        "listing": lambda: phase_listing(url, cfg, root, log),
    }
    for name, phase in phases.items():
        if name in cfg.sections:
            res[name] = await phase()
            res[name]["sync_interval"] = si


# --- entry point --------------------------------------------------------------------------------


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    facts = run_facts(cfg.store_dir)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"catchup": []}
    for i, si in enumerate(cfg.sync_intervals):
        first = i == 0
        if not first and "catchup" not in cfg.sections:
            break
        with tempfile.TemporaryDirectory(prefix="sojourn-readside-", dir=cfg.store_dir) as tmp:
            root = Path(tmp)
            async with EmbeddedServer(store_dir=root / "nats", port=0, sync_interval=si) as srv:
                if "catchup" in cfg.sections:
                    res["catchup"].append(await phase_catchup(srv, si, cfg, root, log))
                if first:
                    await other_phases(srv.url, si, cfg, root, log, res)
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, res))
    print(f"\n(bench took {elapsed:.0f} s)")
    return {"config": cfg.__dict__, "machine": facts, "results": res, "elapsed": elapsed}


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
