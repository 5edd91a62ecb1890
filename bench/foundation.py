"""Foundation benchmark: sojourn's durable steps against raw JetStream CAS appends.

Run from the repository root::

    python -m bench.foundation                       # ~1 min, sync_interval: always
    python -m bench.foundation --quick               # ~10 s
    python -m bench.foundation --sync-interval always --sync-interval 2m   # both, ~1.7 min
    python -m bench.foundation --auth                # without, then with auth: ~2 min

For each ``--sync-interval`` it starts its own ``EmbeddedServer`` (free port, temp dir), then,
interleaved and repeated ``--repeats`` times (the table shows the median of the per-repeat
figures):

- raw: sequential CAS appends on one subject of a stream configured exactly like sojourn's
  events stream (``Broker.publish_raw`` with ``Nats-Expected-Last-Subject-Sequence`` and
  ``Nats-Msg-Id``, a body the size of a real StepCompleted+StepStarted decision);
  and 200 subjects appended concurrently (one writer task per subject);
- sojourn, one run of N trivial steps (worker in this process): per-step time is
  (RunCompleted.at - first StepStarted.at) / N from the recorded event stamps;
- sojourn, 200 runs x M steps started at once: aggregate steps/s;
- sojourn, K sequential 1-step runs: ``client.start`` -> ``client.result`` wall time, and the
  trigger publish -> ``RunCompleted.at`` time (the worker's stamp; same clock, same process).

Then (untimed) a trace of the broker operations per step and per 1-step run, and with
``--profile`` a cProfile of a sequential run. Nothing here asserts: it prints.

With ``--auth`` each setting is measured twice, the second time on a server with
least-privilege users (``sojourn.broker.auth``): the worker connects as a ``worker`` user, the
client as a ``client`` user, and the raw appends go through a ``worker``-role user of their own
prefix, so both sides pay the same authorization checks (the raw direct-request floor, which no
least-privilege role may serve, runs as an ``admin`` user).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import itertools
import logging
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import Broker, Delivery, EmbeddedServer, find_nats_server
from sojourn.broker.auth import AuthUser
from sojourn.broker.eventstore import Decision
from sojourn.broker.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, MSG_ID
from sojourn.broker.names import Names
from sojourn.broker.topology import consumer_configs, stream_configs
from sojourn.schemas.codec import encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunCompleted,
    RunStarted,
    StepCompleted,
    StepStarted,
)

from .trace import TracedBroker, gather_limited, profile_summary
from .util import (
    cpu_process,
    cpu_server,
    fmt_ms,
    fmt_rate,
    fmt_us,
    git_state,
    machine_facts,
    median,
    pct,
    run_bench,
    summarize,
)

ROOT = Path(__file__).resolve().parent.parent
TARGET_STEP_RATIO = 1.3
TARGET_ONE_STEP_P50 = 0.002
SECTIONS = ("seq", "conc", "lat")
BODY_TARGET = 300  # bytes of one steady-state decision (StepCompleted + StepStarted)


# --- the agents under test ----------------------------------------------------------------------


def _result_for_body(target: int) -> str:
    """A step result that makes a StepCompleted+StepStarted decision ~``target`` bytes."""
    n = 1
    while len(_sample_decision("r" * n)) < target:
        n += 1
    return "r" * n


def _sample_decision(result: str, position: int = 1000) -> bytes:
    now = time.time()
    return encode_events(
        [
            StepCompleted(
                position=position,
                name="tick",
                attempt=1,
                result=to_raw(result),
                duration=1.234567e-05,
                at=now,
            ),
            StepStarted(position=position + 1, name="tick", attempt=1, at=now),
        ]
    )


RESULT = _result_for_body(BODY_TARGET)


async def tick(i: int) -> str:
    """The trivial step: returns a small constant value."""
    return RESULT


@agent("chain")
async def chain(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step(tick, i)
    return n


async def once() -> int:
    return 1


@agent("single")
async def single(ctx: Context) -> int:
    return await ctx.step(once)


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    steps: int = 2000
    runs: int = 200
    run_steps: int = 50
    latency_runs: int = 300
    latency_gap: float = 0.005
    raw_appends: int = 2000
    repeats: int = 3
    sync_intervals: list[str] = field(default_factory=lambda: ["always"])
    auth_modes: tuple[bool, ...] = (False,)
    trace: bool = True
    profile: bool = False
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False
    sections: tuple[str, ...] = ("seq", "conc", "lat")


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.foundation",
        description="sojourn durable steps vs raw JetStream CAS appends (prints a table)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="~10 s version: N=500, 200 runs x 10 steps, K=100 1-step runs",
    )
    p.add_argument("--steps", type=int, help="steps of the sequential run (default 2000)")
    p.add_argument("--runs", type=int, help="concurrent runs (default 200)")
    p.add_argument("--run-steps", type=int, help="steps per concurrent run (default 50)")
    p.add_argument("--latency-runs", type=int, help="sequential 1-step runs (default 300)")
    p.add_argument(
        "--latency-gap",
        type=float,
        default=0.005,
        metavar="SECONDS",
        help="untimed pause between 1-step runs (default 0.005; 0 = back to back)",
    )
    p.add_argument(
        "--raw-appends",
        type=int,
        help="sequential raw appends per repeat (default: same as --steps)",
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats per measurement (default 3)")
    p.add_argument(
        "--sync-interval",
        action="append",
        dest="sync_intervals",
        metavar="DUR",
        help="JetStream sync_interval of the embedded server; repeat to compare "
        "(default: always; the NATS default is 2m)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="measure each setting twice: without, then with least-privilege users "
        "(worker and client credentials, raw appends by a worker-role user)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help="run only this section (seq, conc or lat); repeat to pick several",
    )
    p.add_argument(
        "--no-trace", action="store_true", help="skip the untimed broker-operation trace"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile one sequential run and print the top functions",
    )
    p.add_argument(
        "--store-dir",
        help="parent directory for the server's temp store (default: the system temp dir)",
    )
    p.add_argument("--json", dest="json_out", help="also write all figures to this JSON file")
    a = p.parse_args(argv)
    c = Config(quick=a.quick)
    if a.quick:
        c.steps, c.runs, c.run_steps, c.latency_runs = 500, 200, 10, 100
    c.steps = a.steps or c.steps
    c.runs = a.runs or c.runs
    c.run_steps = a.run_steps or c.run_steps
    c.latency_runs = a.latency_runs or c.latency_runs
    c.raw_appends = a.raw_appends or c.steps
    c.repeats = max(1, a.repeats)
    c.latency_gap = max(0.0, a.latency_gap)
    c.sync_intervals = a.sync_intervals or ["always"]
    c.auth_modes = (False, True) if a.auth else (False,)
    c.trace = not a.no_trace
    c.sections = tuple(x for x in SECTIONS if not a.only or x in a.only)
    c.profile = a.profile
    c.store_dir = a.store_dir
    c.json_out = a.json_out
    return c


# --- raw JetStream baseline -----------------------------------------------------------------


class RawBench:
    """CAS appends straight through ``Broker.publish_raw``, nothing else."""

    def __init__(
        self, broker: Broker, prefix: str, body: bytes, server_pid: Callable[[], int | None]
    ) -> None:
        self.b = broker
        self.names = Names(prefix)
        self.body = body
        self.server_pid = server_pid
        self._n = 0

    async def setup(self, settings: Settings) -> None:
        # Exactly the events stream sojourn creates (file storage, dedup window, direct get, ...).
        cfg = stream_configs(self.names, settings)[0]
        await self.b.ensure_stream(cfg)

    def _subject(self) -> tuple[str, str]:
        self._n += 1
        run = f"raw{self._n}-{uuid.uuid4().hex[:8]}"
        return self.names.events(run), run

    async def _writer(self, subject: str, run: str, n: int, lat: list[float]) -> None:
        seq = 0
        for _ in range(n):
            headers = {
                EXPECTED_LAST_SUBJECT_SEQUENCE: str(seq),
                MSG_ID: f"{run}:{seq}:rawwriter-1",
            }
            t = time.perf_counter()
            ack = await self.b.publish_raw(subject, self.body, headers)
            lat.append(time.perf_counter() - t)
            if "error" in ack:
                raise RuntimeError(f"raw append failed: {ack['error']}")
            seq = int(ack["seq"])

    async def sequential(self, n: int) -> dict[str, float]:
        subject, run = self._subject()
        lat: list[float] = []
        c0, s0 = cpu_process(), cpu_server(self.server_pid())
        t0 = time.perf_counter()
        await self._writer(subject, run, n, lat)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_server(self.server_pid())
        st = summarize(lat)
        return {**st, "rate": n / wall, "py_cpu": (c1 - c0) / n, "srv_cpu": (s1 - s0) / n}

    async def one_step_floor(
        self,
        client: Broker,
        settings: Settings,
        k: int,
        gap: float,
        service_broker: Broker | None = None,
    ) -> dict[str, dict[str, float]]:
        """The least JetStream work a 1-step run needs, with no sojourn code in between.

        ``inbox``: the current design's shape without its extra round trips: the trigger is
        published to a stream configured like sojourn's inbox and received by a pull consumer
        (fetch(batch=64) like the worker's intake), then two CAS appends
        ([RunStarted, StepStarted] and [StepCompleted, RunCompleted]).
        ``direct``: the trigger goes to the worker as a core NATS request (no inbox stream), the
        worker does the same two CAS appends and answers. Under auth the request travels over
        ``service_broker`` (no least-privilege role may serve a request subject).
        """
        cfgs = stream_configs(self.names, settings)
        await self.b.ensure_stream(cfgs[1])
        for stream, ccfg in consumer_configs(self.names, settings):
            if stream == self.names.inbox_stream:
                await self.b.ensure_consumer(stream, ccfg)
        pc = await self.b.pull(self.names.inbox_stream, self.names.intake_consumer)
        waiting: dict[str, asyncio.Future[float]] = {}

        async def two_appends(run: str) -> None:
            subject = self.names.events(run)
            a1 = await self.b.publish_raw(
                subject,
                self.body,
                {EXPECTED_LAST_SUBJECT_SEQUENCE: "0", MSG_ID: f"{run}:0:w"},
            )
            a2 = await self.b.publish_raw(
                subject,
                self.body,
                {
                    EXPECTED_LAST_SUBJECT_SEQUENCE: str(a1["seq"]),
                    MSG_ID: f"{run}:{a1['seq']}:w",
                },
            )
            if "error" in a2:
                raise RuntimeError(a2["error"])

        async def intake() -> None:
            while True:
                for m in await pc.fetch(batch=64, timeout=1.0):
                    run = m.data.decode()
                    await two_appends(run)
                    await m.ack()
                    fut = waiting.pop(run, None)
                    if fut is not None and not fut.done():
                        fut.set_result(time.perf_counter())

        async def service(msg: Delivery) -> None:
            await two_appends(msg.data.decode())
            await msg.respond(b"ok")

        svc_subject = f"{self.names.prefix}.svc.start"
        svc = service_broker or self.b
        requester = service_broker or client
        sub = await svc.subscribe(svc_subject, cb=service)
        await svc.flush()
        task = asyncio.create_task(intake())
        loop = asyncio.get_running_loop()
        inbox_l: list[float] = []
        direct_l: list[float] = []
        try:
            for i in range(k):
                await asyncio.sleep(gap)
                run = f"fa{i}-{uuid.uuid4().hex[:8]}"
                waiting[run] = fut = loop.create_future()
                t0 = time.perf_counter()
                ack = await client.publish_raw(
                    self.names.start("floor", client.user),
                    run.encode(),
                    {MSG_ID: f"start:floor:{run}"},
                )
                if "error" in ack:
                    raise RuntimeError(ack["error"])
                inbox_l.append(await asyncio.wait_for(fut, 10) - t0)
                await asyncio.sleep(gap)
                run = f"fb{i}-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                await requester.request(svc_subject, run.encode(), timeout=10)
                direct_l.append(time.perf_counter() - t0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await sub.unsubscribe()
        return {"inbox": summarize(inbox_l), "direct": summarize(direct_l)}

    async def concurrent(self, writers: int, n: int) -> dict[str, float]:
        subs = [self._subject() for _ in range(writers)]
        lat: list[float] = []
        c0, s0 = cpu_process(), cpu_server(self.server_pid())
        t0 = time.perf_counter()
        await asyncio.gather(*(self._writer(s, r, n, lat) for s, r in subs))
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_server(self.server_pid())
        total = writers * n
        return {
            "rate": total / wall,
            "p50": pct(lat, 50),
            "p99": pct(lat, 99),
            "py_cpu": (c1 - c0) / total,
            "srv_cpu": (s1 - s0) / total,
        }


# --- sojourn ----------------------------------------------------------------------------------


def _events(history: list[Decision]) -> list[Any]:
    return [e for d in history for e in d.events]


def _first(events: list[Any], tp: type) -> Any:
    for e in events:
        if isinstance(e, tp):
            return e
    raise LookupError(tp.__name__)


class SojournBench:
    def __init__(
        self, worker: Worker, client: Client, server_pid: Callable[[], int | None], tag: str
    ) -> None:
        self.w = worker
        self.c = client
        self.server_pid = server_pid
        self.tag = tag
        self._n = 0

    def _rid(self, kind: str) -> str:
        self._n += 1
        return f"{kind}{self._n}-{self.tag}"

    async def _wait_activations(self, target: int, limit: float = 300.0) -> None:
        """Wait (by polling an in-process counter, to keep the client off the hot path)."""
        deadline = time.perf_counter() + limit
        while self.w.activations_completed < target:
            if time.perf_counter() > deadline:
                raise TimeoutError("runs did not finish in time")
            await asyncio.sleep(0.002)

    async def _histories(self, rids: list[str]) -> list[list[Decision]]:
        out = await gather_limited([self.c.history(r) for r in rids], 20)
        for r, h in zip(rids, out, strict=True):
            if not h or not any(isinstance(e, RunCompleted) for e in h[-1].events):
                await self.c.result(r, timeout=60)  # the counter ran ahead: wait for real
        return out

    async def sequential(self, n: int) -> dict[str, float]:
        rid = self._rid("seq")
        base = self.w.activations_completed
        c0, s0 = cpu_process(), cpu_server(self.server_pid())
        t0 = time.perf_counter()
        await self.c.start("chain", n, run_id=rid)
        await self._wait_activations(base + 1)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_server(self.server_pid())
        assert await self.c.result(rid, timeout=60) == n
        (hist,) = await self._histories([rid])
        ev = _events(hist)
        ss0 = _first(ev, StepStarted)
        rc = _first(ev, RunCompleted)
        per_step = (rc.at - ss0.at) / n
        starts = [e.at for e in ev if isinstance(e, StepStarted)]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        sizes = [len(encode_events(d.events)) for d in hist[2:-1]]
        return {
            "per_step": per_step,
            "step_p50": pct(gaps, 50),
            "step_p99": pct(gaps, 99),
            "rate": 1.0 / per_step,
            "wall_per_step": wall / n,
            "appends_per_step": (len(hist) - 1) / n,
            "py_cpu": (c1 - c0) / n,
            "srv_cpu": (s1 - s0) / n,
            "msg_bytes": sum(sizes) / len(sizes) if sizes else float("nan"),
        }

    async def concurrent(self, runs: int, m: int) -> dict[str, float]:
        rids = [self._rid("conc") for _ in range(runs)]
        base = self.w.activations_completed
        c0, s0 = cpu_process(), cpu_server(self.server_pid())
        w0 = time.time()
        t0 = time.perf_counter()
        await asyncio.gather(*(self.c.start("chain", m, run_id=r) for r in rids))
        await self._wait_activations(base + runs)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_server(self.server_pid())
        hists = await self._histories(rids)
        evs = [_events(h) for h in hists]
        last_rc = max(_first(e, RunCompleted).at for e in evs)
        first_ss = min(_first(e, StepStarted).at for e in evs)
        last_rs = max(_first(e, RunStarted).at for e in evs)
        durations = [_first(e, RunCompleted).at - _first(e, StepStarted).at for e in evs]
        total = runs * m
        return {
            "rate": total / (last_rc - w0),
            "steady_rate": total / (last_rc - first_ss),
            "wall": wall,
            "last_started": last_rs - w0,
            "run_p50": pct(durations, 50),
            "appends_per_step": sum(len(h) - 1 for h in hists) / total,
            "py_cpu": (c1 - c0) / total,
            "srv_cpu": (s1 - s0) / total,
        }

    async def latency(self, k: int, observer: Broker, gap: float) -> dict[str, Any]:
        """K sequential 1-step runs: client view and worker-stamped view."""
        seen: dict[str, float] = {}
        prefix = self.c.names.prefix

        async def on_msg(msg: Delivery) -> None:
            if b"run.completed.v1" in msg.data:
                seen.setdefault(msg.subject[len(prefix) + 4 :], time.time())

        sub = await observer.subscribe(self.c.names.events_all, cb=on_msg)
        await observer.flush()
        rows: list[tuple[str, float, float, float]] = []
        try:
            for _ in range(k):
                # Untimed pause: the previous run's lease release and wake ack land after its
                # completion; without it they overlap this run's start on a 2-core machine.
                await asyncio.sleep(gap)
                rid = self._rid("one")
                w0 = time.time()
                t0 = time.perf_counter()
                await self.c.start("single", run_id=rid)
                await self.c.result(rid, timeout=30)
                e2e = time.perf_counter() - t0
                rows.append((rid, w0, e2e, time.time()))
        finally:
            await sub.unsubscribe()
        hists = await self._histories([r[0] for r in rows])
        e2e_l, server_l, observed_l = [], [], []
        phases: dict[str, list[float]] = {p: [] for p in PHASES}
        for (rid, w0, e2e, w_end), h in zip(rows, hists, strict=True):
            ev = _events(h)
            rs, ss = _first(ev, RunStarted), _first(ev, StepStarted)
            sc, rc = _first(ev, StepCompleted), _first(ev, RunCompleted)
            e2e_l.append(e2e)
            server_l.append(rc.at - w0)
            obs = seen.get(rid)
            if obs is not None:
                observed_l.append(obs - w0)
            phases["client publish -> intake received trigger"].append(rs.trigger.received_at - w0)
            phases["RunStarted stamped -> StepStarted stamped"].append(ss.at - rs.at)
            phases["StepStarted stamped -> StepCompleted stamped"].append(sc.at - ss.at)
            phases["StepCompleted -> RunCompleted stamped"].append(rc.at - sc.at)
            if obs is not None:
                phases["RunCompleted stamped -> seen by a subscriber"].append(obs - rc.at)
                phases["seen by a subscriber -> client.result returned"].append(w_end - obs)
        return {
            "e2e": summarize(e2e_l),
            "server": summarize(server_l),
            "observed": summarize(observed_l),
            "phases": {p: pct(v, 50) for p, v in phases.items()},
        }


PHASES = (
    "client publish -> intake received trigger",
    "RunStarted stamped -> StepStarted stamped",
    "StepStarted stamped -> StepCompleted stamped",
    "StepCompleted -> RunCompleted stamped",
    "RunCompleted stamped -> seen by a subscriber",
    "seen by a subscriber -> client.result returned",
)


# --- one server / durability setting ----------------------------------------------------------


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _med(reps: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in reps:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return median(vals)


def bench_users(tag: str) -> list[AuthUser]:
    """Least-privilege users for the sojourn, raw and trace prefixes of one bench server."""

    def pw() -> str:
        return secrets.token_urlsafe(18)

    raw, trace = f"raw{tag}", f"trace{tag}"
    return [
        AuthUser("worker", pw(), "worker"),
        AuthUser("client", pw(), "client"),
        AuthUser("rawworker", pw(), "worker", prefix=raw),
        AuthUser("rawclient", pw(), "client", prefix=raw),
        AuthUser("rawadmin", pw(), "admin"),
        AuthUser("traceworker", pw(), "worker", prefix=trace),
        AuthUser("traceclient", pw(), "client", prefix=trace),
    ]


async def bench_setting(
    cfg: Config, sync_interval: str, log: Callable[[str], None], auth: bool = False
) -> dict[str, Any]:
    parent = cfg.store_dir or None
    label = sync_interval + (", auth" if auth else "")
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="sojourn-bench-", dir=parent) as tmp:
        settings = Settings(prefix=f"bench{tag}")
        srv = EmbeddedServer(
            store_dir=tmp,
            port=0,
            sync_interval=sync_interval,
            auth=bench_users(tag) if auth else None,
            auth_prefix=settings.prefix,
        )

        def url(user: str) -> str:
            return srv.url_for(user) if auth else srv.url

        async with srv:
            body = _sample_decision(RESULT)
            raw_broker = await Broker.connect(url("rawworker"), name="bench-raw")
            raw_client = await Broker.connect(url("rawclient"), name="bench-raw-client")
            service = await Broker.connect(url("rawadmin"), name="bench-raw-svc") if auth else None
            raw = RawBench(raw_broker, f"raw{tag}", body, lambda: srv.pid)
            await raw.setup(settings)
            worker = Worker([chain, single], nats=url("worker"), settings=settings)
            await worker.start()
            client = await Client.connect(url("client"), settings=settings)
            # Watches the runs' event subjects: a client may; a worker-role user may not.
            observer = await Broker.connect(url("client"), name="bench-observer") if auth else None
            watcher = observer or raw_broker
            soj = SojournBench(worker, client, lambda: srv.pid, tag)
            out: dict[str, Any] = {
                "sync_interval": sync_interval,
                "auth": auth,
                "body_bytes": len(body),
                "reps": [],
                "load_before": _loadavg(),
            }
            try:
                log(f"[{label}] warm-up")
                sec = cfg.sections
                await raw.sequential(300)
                await soj.sequential(300)
                if "conc" in sec:
                    await raw.concurrent(50, 5)
                    await soj.concurrent(50, 5)
                if "lat" in sec:
                    await soj.latency(30, watcher, cfg.latency_gap)
                    await raw.one_step_floor(raw_client, settings, 30, cfg.latency_gap, service)
                for rep in range(cfg.repeats):
                    r: dict[str, Any] = {}

                    def step(what: str, rep: int = rep) -> None:
                        log(f"[{label}] repeat {rep + 1}/{cfg.repeats}: {what}")

                    step("raw sequential")  # always: the other sections' ratios use it
                    r["raw_seq"] = await raw.sequential(cfg.raw_appends)
                    if "seq" in sec:
                        step("sojourn sequential")
                        r["soj_seq"] = await soj.sequential(cfg.steps)
                    if "conc" in sec:
                        step("raw concurrent")
                        r["raw_conc"] = await raw.concurrent(cfg.runs, cfg.run_steps)
                        step("sojourn concurrent")
                        r["soj_conc"] = await soj.concurrent(cfg.runs, cfg.run_steps)
                    if "lat" in sec:
                        step("1-step latency")
                        r["lat"] = await soj.latency(cfg.latency_runs, watcher, cfg.latency_gap)
                        step("raw 1-step floor")
                        r["floor"] = await raw.one_step_floor(
                            raw_client, settings, cfg.latency_runs, cfg.latency_gap, service
                        )
                    out["reps"].append(r)
                if cfg.trace and "seq" in cfg.sections and "lat" in cfg.sections:
                    log(f"[{label}] trace (untimed)")
                    out["trace"] = await trace_pass(
                        url("traceworker"), url("traceclient"), cfg, f"trace{tag}"
                    )
                if cfg.profile:
                    log(f"[{label}] profile (untimed)")
                    out["profile"] = await profile_pass(soj, cfg.steps)
            finally:
                await client.close()
                await worker.stop()
                await raw_broker.close()
                await raw_client.close()
                for extra in (service, observer):
                    if extra is not None:
                        await extra.close()
    out["load_after"] = _loadavg()
    out["summary"] = summarize_setting(out["reps"])
    return out


def summarize_setting(reps: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    have = reps[0].keys() if reps else ()
    for key in ("p50", "p90", "p99", "mean", "rate", "py_cpu", "srv_cpu"):
        s[f"raw_seq_{key}"] = _med(reps, "raw_seq", key)
    if "soj_seq" in have:
        for key in (
            "per_step",
            "step_p50",
            "step_p99",
            "rate",
            "wall_per_step",
            "appends_per_step",
            "py_cpu",
            "srv_cpu",
            "msg_bytes",
        ):
            s[f"soj_seq_{key}"] = _med(reps, "soj_seq", key)
        ratios = [r["soj_seq"]["per_step"] / r["raw_seq"]["p50"] for r in reps]
        s["seq_ratio_per_rep"] = median(ratios)
        s["seq_ratio_min"], s["seq_ratio_max"] = min(ratios), max(ratios)
    if "soj_conc" in have:
        for key in ("rate", "p50", "p99", "py_cpu", "srv_cpu"):
            s[f"raw_conc_{key}"] = _med(reps, "raw_conc", key)
        for key in (
            "rate",
            "steady_rate",
            "wall",
            "last_started",
            "run_p50",
            "appends_per_step",
            "py_cpu",
            "srv_cpu",
        ):
            s[f"soj_conc_{key}"] = _med(reps, "soj_conc", key)
    if "lat" in have:
        for view in ("e2e", "server", "observed"):
            for key in ("p50", "p90", "p99"):
                s[f"lat_{view}_{key}"] = _med(reps, "lat", view, key)
        for view in ("inbox", "direct"):
            for key in ("p50", "p90", "p99"):
                s[f"floor_{view}_{key}"] = _med(reps, "floor", view, key)
        s["phases"] = {p: _med(reps, "lat", "phases", p) for p in PHASES}
    return s


# --- untimed diagnostics ----------------------------------------------------------------------


async def trace_pass(
    worker_url: str, client_url: str, cfg: Config, prefix: str | None = None
) -> dict[str, Any]:
    """Count and time the worker's broker operations for a sequential run and a 1-step run."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(prefix=prefix or f"trace{tag}")
    wb = await Broker.connect(worker_url, name="bench-traced-worker")
    tracer = TracedBroker(wb, settings.prefix)
    worker = Worker([chain, single], broker=wb, settings=settings)
    await worker.start()
    client = await Client.connect(client_url, settings=settings)
    out: dict[str, Any] = {}
    try:
        # warm this prefix (topology, lease cache, code paths)
        await client.start("chain", 20, run_id=f"w1-{tag}")
        await client.result(f"w1-{tag}", timeout=30)
        n = min(cfg.steps, 1000)
        base = worker.activations_completed
        tracer.start()
        t0 = time.perf_counter()
        await client.start("chain", n, run_id=f"seq-{tag}")
        while worker.activations_completed < base + 1:  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        wall = time.perf_counter() - t0
        ops = tracer.stop()
        out["seq_steps"] = n
        out["seq_wall"] = wall
        out["seq"] = {f"{k[0]}|{k[1]}": v for k, v in TracedBroker.by_category(ops).items()}
        appends = [o.dt for o in ops if o.cat == "event append (CAS)"]
        out["seq_append_p50"] = pct(appends, 50)
        out["seq_append_total"] = sum(appends)
        # 1-step runs: the worker's operations between trigger and completion
        timelines = []
        for i in range(21):
            rid = f"one{i}-{tag}"
            await asyncio.sleep(0.05)  # let the previous run's lease release and acks settle
            tracer.start()
            t0 = time.perf_counter()
            await client.start("single", run_id=rid)
            await client.result(rid, timeout=30)
            await asyncio.sleep(0.01)  # the worker's release/ack after completion
            ops = tracer.stop()
            ops.sort(key=lambda o: o.t0 + o.dt if o.kind == "fetch" else o.t0)
            timelines.append([(o.t0 - t0, o.dt, o.kind, o.cat) for o in ops])
        # the median run by its number of operations and duration
        timelines.sort(
            key=lambda tl: max((a + b for a, b, _, c in tl if c == "event append (CAS)"), default=0)
        )
        out["one_step_timeline"] = timelines[len(timelines) // 2]
    finally:
        await client.close()
        await worker.stop()
        await wb.close()
    return out


async def profile_pass(soj: SojournBench, n: int) -> str:
    """cProfile of the worker while one N-step run executes (start to the worker's finish;
    the bench's own history reads are outside the profile)."""
    rid = soj._rid("prof")
    base = soj.w.activations_completed
    prof = cProfile.Profile()
    prof.enable()
    try:
        await soj.c.start("chain", n, run_id=rid)
        await soj._wait_activations(base + 1)
    finally:
        prof.disable()
    return profile_summary(prof)


# --- report -----------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _borderline(s: dict[str, Any]) -> str:
    lo, hi = s["seq_ratio_min"], s["seq_ratio_max"]
    if lo <= TARGET_STEP_RATIO < hi:
        return (
            f" (borderline: paired per-repeat ratios {lo:.2f}x - {hi:.2f}x, "
            f"median {s['seq_ratio_per_rep']:.2f}x)"
        )
    return ""


def render(cfg: Config, facts: dict[str, str], results: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    add = lines.append
    add("## Machine")
    add("")
    for k, v in facts.items():
        add(f"- {k}: {v}")
    add("")
    add(
        f"Parameters: sequential run N={cfg.steps} steps; {cfg.runs} concurrent runs x "
        f"M={cfg.run_steps} steps; K={cfg.latency_runs} 1-step runs; raw sequential "
        f"{cfg.raw_appends} appends; {cfg.latency_gap * 1e3:g} ms idle between 1-step runs; "
        f"{cfg.repeats} repeats, median of the per-repeat figures; sections: "
        f"{', '.join(cfg.sections)}."
    )
    for res in results:
        s = res["summary"]
        si = res["sync_interval"]
        raw_p50, raw_mean = s["raw_seq_p50"], s["raw_seq_mean"]
        add("")
        if res.get("auth"):
            add(f"## sync_interval: {si}, with authentication")
            add("")
            add(
                "Least-privilege users: the worker and the client connect with worker and client "
                "credentials; the raw appends go through a worker-role user of their own prefix."
            )
        else:
            add(f"## sync_interval: {si}")
        add("")
        add(
            "| measurement | raw JetStream (same server, same run) | sojourn | ratio | target "
            "| verdict |"
        )
        add("|---|---|---|---|---|---|")
        has = set(cfg.sections)
        if "seq" in has:
            step = s["soj_seq_per_step"]
            add(
                f"| sequential: time per durable step (1 run, N={cfg.steps}) "
                f"| CAS append p50 {fmt_us(raw_p50)} (mean {fmt_us(raw_mean)}, "
                f"{fmt_rate(s['raw_seq_rate'], 'appends')}) "
                f"| {fmt_us(step)} ({fmt_rate(s['soj_seq_rate'], 'steps')}) "
                f"| {step / raw_p50:.2f}x p50, {step / raw_mean:.2f}x mean "
                f"| <= {TARGET_STEP_RATIO}x raw p50 "
                f"| {_verdict(step <= TARGET_STEP_RATIO * raw_p50)}{_borderline(s)} |"
            )
        if "conc" in has:
            conc_ratio = s["soj_conc_rate"] / s["raw_conc_rate"]
            add(
                f"| {cfg.runs} concurrent runs x {cfg.run_steps} steps: aggregate "
                f"| {cfg.runs} subjects x {cfg.run_steps} appends: "
                f"{fmt_rate(s['raw_conc_rate'], 'appends')} "
                f"| {fmt_rate(s['soj_conc_rate'], 'steps')} (trigger -> last completion; "
                f"{fmt_rate(s['soj_conc_steady_rate'], 'steps')} first step -> last "
                f"completion) | {conc_ratio:.2f}x | none set (>= {1 / TARGET_STEP_RATIO:.2f}x "
                f"would match the per-step target) "
                f"| {_verdict(conc_ratio >= 1 / TARGET_STEP_RATIO)} (implied) |"
            )
        if "lat" in has:
            fl = (
                f"floor, inbox hop + 2 CAS appends: p50 {fmt_ms(s['floor_inbox_p50'])}; "
                f"floor, direct request + 2 CAS appends: p50 {fmt_ms(s['floor_direct_p50'])}"
            )
            for view, label in (
                ("e2e", "client.start -> client.result returns"),
                ("server", "trigger publish -> RunCompleted.at (worker stamp)"),
                ("observed", "trigger publish -> RunCompleted seen by a subscriber"),
            ):
                p50 = s[f"lat_{view}_p50"]
                add(
                    f"| 1-step run, {label}: p50 / p90 / p99 | {fl if view == 'e2e' else '〃'} "
                    f"| {fmt_ms(p50)} / {fmt_ms(s[f'lat_{view}_p90'])} / "
                    f"{fmt_ms(s[f'lat_{view}_p99'])} "
                    f"| {p50 / raw_p50:.1f}x raw append p50; {p50 / s['floor_inbox_p50']:.1f}x "
                    f"inbox floor | <= 2 ms p50 | {_verdict(p50 <= TARGET_ONE_STEP_P50)} |"
                )
        add("")
        add("Details (medians over repeats):")
        add("")
        add("| figure | value |")
        add("|---|---|")
        add(
            f"| raw sequential CAS append p50 / p90 / p99 | {fmt_us(raw_p50)} / "
            f"{fmt_us(s['raw_seq_p90'])} / {fmt_us(s['raw_seq_p99'])} |"
        )
        add(
            f"| load average before / after (other processes share this machine) "
            f"| {res['load_before']} / {res['load_after']} |"
        )
        if "seq" in has:
            add(
                f"| sojourn sequential, per step: mean / p50 / p99 (StepStarted to StepStarted) "
                f"| {fmt_us(step)} / {fmt_us(s['soj_seq_step_p50'])} / "
                f"{fmt_us(s['soj_seq_step_p99'])} |"
            )
            add(
                f"| per-step mean / raw p50, per repeat: median (min - max) "
                f"| {s['seq_ratio_per_rep']:.2f}x ({s['seq_ratio_min']:.2f}x - "
                f"{s['seq_ratio_max']:.2f}x) |"
            )
            add(
                f"| per-step p50 / raw p50; per-step mean / raw mean "
                f"| {s['soj_seq_step_p50'] / raw_p50:.2f}x; {step / raw_mean:.2f}x |"
            )
            add(
                f"| raw append body / sojourn steady-state decision body "
                f"| {res['body_bytes']} B / {s['soj_seq_msg_bytes']:.0f} B |"
            )
            add(
                f"| sojourn sequential: broker appends per step (ideal 1.00) "
                f"| {s['soj_seq_appends_per_step']:.3f} |"
            )
            add(
                f"| sojourn sequential: wall (start -> worker done) per step | "
                f"{fmt_us(s['soj_seq_wall_per_step'])} |"
            )
            add(
                f"| Python CPU per step, sojourn / per raw append "
                f"| {fmt_us(s['soj_seq_py_cpu'])} / {fmt_us(s['raw_seq_py_cpu'])} |"
            )
            add(
                f"| nats-server CPU per step, sojourn / per raw append "
                f"| {fmt_us(s['soj_seq_srv_cpu'])} / {fmt_us(s['raw_seq_srv_cpu'])} |"
            )
        if "conc" in has:
            add(
                f"| raw concurrent: append latency p50 / p99 under load | "
                f"{fmt_ms(s['raw_conc_p50'])} / {fmt_ms(s['raw_conc_p99'])} |"
            )
            ideal = (cfg.run_steps + 1) / cfg.run_steps
            add(
                f"| sojourn concurrent: broker appends per step (ideal {ideal:.2f}) "
                f"| {s['soj_conc_appends_per_step']:.3f} |"
            )
            add(
                f"| sojourn concurrent: last run's RunStarted after trigger burst | "
                f"{fmt_ms(s['soj_conc_last_started'])} |"
            )
            add(
                f"| sojourn concurrent: one run's duration p50 (first step -> completed) | "
                f"{fmt_ms(s['soj_conc_run_p50'])} |"
            )
            add(
                f"| Python CPU per step, sojourn concurrent / per raw concurrent append "
                f"| {fmt_us(s['soj_conc_py_cpu'])} / {fmt_us(s['raw_conc_py_cpu'])} |"
            )
            add(
                f"| nats-server CPU per step, sojourn concurrent / per raw concurrent append "
                f"| {fmt_us(s['soj_conc_srv_cpu'])} / {fmt_us(s['raw_conc_srv_cpu'])} |"
            )
        if "lat" in has:
            add(
                f"| raw 1-step floors p50 / p90 / p99: inbox hop + 2 appends; direct request "
                f"+ 2 appends | {fmt_ms(s['floor_inbox_p50'])} / "
                f"{fmt_ms(s['floor_inbox_p90'])} / {fmt_ms(s['floor_inbox_p99'])}; "
                f"{fmt_ms(s['floor_direct_p50'])} / {fmt_ms(s['floor_direct_p90'])} / "
                f"{fmt_ms(s['floor_direct_p99'])} |"
            )
            add("")
            add("1-step run, where the time goes (p50 of each phase, from event stamps):")
            add("")
            add("| phase | p50 |")
            add("|---|---|")
            for p, v in s["phases"].items():
                add(f"| {p} | {fmt_ms(v)} |")
        tr = res.get("trace")
        if tr:
            n = tr["seq_steps"]
            add("")
            add(
                f"Worker broker operations per step (traced sequential run, N={n}, "
                f"{fmt_us(tr['seq_wall'] / n)} wall per step; appends p50 "
                f"{fmt_us(tr['seq_append_p50'])}, "
                f"{100 * tr['seq_append_total'] / tr['seq_wall']:.0f} % "
                f"of wall spent awaiting appends):"
            )
            add("")
            add("| operation | kind | per step | mean time |")
            add("|---|---|---|---|")
            for key, (count, total) in tr["seq"].items():
                kind, cat = key.split("|", 1)
                if kind == "fetch":
                    continue
                add(
                    f"| {cat} | {'awaited round trip' if kind == 'rt' else 'fire-and-forget'} "
                    f"| {count / n:.3f} | {fmt_us(total / count)} |"
                )
            add("")
            add(
                "Worker broker operations of one 1-step run (median of 21; t from the client's "
                "publish):"
            )
            add("")
            add("| t | duration | operation | kind |")
            add("|---|---|---|---|")
            for t, dt, kind, cat in tr["one_step_timeline"]:
                if kind == "fetch":  # show when the long poll returned, and how long it was
                    add(f"| {fmt_ms(t + dt)} | (polled {fmt_ms(dt)}) | {cat} | returned |")
                    continue
                add(
                    f"| {fmt_ms(t)} | {fmt_us(dt) if kind == 'rt' else '—'} | {cat} "
                    f"| {'awaited' if kind == 'rt' else 'publish'} |"
                )
        if res.get("profile"):
            add("")
            add("```")
            add(res["profile"].rstrip())
            add("```")
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)

    def log(msg: str) -> None:
        print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    binary = find_nats_server()
    facts = machine_facts(binary, Path(cfg.store_dir or tempfile.gettempdir()))
    facts["event loop"] = type(asyncio.get_running_loop()).__module__.split(".")[0]
    facts["sojourn"] = git_state(ROOT)
    t0 = time.perf_counter()
    results = []
    for si in cfg.sync_intervals:
        for auth in cfg.auth_modes:
            results.append(await bench_setting(cfg, si, log, auth))
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, results))
    if len(cfg.auth_modes) > 1 and "seq" in cfg.sections:
        print()
        for si in cfg.sync_intervals:
            pair = [r for r in results if r["sync_interval"] == si]
            ratios = ", ".join(
                f"{'with' if r['auth'] else 'without'} auth "
                f"{r['summary']['seq_ratio_per_rep']:.2f}x "
                f"(raw p50 {fmt_us(r['summary']['raw_seq_p50'])})"
                for r in pair
            )
            print(f"per-step ratio, sync_interval {si}: {ratios}")
    print(f"\n(bench took {elapsed:.0f} s)")
    return {"config": cfg.__dict__, "machine": facts, "results": results}


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
