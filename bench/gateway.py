"""HTTP gateway benchmark (issue 15): a 1-step run started and followed to its end over HTTP
against the same through NATS in the same run, and a thousand event-stream watchers on one
gateway process.

Run from the repository root::

    python -m bench.gateway                 # ~2-3 min: both sections at their default sizes
    python -m bench.gateway --only latency  # ~1 min
    python -m bench.gateway --only fanout --runs 1000 --watchers 1000   # one watcher per run

It starts its own ``EmbeddedServer`` (free loopback port, temp dir, ``sync_interval: always``,
sojourn's default) and, per section, a fresh prefix with its own processes: a worker
(``python -m tests.apps.run_worker URL PREFIX bench.gateway_agents 30``), a ``sojourn
gateway --port 0`` and (latency only) a ``sojourn projector --no-sqlite``. Nothing in the
runtime is patched or wrapped; every figure is a time taken in this process (one clock) or a
stamp the worker wrote on the same machine.

1. **Start -> completed, a 1-step run** (``gw_one``: one step that returns 1), ``--samples``
   of each variant, interleaved: sample ``i`` runs every variant once, in an order rotated by
   ``i``, with an untimed ``--gap`` before each (the previous run's lease release and wake ack
   land after its end). Each variant is the same work through HTTP and through NATS:

   - ``http views``: ``POST /v1/agents/gw_one/runs`` (answered 201 once the intake took the
     start, like ``Client.start(wait=True)``), then ``GET /v1/runs/{id}/events`` until the
     view whose status is ``completed``: what an HTTP client that wants to know the run is
     done does. Views come from the projector, so its process runs too.
   - ``nats views``: ``Client.start(wait=True)``, then ``Client.watch`` until the completed
     view: the same views, the same projector, no HTTP.
   - ``http end``: the ``POST``, then ``GET /v1/runs/{id}/stream`` until ``event: end`` (sent
     once the run's terminal event is stored; no projector in the path).
   - ``nats result``: ``Client.start(wait=True)``, then ``Client.result``: the path the
     foundation bench times, which watches the run's event subject.

   The HTTP side uses this package's ``bench.http11`` client (two keep-alive connections,
   one for requests, one for event streams), so that a client library's own cost (httpx's is
   ~2 ms per start here; ``--httpx`` adds ``httpx views`` to show it) is not counted as
   the gateway's. Floors, in the same rotation: ``raw publish``, a JetStream publish -> ack
   into a stream configured like sojourn's inbox (the first thing a start does), and ``http
   floor``, ``GET /healthz`` on the gateway (one HTTP round trip through uvicorn). Ratios
   are p50 to p50 and p99 to p99 over the whole run; the per-block ratios (the samples cut in
   five consecutive blocks) show how much of a ratio is noise.

2. **Fan-out to event-stream watchers** (``gw_fanout``): ``--runs`` runs are started and park
   on a signal; ``--watchers`` connections (watcher ``j`` on run ``j % runs``) each hold
   ``GET /v1/runs/{id}/stream`` open on one gateway process. The gateway's VmRSS
   (``/proc/<pid>/status``) before the first and once the last has its answer's head, over
   the watcher count, is the memory per watcher (nats-server's too: each watcher is two core
   subscriptions there). Then every run is signalled; each streams ``--chunks`` text chunks
   ``--chunk-gap`` s apart, the runs' phases spread evenly over one gap. A chunk's text is
   the worker's ``time.time()`` just before ``ctx.stream``; delivery lag = the moment a
   watcher parsed the event - that stamp (``Chunk.at``, stamped inside ``ctx.stream``, is
   also reported). Raw figures, same moment: a core subscription here on ``<prefix>.out.>``
   (the same chunks, straight from nats-server), each chunk's stored timestamp (read back
   afterwards) - its text stamp, and a direct get of one run's last chunk every 20 ms (what
   each watcher's reader in the gateway does on every chunk hint). The lag is also cut by
   the second after the signals it arrived in. Watchers are plain asyncio
   connections (``bench.http11``); this process's CPU use over the emission is reported so
   a saturated bench would show. The soft ``RLIMIT_NOFILE`` is raised to the hard limit
   (children inherit it).

Prints markdown tables, then one JSON line with every figure (``--json FILE`` writes it
indented to a file too). It asserts nothing: it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sojourn.actors import Client
from sojourn.broker import Broker, Delivery, EmbeddedServer
from sojourn.broker.headers import MSG_ID
from sojourn.broker.names import Names
from sojourn.broker.topology import stream_configs
from sojourn.schemas.config import Settings

from .gateway_agents import FANOUT, ONE_STEP, FanoutPlan
from .http11 import HttpConnection, HttpError, SseEvent
from .trace import gather_limited
from .util import cpu_process, cpu_server, loadavg, log, pct, run_bench, run_facts, tag
from .waits import rss

ROOT = Path(__file__).resolve().parent.parent
APP = "bench.gateway_agents"
TARGET_HTTP_RATIO = 1.5  # issue 15: HTTP start -> completed within 1.5x the same through NATS
TOKEN = "bench-" + secrets.token_hex(16)
INPUT = {"n": 1}
INPUT_JSON = json.dumps(INPUT).encode()
SECTIONS = ("latency", "fanout")
BLOCKS = 5
Log = Callable[[str], None]


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    samples: int = 200
    warmup: int = 20
    gap: float = 0.02
    httpx: bool = False
    runs: int = 100
    watchers: int = 1000
    chunks: int = 10
    chunk_gap: float = 1.0
    open_concurrency: int = 100
    sync_interval: str = "always"
    sections: tuple[str, ...] = SECTIONS
    store_dir: str | None = None
    json_out: str | None = None


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description="sojourn's HTTP gateway: start -> completed over HTTP against NATS in the "
        "same run, and memory and delivery lag of many event-stream watchers (markdown tables "
        "and a JSON line)",
    )
    p.add_argument("--samples", type=int, default=200, help="1-step runs per variant (200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed runs per variant first (20)")
    p.add_argument(
        "--gap", type=float, default=0.02, help="untimed pause before each timed run (0.02 s)"
    )
    p.add_argument("--httpx", action="store_true", help="also time the HTTP views path with httpx")
    p.add_argument("--runs", type=int, default=100, help="fan-out: runs watched (100)")
    p.add_argument(
        "--watchers", type=int, default=1000, help="fan-out: event streams held open (1,000)"
    )
    p.add_argument("--chunks", type=int, default=10, help="fan-out: chunks each run writes (10)")
    p.add_argument(
        "--chunk-gap", type=float, default=1.0, help="fan-out: seconds between a run's chunks (1)"
    )
    p.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    p.add_argument(
        "--sync-interval",
        default="always",
        help="the server's JetStream sync_interval (default 'always', sojourn's default)",
    )
    p.add_argument("--store-dir", help="parent directory for the server's temp store")
    p.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    if a.samples < BLOCKS or a.warmup < 0 or a.gap < 0:
        p.error(f"--samples must be >= {BLOCKS}; --warmup and --gap >= 0")
    if a.runs < 1 or a.watchers < a.runs or a.chunks < 1 or a.chunk_gap <= 0:
        p.error("--runs >= 1, --watchers >= --runs, --chunks >= 1, --chunk-gap > 0")
    return Config(
        samples=a.samples,
        warmup=a.warmup,
        gap=a.gap,
        httpx=a.httpx,
        runs=a.runs,
        watchers=a.watchers,
        chunks=a.chunks,
        chunk_gap=a.chunk_gap,
        sync_interval=a.sync_interval,
        sections=tuple(s for s in SECTIONS if not a.only or s in a.only),
        store_dir=a.store_dir,
        json_out=a.json_out,
    )


# --- helpers ------------------------------------------------------------------------------------


def stats(xs: list[float]) -> dict[str, float]:
    return {
        "n": float(len(xs)),
        "p50": pct(xs, 50),
        "p90": pct(xs, 90),
        "p99": pct(xs, 99),
        "max": max(xs, default=float("nan")),
    }


def raise_fd_limit(need: int) -> dict[str, int]:
    """Raise the soft open-files limit to the hard one (children inherit it): every watcher
    is a socket here and one in the gateway."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raise SystemExit(f"open-files limit {soft} < {need} needed; raise `ulimit -n`")
    return {"soft": soft, "hard": hard}


class Proc:
    """A child process whose output goes to a file (a chatty process never blocks on a full
    pipe); ``ready`` waits for a line starting with ``marker``."""

    def __init__(self, args: list[str], log_path: Path, **env: str) -> None:
        self.log_path = log_path
        self._out = open(log_path, "wb")  # closed by stop()
        full = dict(os.environ)
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
        full.update(env)
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT, env=full
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[str]:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace").splitlines()
        return []

    async def ready(self, marker: str, timeout: float = 60.0) -> Proc:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(marker) for line in self.lines()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log_path.name} exited: {self.lines()[-20:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.log_path.name}: no {marker!r} line")
            await asyncio.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sojourn.actors.cli", *args]


@dataclass
class Stack:
    """The processes of one section: worker, gateway, and optionally a projector."""

    worker: Proc
    gateway: Proc
    projector: Proc | None
    host: str = ""
    port: int = 0

    @classmethod
    async def start(
        cls, url: str, prefix: str, tmp: Path, *, projector: bool, concurrency: int
    ) -> Stack:
        tokens = tmp / f"tokens-{prefix}"
        tokens.write_text(f"{TOKEN} client\n")
        worker = Proc(
            [sys.executable, "-m", "tests.apps.run_worker", url, prefix, APP, "30"],
            tmp / f"worker-{prefix}.log",
            SOJOURN_TEST_CONCURRENCY=str(concurrency),
        )
        gateway = Proc(
            cli(
                "gateway",
                "--port",
                "0",
                "--nats",
                url,
                "--prefix",
                prefix,
                "--tokens",
                str(tokens),
                "--log-level",
                "warning",
            ),
            tmp / f"gateway-{prefix}.log",
        )
        proj = None
        if projector:
            proj = Proc(
                cli(
                    "projector",
                    "--nats",
                    url,
                    "--prefix",
                    prefix,
                    "--no-sqlite",
                    "--log-level",
                    "warning",
                ),
                tmp / f"projector-{prefix}.log",
            )
        stack = cls(worker, gateway, proj)
        try:
            await worker.ready("ready")
            await gateway.ready("ready")
            if proj is not None:
                await proj.ready("projecting")
        except BaseException:
            stack.stop()
            raise
        line = next(x for x in gateway.lines() if x.startswith("gateway: "))
        host_port = line.split()[1].removeprefix("http://")
        host, _, port = host_port.rpartition(":")
        stack.host, stack.port = host, int(port)
        return stack

    def connection(self) -> HttpConnection:
        return HttpConnection(self.host, self.port, TOKEN)

    def stop(self) -> None:
        for p in (self.gateway, self.projector, self.worker):
            if p is not None:
                p.stop()


class _Status(msgspec.Struct):
    status: str


class _RunId(msgspec.Struct):
    run_id: str


class _ChunkEvent(msgspec.Struct):
    offset: int = 0
    text: str = ""
    at: float = 0.0


# --- 1. start -> completed ----------------------------------------------------------------------


class Latency:
    """The variants of section 1, each returning (start answered, completed) seconds after
    its first byte went out."""

    def __init__(self, stack: Stack, client: Client, raw: Broker, raw_names: Names) -> None:
        self.stack = stack
        self.client = client
        self.raw = raw
        self.raw_names = raw_names
        self.api = stack.connection()
        self.sse = stack.connection()
        self.httpx: Any = None
        self.failures: list[str] = []

    async def open(self, with_httpx: bool) -> None:
        await self.api.open()
        await self.sse.open()
        if with_httpx:
            import httpx

            self.httpx = httpx.AsyncClient(
                base_url=f"http://{self.stack.host}:{self.stack.port}",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=30,
            )

    async def close(self) -> None:
        await self.api.close()
        await self.sse.close()
        if self.httpx is not None:
            await self.httpx.aclose()

    def variants(self) -> dict[str, Callable[[], Awaitable[tuple[float, float]]]]:
        v: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
            "http views": self.http_views,
            "nats views": self.nats_views,
            "http end": self.http_end,
            "nats result": self.nats_result,
            "raw publish": self.raw_publish,
            "http floor": self.http_floor,
        }
        if self.httpx is not None:
            v["httpx views"] = self.httpx_views
        return v

    async def _post(self) -> str:
        r = await self.api.request("POST", f"/v1/agents/{ONE_STEP}/runs", INPUT_JSON)
        if r.status != 201:
            raise HttpError(f"start answered {r.status}: {r.body[:200]!r}")
        return msgspec.json.decode(r.body, type=_RunId).run_id

    async def _until(self, path: str, done: Callable[[SseEvent], bool]) -> float:
        """Read the event stream at ``path`` to its end; the time the first event ``done``
        accepts arrived (the rest of the stream is drained untimed, leaving the connection
        ready for the next sample)."""
        at = float("nan")
        async for ev in await self.sse.open_events(path):
            if at != at and done(ev):
                at = time.perf_counter()
            if ev.event == "error":
                raise HttpError(f"{path}: error event {ev.data[:200]!r}")
        if at != at:
            raise HttpError(f"{path} ended without the awaited event")
        return at

    async def http_views(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        rid = await self._post()
        t1 = time.perf_counter()

        def completed(ev: SseEvent) -> bool:
            return (
                ev.event == "view"
                and msgspec.json.decode(ev.data, type=_Status).status == "completed"
            )

        t2 = await self._until(f"/v1/runs/{rid}/events", completed)
        return t1 - t0, t2 - t0

    async def http_end(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        rid = await self._post()
        t1 = time.perf_counter()
        t2 = await self._until(f"/v1/runs/{rid}/stream", lambda ev: ev.event == "end")
        return t1 - t0, t2 - t0

    async def nats_views(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        rid = await self.client.start(ONE_STEP, INPUT, wait=True)
        t1 = time.perf_counter()
        t2 = float("nan")
        async with contextlib.aclosing(self.client.watch(rid, timeout=30)) as views:
            async for view in views:
                if view.status == "completed":
                    t2 = time.perf_counter()
                    break
        if t2 != t2:
            raise RuntimeError(f"run {rid}: no completed view")
        return t1 - t0, t2 - t0

    async def nats_result(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        rid = await self.client.start(ONE_STEP, INPUT, wait=True)
        t1 = time.perf_counter()
        await self.client.result(rid, timeout=30)
        return t1 - t0, time.perf_counter() - t0

    async def raw_publish(self) -> tuple[float, float]:
        rid = tag()
        subject = self.raw_names.start(ONE_STEP, None, rid)
        t0 = time.perf_counter()
        ack = await self.raw.try_publish(subject, INPUT_JSON, {MSG_ID: f"start:{rid}"})
        t1 = time.perf_counter()
        if not hasattr(ack, "seq"):
            raise RuntimeError(f"raw publish refused: {ack}")
        return t1 - t0, t1 - t0

    async def http_floor(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        r = await self.api.request("GET", "/healthz")
        t1 = time.perf_counter()
        if r.status != 200:
            raise HttpError(f"/healthz answered {r.status}")
        return t1 - t0, t1 - t0

    async def httpx_views(self) -> tuple[float, float]:
        c = self.httpx
        t0 = time.perf_counter()
        r = await c.post(f"/v1/agents/{ONE_STEP}/runs", json=INPUT)
        if r.status_code != 201:
            raise HttpError(f"start answered {r.status_code}")
        rid = r.json()["run_id"]
        t1 = time.perf_counter()
        t2 = float("nan")
        async with c.stream("GET", f"/v1/runs/{rid}/events") as resp:
            event = ""
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "view" and t2 != t2:
                    if msgspec.json.decode(line[6:], type=_Status).status == "completed":
                        t2 = time.perf_counter()
        return t1 - t0, t2 - t0


async def latency_section(url: str, cfg: Config, tmp: Path, log: Log) -> dict[str, Any]:
    settings = Settings(prefix=f"gl{tag()}")
    raw_names = Names(f"gr{tag()}")
    raw = await Broker.connect(url, name="bench-gateway-raw")
    stack = await Stack.start(url, settings.prefix, tmp, projector=True, concurrency=256)
    client = await Client.connect(url, settings=settings)
    lat = Latency(stack, client, raw, raw_names)
    out: dict[str, Any] = {"load_before": loadavg()}
    try:
        inbox = next(
            c for c in stream_configs(raw_names, settings) if c["name"] == raw_names.inbox_stream
        )
        await raw.ensure_stream(inbox)
        await lat.open(cfg.httpx)
        variants = lat.variants()
        names = list(variants)
        log(f"latency: warm-up, {cfg.warmup} of each of {len(names)} variants")
        for _ in range(cfg.warmup):
            for name in names:
                await asyncio.sleep(cfg.gap)
                await variants[name]()
        rows: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        log(f"latency: {cfg.samples} samples of each, interleaved")
        cpu0 = _cpus(stack, None)
        t0 = time.perf_counter()
        for i in range(cfg.samples):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                await asyncio.sleep(cfg.gap)
                rows[name].append(await variants[name]())
        wall = time.perf_counter() - t0
        cpu1 = _cpus(stack, None)
        http_runs = sum(len(rows[n]) for n in names if n.startswith("http") and "floor" not in n)
        out.update(
            {
                "samples": cfg.samples,
                "wall": wall,
                "variants": {
                    n: {
                        "total": stats([r[1] for r in rows[n]]),
                        "start": stats([r[0] for r in rows[n]]),
                        "blocks_p50": _blocks([r[1] for r in rows[n]]),
                        "over_1s": sum(1 for r in rows[n] if r[1] > 1.0),
                    }
                    for n in names
                },
                "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0},
                "gateway_cpu_per_http_run": (cpu1["gateway"] - cpu0["gateway"]) / max(http_runs, 1),
                "load_after": loadavg(),
                "http_reconnects": lat.api.reopened + lat.sse.reopened,
            }
        )
        out["pairs"] = {
            "views": _pair(out["variants"], "http views", "nats views"),
            "end": _pair(out["variants"], "http end", "nats result"),
        }
    finally:
        await lat.close()
        await client.close()
        await raw.close()
        stack.stop()
    return out


def _cpus(stack: Stack, server_pid: int | None) -> dict[str, float]:
    out = {
        "bench": cpu_process(),
        "gateway": cpu_server(stack.gateway.pid),
        "worker": cpu_server(stack.worker.pid),
    }
    if stack.projector is not None:
        out["projector"] = cpu_server(stack.projector.pid)
    if server_pid is not None:
        out["nats-server"] = cpu_server(server_pid)
    return out


def _blocks(xs: list[float]) -> list[float]:
    size = len(xs) // BLOCKS
    return [pct(xs[b * size : (b + 1) * size], 50) for b in range(BLOCKS)]


def _pair(variants: dict[str, Any], http: str, nats: str) -> dict[str, Any]:
    h, n = variants[http], variants[nats]
    return {
        "http": http,
        "nats": nats,
        "ratio_p50": h["total"]["p50"] / n["total"]["p50"],
        "ratio_p99": h["total"]["p99"] / n["total"]["p99"],
        "ratio_p50_blocks": [a / b for a, b in zip(h["blocks_p50"], n["blocks_p50"], strict=True)],
        "extra_p50": h["total"]["p50"] - n["total"]["p50"],
        "start_ratio_p50": h["start"]["p50"] / n["start"]["p50"],
    }


# --- 2. fan-out to event-stream watchers --------------------------------------------------------


@dataclass
class Watcher:
    """One held-open ``GET /v1/runs/{id}/stream``; what it received, with receive times."""

    run_id: str
    got: list[tuple[float, bytes]] = field(default_factory=list)
    ended: bool = False
    error: str = ""

    async def hold(self, conn: HttpConnection, opened: asyncio.Event) -> None:
        try:
            events = await conn.open_events(f"/v1/runs/{self.run_id}/stream")
            opened.set()
            async for ev in events:
                if ev.event == "chunk":
                    self.got.append((time.time(), ev.data))
                elif ev.event == "end":
                    self.ended = True
                elif ev.event == "error":
                    self.error = ev.data.decode(errors="replace")[:200]
        except (OSError, HttpError, asyncio.IncompleteReadError) as e:
            self.error = f"{type(e).__name__}: {e}"[:200]
        finally:
            opened.set()
            await conn.close()


async def _wait_status(client: Client, rids: list[str], status: str, limit: float) -> list[str]:
    """Wait until every run has ``status``; the ones that did not within ``limit`` s."""
    deadline = time.monotonic() + limit
    left = list(rids)
    while left and time.monotonic() < deadline:
        got = await gather_limited([client.status(r) for r in left], 64)
        left = [r for r, s in zip(left, got, strict=True) if s != status]
        if left:
            await asyncio.sleep(0.2)
    return left


async def _direct_get_probe(
    b: Broker, stream: str, subject: str, stop: asyncio.Event
) -> list[float]:
    """Round trips of a direct get of the last chunk on ``subject``, every 20 ms until
    ``stop``: what each watcher's reader in the gateway waits for on every chunk (it answers
    a hint with a direct get), measured from here while the chunks are being written."""
    out: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await b.direct_get_last(stream, subject)
        out.append(time.perf_counter() - t0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)
    return out


async def _settled_rss(pid: int, seconds: float = 2.0) -> int:
    await asyncio.sleep(seconds)
    return rss(pid)


async def _fanout_round(
    stack: Stack,
    client: Client,
    rids: list[str],
    watchers_n: int,
    open_limit: int,
) -> tuple[list[Watcher], list[asyncio.Task[None]], float]:
    """Open ``watchers_n`` event streams over ``rids`` (round robin); the seconds it took."""
    watchers = [Watcher(rids[j % len(rids)]) for j in range(watchers_n)]
    tasks: list[asyncio.Task[None]] = []
    sem = asyncio.Semaphore(open_limit)

    async def open_one(w: Watcher) -> None:
        async with sem:
            conn = await stack.connection().open()
            opened = asyncio.Event()
            tasks.append(asyncio.create_task(w.hold(conn, opened)))
            await opened.wait()

    t0 = time.perf_counter()
    await asyncio.gather(*(open_one(w) for w in watchers))
    return watchers, tasks, time.perf_counter() - t0


async def fanout_section(
    url: str, cfg: Config, tmp: Path, server_pid: int | None, log: Log
) -> dict[str, Any]:
    settings = Settings(prefix=f"gf{tag()}")
    names = Names(settings.prefix)
    stack = await Stack.start(
        url, settings.prefix, tmp, projector=False, concurrency=max(256, cfg.runs + 16)
    )
    client = await Client.connect(url, settings=settings)
    observer = await Broker.connect(url, name="bench-gateway-observer")
    raw_got: list[tuple[float, bytes]] = []

    async def on_chunk(msg: Delivery) -> None:
        raw_got.append((time.time(), msg.data))

    out: dict[str, Any] = {"load_before": loadavg(), "runs": cfg.runs, "watchers": cfg.watchers}
    try:
        # Warm-up: a few watchers on a short run, so the gateway's code paths are loaded
        # before the memory is read.
        warm = await client.start(FANOUT, FanoutPlan(chunks=3, gap=0.02), wait=True)
        ws, ts, _ = await _fanout_round(stack, client, [warm], 8, 8)
        await client.signal(warm, "go", None)
        await asyncio.wait_for(asyncio.gather(*ts), 60)
        if not all(w.ended and len(w.got) == 3 for w in ws):
            log(f"fanout: warm-up watchers incomplete: {[(len(w.got), w.error) for w in ws]}")

        log(f"fanout: starting {cfg.runs} runs (they park on a signal)")
        span = cfg.chunk_gap
        plans = [
            FanoutPlan(chunks=cfg.chunks, gap=cfg.chunk_gap, phase=span * i / cfg.runs)
            for i in range(cfg.runs)
        ]
        rids = [f"fan{i}-{tag()}" for i in range(cfg.runs)]
        pairs = zip(rids, plans, strict=True)
        starts = [client.start(FANOUT, p, run_id=r, wait=True) for r, p in pairs]
        await gather_limited(starts, 64)
        late = await _wait_status(client, rids, "waiting", 120)
        if late:
            log(f"fanout: {len(late)} runs not waiting after 120 s")
        g0, s0 = await _settled_rss(stack.gateway.pid), rss(server_pid)
        log(f"fanout: opening {cfg.watchers} event streams ({cfg.watchers // cfg.runs}/run)")
        watchers, tasks, open_s = await _fanout_round(
            stack, client, rids, cfg.watchers, cfg.open_concurrency
        )
        refused = [w.error for w in watchers if w.error]
        g1, s1 = await _settled_rss(stack.gateway.pid), rss(server_pid)
        sub = await observer.subscribe(names.outputs_all, cb=on_chunk)
        await observer.flush()
        log(
            f"fanout: all open in {open_s:.1f} s; gateway RSS {g0 / 2**20:.1f} -> "
            f"{g1 / 2**20:.1f} MiB; signalling every run"
        )
        cpu0 = _cpus(stack, server_pid)
        signalled = time.time()
        t0 = time.perf_counter()
        probe_stop = asyncio.Event()
        probe = asyncio.create_task(
            _direct_get_probe(observer, names.output_stream, names.output(rids[0]), probe_stop)
        )
        await gather_limited([client.signal(r, "go", None) for r in rids], 64)
        signal_s = time.perf_counter() - t0
        limit = cfg.chunks * cfg.chunk_gap + span + 120
        _, pending = await asyncio.wait(tasks, timeout=limit)
        emit_s = time.perf_counter() - t0
        cpu1 = _cpus(stack, server_pid)
        probe_stop.set()
        out["direct_get"] = stats(await probe)
        mine = set(rids)
        stored = await observer.direct_get_range(names.output_stream, names.outputs_all)
        out["stored_lag"] = stats(
            [
                m.time - float(msgspec.json.decode(m.data, type=_ChunkEvent).text)
                for m in stored
                if names.subject_token(m.subject, 1) in mine
            ]
        )
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await sub.unsubscribe()
        g2 = await _settled_rss(stack.gateway.pid)
        out.update(_fanout_figures(cfg, watchers, raw_got, set(rids), signalled))
        out.update(
            {
                "open_seconds": open_s,
                "open_errors": len(refused),
                "open_error_sample": refused[:3],
                "signal_seconds": signal_s,
                "emission_seconds": emit_s,
                "not_ended": len(pending),
                "runs_not_waiting": len(late),
                "memory": {
                    "gateway_before": g0,
                    "gateway_open": g1,
                    "gateway_after_close": g2,
                    "gateway_per_watcher": (g1 - g0) / cfg.watchers,
                    "server_before": s0,
                    "server_open": s1,
                    "server_per_watcher": (s1 - s0) / cfg.watchers,
                },
                "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0},
                "load_after": loadavg(),
            }
        )
        out["cpu_share"] = {k: v / emit_s for k, v in out["cpu"].items()}
    finally:
        await observer.close()
        await client.close()
        stack.stop()
    return out


def _fanout_figures(
    cfg: Config,
    watchers: list[Watcher],
    raw_got: list[tuple[float, bytes]],
    mine: set[str],
    signalled: float,
) -> dict[str, Any]:
    """Delivery counts and lags; ``by_second`` cuts the lags by the second (after the
    signals) they were received in, to tell a steady lag from bursts at the runs' wake and
    end."""
    by_second: dict[int, list[float]] = {}
    lags_text: list[float] = []
    lags_at: list[float] = []
    short = dup = 0
    for w in watchers:
        offsets: list[int] = []
        for t, data in w.got:
            c = msgspec.json.decode(data, type=_ChunkEvent)
            offsets.append(c.offset)
            lags_text.append(t - float(c.text))
            lags_at.append(t - c.at)
            by_second.setdefault(int(t - signalled), []).append(t - float(c.text))
        if len(offsets) < cfg.chunks:
            short += 1
        if len(set(offsets)) < len(offsets) or offsets != sorted(offsets):
            dup += 1
    raw_lag: list[float] = []
    for t, data in raw_got:
        d = msgspec.json.decode(data)
        if d.get("run_id") in mine:
            raw_lag.append(t - float(d["text"]))
    delivered = sum(len(w.got) for w in watchers)
    return {
        "chunks_written": len(raw_lag),
        "expected_deliveries": cfg.chunks * len(watchers),
        "delivered": delivered,
        "watchers_short": short,
        "watchers_out_of_order_or_twice": dup,
        "watchers_ended": sum(1 for w in watchers if w.ended),
        "watchers_with_error": sum(1 for w in watchers if w.error),
        "error_sample": [w.error for w in watchers if w.error][:3],
        "lag": stats(lags_text),
        "lag_from_chunk_at": stats(lags_at),
        "raw_lag": stats(raw_lag),
        "by_second": [{"second": k, **stats(v)} for k, v in sorted(by_second.items())],
    }


# --- report -------------------------------------------------------------------------------------


def _ms(s: float) -> str:
    return "—" if s != s else f"{s * 1e3:,.2f} ms"


def _x(r: float) -> str:
    return "—" if r != r else f"{r:.2f}x"


def verdict(pair: dict[str, Any]) -> str:
    """``met`` when even the worst block's ratio is under the target, ``miss`` when even the
    best block's is over it, ``at target`` when the blocks straddle it."""
    blocks = pair["ratio_p50_blocks"]
    if max(blocks) < TARGET_HTTP_RATIO:
        return "met"
    if min(blocks) > TARGET_HTTP_RATIO:
        return "miss"
    return "at target (inside the noise)"


def render(cfg: Config, facts: dict[str, str], res: dict[str, Any]) -> str:
    lines = [
        "# sojourn HTTP gateway benchmark (issue 15)",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in facts.items()),
        "",
    ]
    lat = res.get("latency")
    if lat:
        lines += [
            f"## 1. Start -> completed, a 1-step run ({lat['samples']} samples of each, "
            f"interleaved; load {lat['load_before']} -> {lat['load_after']})",
            "",
            "| variant | start answered p50 | completed p50 | p90 | p99 | max | > 1 s "
            "| block p50s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, v in lat["variants"].items():
            blocks = ", ".join(f"{b * 1e3:.2f}" for b in v["blocks_p50"])
            lines.append(
                f"| {n} | {_ms(v['start']['p50'])} | {_ms(v['total']['p50'])} | "
                f"{_ms(v['total']['p90'])} | {_ms(v['total']['p99'])} | "
                f"{_ms(v['total']['max'])} | {v['over_1s']} | {blocks} |"
            )
        lines += [
            "",
            "| pair | ratio p50 | ratio p99 | block ratios (p50) | extra p50 | "
            f"target <= {TARGET_HTTP_RATIO}x |",
            "|---|---|---|---|---|---|",
        ]
        for p in lat["pairs"].values():
            blocks = ", ".join(f"{b:.2f}" for b in p["ratio_p50_blocks"])
            stalls = sum(lat["variants"][n]["over_1s"] for n in (p["http"], p["nats"]))
            p99 = _x(p["ratio_p99"]) + (f" ({stalls} samples > 1 s)" if stalls else "")
            lines.append(
                f"| {p['http']} / {p['nats']} | {_x(p['ratio_p50'])} | {p99} | "
                f"{blocks} | {_ms(p['extra_p50'])} | {verdict(p)} |"
            )
        cpu = ", ".join(f"{k} {v:.2f} s" for k, v in lat["cpu"].items())
        lines += [
            "",
            f"CPU over the timed samples ({lat['wall']:.1f} s): {cpu}; gateway CPU per HTTP "
            f"run {lat['gateway_cpu_per_http_run'] * 1e6:,.0f} µs; HTTP connections reopened "
            f"after the server closed an idle one: {lat['http_reconnects']}.",
            "",
        ]
    fan = res.get("fanout")
    if fan:
        m = fan["memory"]
        lines += [
            f"## 2. {fan['watchers']:,} event-stream watchers on one gateway "
            f"({fan['runs']} runs, {fan['watchers'] // fan['runs']} watchers each; load "
            f"{fan['load_before']} -> {fan['load_after']})",
            "",
            "| measurement | figure |",
            "|---|---|",
            f"| opening every stream ({cfg.open_concurrency} at a time) | "
            f"{fan['open_seconds']:.2f} s, {fan['open_errors']} errors |",
            f"| gateway VmRSS before / all open / after they closed | "
            f"{m['gateway_before'] / 2**20:.1f} / {m['gateway_open'] / 2**20:.1f} / "
            f"{m['gateway_after_close'] / 2**20:.1f} MiB |",
            f"| gateway memory per watcher | {m['gateway_per_watcher'] / 1024:.1f} KiB |",
            f"| nats-server memory per watcher | {m['server_per_watcher'] / 1024:.1f} KiB |",
            f"| chunks written / deliveries expected / delivered | {fan['chunks_written']:,} / "
            f"{fan['expected_deliveries']:,} / {fan['delivered']:,} |",
            f"| watchers short / out of order or twice / ended / with an error | "
            f"{fan['watchers_short']} / {fan['watchers_out_of_order_or_twice']} / "
            f"{fan['watchers_ended']} / {fan['watchers_with_error']} |",
            f"| delivery lag (text stamp -> watcher) p50 / p90 / p99 / max | "
            f"{_ms(fan['lag']['p50'])} / {_ms(fan['lag']['p90'])} / {_ms(fan['lag']['p99'])} / "
            f"{_ms(fan['lag']['max'])} |",
            f"| the same from `Chunk.at` p50 / p99 | {_ms(fan['lag_from_chunk_at']['p50'])} / "
            f"{_ms(fan['lag_from_chunk_at']['p99'])} |",
            f"| raw: core subscriber on `out.>` (same chunks) p50 / p99 | "
            f"{_ms(fan['raw_lag']['p50'])} / {_ms(fan['raw_lag']['p99'])} |",
            f"| raw: stored in the stream (its timestamp) - text stamp, p50 / p99 / max | "
            f"{_ms(fan['stored_lag']['p50'])} / {_ms(fan['stored_lag']['p99'])} / "
            f"{_ms(fan['stored_lag']['max'])} |",
            f"| raw: direct get of a run's last chunk, every 20 ms meanwhile, p50 / p99 / max | "
            f"{_ms(fan['direct_get']['p50'])} / {_ms(fan['direct_get']['p99'])} / "
            f"{_ms(fan['direct_get']['max'])} |",
            f"| emission (signal -> last stream ended) | {fan['emission_seconds']:.1f} s, "
            f"{fan['delivered'] / fan['emission_seconds']:,.0f} events/s delivered |",
            "| CPU share of one core over the emission | "
            + ", ".join(f"{k} {v:.0%}" for k, v in fan["cpu_share"].items())
            + " |",
            "",
            "Delivery lag by the second after the signals it was received in (p50 / p99 / max "
            "ms, deliveries): "
            + "; ".join(
                f"{b['second']}s {b['p50'] * 1e3:.1f}/{b['p99'] * 1e3:.1f}/{b['max'] * 1e3:.0f} "
                f"({b['n']:.0f})"
                for b in fan["by_second"]
            ),
            "",
        ]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------


async def run_all(cfg: Config, log: Log) -> dict[str, Any]:
    out: dict[str, Any] = {"fd_limit": raise_fd_limit(2 * cfg.watchers + 256)}
    with tempfile.TemporaryDirectory(prefix="sojourn-gw-", dir=cfg.store_dir) as tmp:
        async with EmbeddedServer(
            store_dir=Path(tmp) / "store", port=0, sync_interval=cfg.sync_interval
        ) as srv:
            if "latency" in cfg.sections:
                out["latency"] = await latency_section(srv.url, cfg, Path(tmp), log)
            if "fanout" in cfg.sections:
                out["fanout"] = await fanout_section(srv.url, cfg, Path(tmp), srv.pid, log)
    return out


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    facts = run_facts(cfg.store_dir)
    t0 = time.perf_counter()
    res = await run_all(cfg, log)
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, res))
    print(f"(bench took {elapsed:.0f} s)\n")
    out = {"config": asdict(cfg), "machine": facts, "results": res, "seconds": elapsed}
    print(json.dumps(out, default=str, separators=(",", ":")))
    return out


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
