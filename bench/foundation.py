"""Foundation benchmark: sojourn's durable steps against raw JetStream CAS appends.

Run from the repository root::

    python -m bench.foundation                       # ~1 min, sync_interval: always
    python -m bench.foundation --quick               # ~10 s
    python -m bench.foundation --sync-interval always --sync-interval 2m   # both, ~1.7 min
    python -m bench.foundation --auth                # without, then with auth: ~2 min
    python -m bench.foundation --replicas 3          # R3 streams on a 3-node loopback cluster

For each ``--sync-interval`` it starts its own ``EmbeddedServer`` (free port, temp dir), or with
``--replicas N`` (3 or 5) a ``LocalCluster`` of N nats-server processes on loopback and
every stream (sojourn's and the raw baselines') created with N replicas. On a cluster every
connection of the bench goes to node ``n1`` and every stream's and consumer's leader is moved to
``n1`` before the timed repeats, so that both sides of each pair pay the same path: a
leader-local append that is acknowledged once a quorum has it. Then, interleaved and
repeated ``--repeats`` times (the table shows the median of the per-repeat figures, and the
ratios are taken per repeat, raw and sojourn measured back to back):

- raw: sequential CAS appends on one subject of a stream configured exactly like sojourn's
  events stream (``Broker.publish_raw`` with ``Nats-Expected-Last-Subject-Sequence`` and
  ``Nats-Msg-Id``, a body the size of a real StepCompleted+StepStarted decision);
  and 200 subjects appended concurrently (one writer task per subject);
- sojourn, one run of N trivial steps (worker in this process): per-step time is
  (RunCompleted.at - first StepStarted.at) / N from the recorded event stamps;
- sojourn, 200 runs x M steps started at once: aggregate steps/s; and the same for the short
  shape of issue 12 (100 runs x 10 steps, against 100 subjects x 10 raw appends);
- sojourn, K sequential 1-step runs: ``client.start`` -> ``client.result`` wall time, and the
  trigger publish -> ``RunCompleted.at`` time (the worker's stamp; same clock, same process),
  and the publish -> ``RunCompleted`` seen by a subscriber, against the raw inbox floor;
- parked runs: N runs that wait for a signal (no timeout, so no timer), against N subjects
  holding the same event messages written raw: nats-server RSS growth per run (all nodes'
  mean on a cluster).

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
import random
import secrets
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import BROKER_ERRORS, Broker, Delivery, EmbeddedServer
from sojourn.broker.auth import AuthUser
from sojourn.broker.cluster import LocalCluster
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
    loadavg,
    log,
    median,
    pct,
    run_bench,
    run_facts,
    summarize,
)
from .waits import rss

TARGET_STEP_RATIO = 1.3
TARGET_ONE_STEP_P50 = 0.002
TARGET_ONE_STEP_FLOOR_RATIO = 1.3  # issue 12: a 1-step run within 1.3x the raw inbox floor
TARGET_SHORT_CONC_RATIO = 0.8  # issue 12: 100 runs x 10 steps >= 0.8x the raw aggregate
TARGET_PARKED_BYTES = 10_000  # issue 12: nats-server memory per parked run
SECTIONS = ("seq", "conc", "lat", "park")
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


@agent("parked")
async def parked(ctx: Context) -> Any:
    """Parks at once on a signal it is never sent (no timeout: no timer either)."""
    return await ctx.wait_for("go")


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    steps: int = 2000
    runs: int = 200
    run_steps: int = 50
    latency_runs: int = 300
    latency_gap: float = 0.005
    raw_appends: int = 2000
    short_runs: int = 100
    short_steps: int = 10
    park_runs: int = 5000
    repeats: int = 3
    replicas: int = 1
    sync_intervals: list[str] = field(default_factory=lambda: ["always"])
    auth_modes: tuple[bool, ...] = (False,)
    trace: bool = True
    profile: bool = False
    store_dir: str | None = None
    json_out: str | None = None
    quick: bool = False
    sections: tuple[str, ...] = SECTIONS


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.foundation",
        description="sojourn durable steps vs raw JetStream CAS appends (prints a table)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="~15 s version: N=500, 200 runs x 10 steps, K=100 1-step runs, 2,000 parked",
    )
    p.add_argument("--steps", type=int, help="steps of the sequential run (default 2000)")
    p.add_argument("--runs", type=int, help="concurrent runs (default 200)")
    p.add_argument("--run-steps", type=int, help="steps per concurrent run (default 50)")
    p.add_argument(
        "--short-runs",
        type=int,
        help="runs of the short concurrent shape (default 100; 0 skips it)",
    )
    p.add_argument("--short-steps", type=int, help="steps per run of the short shape (default 10)")
    p.add_argument("--latency-runs", type=int, help="sequential 1-step runs (default 300)")
    p.add_argument(
        "--park-runs",
        type=int,
        help="runs parked per repeat (default 5,000; quick 2,000; with fewer the server "
        "heap's growth in steps swamps the figure)",
    )
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
        "--replicas",
        type=int,
        default=1,
        choices=(1, 3, 5),
        metavar="N",
        help="replicas of every stream: 1 (default, one embedded server), 3 or 5 (a loopback "
        "cluster of N nodes, so every node holds a replica and can lead)",
    )
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
        help="run only this section (seq, conc, lat or park); repeat to pick several",
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
    if a.replicas > 1 and a.auth:
        p.error("--auth needs the embedded server: the loopback cluster has no users")
    c = Config(quick=a.quick, replicas=a.replicas)
    if a.quick:
        c.steps, c.runs, c.run_steps, c.latency_runs = 500, 200, 10, 100
        c.park_runs = 2000
    c.steps = a.steps or c.steps
    c.runs = a.runs or c.runs
    c.run_steps = a.run_steps or c.run_steps
    c.latency_runs = a.latency_runs or c.latency_runs
    c.short_runs = c.short_runs if a.short_runs is None else max(0, a.short_runs)
    c.short_steps = a.short_steps or c.short_steps
    c.park_runs = a.park_runs or c.park_runs
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


# --- the server(s) under a setting ------------------------------------------------------------


Pids = Callable[[], list[int]]
"""The nats-server processes of a setting (one, or every node of the cluster) as they are now."""


def cpu_servers(pids: list[int]) -> float:
    """CPU seconds all of these server processes used so far: on a cluster the followers'
    replication work is part of what an append costs."""
    return sum(cpu_server(pid) for pid in pids)


def rss_mean(pids: list[int]) -> float:
    """Mean RSS over these server processes: on a cluster every node holds a full replica, so
    the mean is what one node pays."""
    return sum(rss(pid) for pid in pids) / len(pids) if pids else float("nan")


# --- raw JetStream baseline -----------------------------------------------------------------


class RawBench:
    """CAS appends straight through ``Broker.publish_raw``, nothing else."""

    def __init__(self, broker: Broker, prefix: str, body: bytes, server_pids: Pids) -> None:
        self.b = broker
        self.names = Names(prefix)
        self.body = body
        self.server_pids = server_pids
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
        c0, s0 = cpu_process(), cpu_servers(self.server_pids())
        t0 = time.perf_counter()
        await self._writer(subject, run, n, lat)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_servers(self.server_pids())
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
        c0, s0 = cpu_process(), cpu_servers(self.server_pids())
        t0 = time.perf_counter()
        await asyncio.gather(*(self._writer(s, r, n, lat) for s, r in subs))
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_servers(self.server_pids())
        total = writers * n
        return {
            "rate": total / wall,
            "p50": pct(lat, 50),
            "p99": pct(lat, 99),
            "py_cpu": (c1 - c0) / total,
            "srv_cpu": (s1 - s0) / total,
        }

    async def park_floor(self, n: int, bodies: list[bytes]) -> dict[str, float]:
        """The least a parked run can cost the server: its event messages (``bodies``, the
        encoded decisions a parked sojourn run has stored) on a subject of its own in a stream
        configured like the events stream, and nothing in any other stream."""
        subjects = [self._subject() for _ in range(n)]

        async def one(subject: str, run: str) -> None:
            seq = 0
            for body in bodies:
                ack = await self.b.publish_raw(
                    subject,
                    body,
                    {EXPECTED_LAST_SUBJECT_SEQUENCE: str(seq), MSG_ID: f"{run}:{seq}:park"},
                )
                if "error" in ack:
                    raise RuntimeError(f"raw append failed: {ack['error']}")
                seq = int(ack["seq"])

        m0 = rss_mean(self.server_pids())
        t0 = time.perf_counter()
        await gather_limited([one(s, r) for s, r in subjects], 256)
        wall = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # untimed: let the server's write-behind settle before RSS
        m1 = rss_mean(self.server_pids())
        return {"per_run": (m1 - m0) / n, "rss_before": m0, "rss_after": m1, "wall": wall}


# --- sojourn ----------------------------------------------------------------------------------


def _events(history: list[Decision]) -> list[Any]:
    return [e for d in history for e in d.events]


def _first(events: list[Any], tp: type) -> Any:
    for e in events:
        if isinstance(e, tp):
            return e
    raise LookupError(tp.__name__)


class SojournBench:
    def __init__(self, worker: Worker, client: Client, server_pids: Pids, tag: str) -> None:
        self.w = worker
        self.c = client
        self.server_pids = server_pids
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
        """The ended runs' histories. The activation counter can run ahead of the last append,
        and on a cluster a direct get may be answered by a follower that has not applied it
        yet: read a history again until it ends with ``RunCompleted``."""
        out: list[list[Decision]] = await gather_limited([self.c.history(r) for r in rids], 20)
        for i, (r, h) in enumerate(zip(rids, out, strict=True)):
            deadline = time.perf_counter() + 60
            while not h or not any(isinstance(e, RunCompleted) for e in h[-1].events):
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"the history of {r} has no RunCompleted after 60 s")
                await self.c.result(r, timeout=60)
                await asyncio.sleep(0.01)
                h = out[i] = await self.c.history(r)
        return out

    async def sequential(self, n: int) -> dict[str, float]:
        rid = self._rid("seq")
        base = self.w.activations_completed
        c0, s0 = cpu_process(), cpu_servers(self.server_pids())
        t0 = time.perf_counter()
        await self.c.start("chain", n, run_id=rid)
        await self._wait_activations(base + 1)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_servers(self.server_pids())
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
        c0, s0 = cpu_process(), cpu_servers(self.server_pids())
        w0 = time.time()
        t0 = time.perf_counter()
        await asyncio.gather(*(self.c.start("chain", m, run_id=r) for r in rids))
        await self._wait_activations(base + runs)
        wall = time.perf_counter() - t0
        c1, s1 = cpu_process(), cpu_servers(self.server_pids())
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

    async def park(self, n: int, stream_state: StreamStates) -> dict[str, Any]:
        """Start N runs that park at once on a signal; measure what they leave in the server.

        Returns the RSS growth per parked run, the stored messages per run of each stream
        (``stream_state`` reads them) and one run's stored decisions, for the raw floor.
        """
        rids = [self._rid("park") for _ in range(n)]
        base = self.w.activations_completed
        before = await stream_state()
        m0 = rss_mean(self.server_pids())
        t0 = time.perf_counter()
        await gather_limited([self.c.start("parked", run_id=r) for r in rids], 256)
        await self._wait_activations(base + n, limit=600)
        wall = time.perf_counter() - t0
        sample = random.Random(12).sample(rids, min(20, n))
        states = await gather_limited([self.c.state(r) for r in sample], 10)
        waiting = sum(1 for st in states if st.status == "waiting")
        if waiting < len(sample):
            raise RuntimeError(f"only {waiting} of {len(sample)} sampled runs are waiting")
        await asyncio.sleep(1.0)  # untimed: the last acks and lease/heartbeat writes land
        m1 = rss_mean(self.server_pids())
        after = await stream_state()
        (hist,) = await self._histories_any([sample[0]])
        return {
            "per_run": (m1 - m0) / n,
            "rss_before": m0,
            "rss_after": m1,
            "rate": n / wall,
            "messages_per_run": {
                k: (after[k]["messages"] - before[k]["messages"]) / n for k in after
            },
            "bytes_per_run": {k: (after[k]["bytes"] - before[k]["bytes"]) / n for k in after},
            "bodies": [encode_events(d.events) for d in hist],
        }

    async def _histories_any(self, rids: list[str]) -> list[list[Decision]]:
        """Histories of runs that have not ended (``_histories`` waits for their end)."""
        out: list[list[Decision]] = await gather_limited([self.c.history(r) for r in rids], 20)
        return out


PHASES = (
    "client publish -> intake received trigger",
    "RunStarted stamped -> StepStarted stamped",
    "StepStarted stamped -> StepCompleted stamped",
    "StepCompleted -> RunCompleted stamped",
    "RunCompleted stamped -> seen by a subscriber",
    "seen by a subscriber -> client.result returned",
)


# --- one server / durability setting ----------------------------------------------------------


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


@dataclass
class Target:
    """The server(s) one setting measures: where every connection goes (``url(user)``), whose
    CPU and memory count, and on a cluster the cluster itself (to place leaders)."""

    url: Callable[[str], str]
    pids: Pids
    cluster: LocalCluster | None = None
    node: str = "n1"
    """The node every connection goes to, and where the leaders are moved (cluster only)."""


@contextlib.asynccontextmanager
async def serve(
    cfg: Config, sync_interval: str, auth: bool, tmp: str, tag: str, prefix: str
) -> AsyncIterator[Target]:
    """One embedded server, or with ``--replicas`` > 1 a loopback cluster, for one setting."""
    if cfg.replicas == 1:
        srv = EmbeddedServer(
            store_dir=tmp,
            port=0,
            sync_interval=sync_interval,
            auth=bench_users(tag) if auth else None,
            auth_prefix=prefix,
        )

        def url(user: str) -> str:
            return srv.url_for(user) if auth else srv.url

        async with srv:
            yield Target(url, lambda: [srv.pid] if srv.pid is not None else [])
        return
    cluster = LocalCluster(Path(tmp), size=cfg.replicas, sync_interval=sync_interval)
    try:
        await cluster.start()
        first = cluster.nodes[0]
        # Healthy is "a meta leader is elected"; on a loaded machine the first stream request
        # can still time out behind it. Wait until one (which the meta leader answers) does.
        probe = await Broker.connect(first.url, name="bench-probe")
        try:
            await _retrying(partial(probe.api, "$JS.API.STREAM.NAMES", {}))
        finally:
            await probe.close()
        yield Target(
            lambda _user: first.url,
            lambda: [n.proc.pid for n in cluster.nodes if n.proc is not None and n.running],
            cluster,
            first.name,
        )
    finally:
        cluster.stop()


async def _retrying(what: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """A JetStream API call that may meet an election in progress: retry for up to 30 s."""
    deadline = time.perf_counter() + 30
    while True:
        try:
            return await what()
        except BROKER_ERRORS:
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(0.1)


async def place_leaders(b: Broker, target: Target, prefixes: list[str]) -> dict[str, str]:
    """Move the leader of every stream and consumer of these prefixes to ``target.node``.

    An R3 append goes from the client's node to the stream's leader, which acknowledges once a
    follower has stored it too; where the leader sits relative to the connection decides
    whether there is one more route hop. Placing every leader on the node every connection
    uses makes the raw and the sojourn figures pay the same path. Returns where each stream's
    leader is afterwards (for the report).
    """
    if target.cluster is None:
        return {}
    stems = tuple(f"{p.upper()}_" for p in prefixes)
    listed = await _retrying(partial(b.api, "$JS.API.STREAM.NAMES", {}))
    streams = sorted(x for x in listed.get("streams") or [] if x.startswith(stems))
    node = target.node

    async def leader(api: str) -> str:
        info = await _retrying(partial(b.api, api))
        return str((info.get("cluster") or {}).get("leader") or "")

    async def move(info_api: str, stepdown_api: str) -> str:
        deadline = time.perf_counter() + 30
        while (now := await leader(info_api)) != node:
            if time.perf_counter() > deadline:
                return now  # reported as it is, not hidden
            with contextlib.suppress(*BROKER_ERRORS):
                await b.api(stepdown_api, {"placement": {"preferred": node}})
            await asyncio.sleep(0.2)
        return now

    placed: dict[str, str] = {}
    for stream in streams:
        placed[stream] = await move(
            f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
        )
        names = await _retrying(partial(b.api, f"$JS.API.CONSUMER.NAMES.{stream}", {}))
        for consumer in names.get("consumers") or []:
            placed[f"{stream} > {consumer}"] = await move(
                f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
                f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}",
            )
    return placed


async def bench_setting(
    cfg: Config, sync_interval: str, log: Callable[[str], None], auth: bool = False
) -> dict[str, Any]:
    parent = cfg.store_dir or None
    label = sync_interval + (", auth" if auth else "")
    if cfg.replicas > 1:
        label = f"R{cfg.replicas}, {label}"
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="sojourn-bench-", dir=parent) as tmp:
        settings = Settings(prefix=f"bench{tag}", replicas=cfg.replicas)
        async with serve(cfg, sync_interval, auth, tmp, tag, settings.prefix) as target:
            url = target.url
            body = _sample_decision(RESULT)
            raw_broker = await Broker.connect(url("rawworker"), name="bench-raw")
            raw_client = await Broker.connect(url("rawclient"), name="bench-raw-client")
            service = await Broker.connect(url("rawadmin"), name="bench-raw-svc") if auth else None
            raw = RawBench(raw_broker, f"raw{tag}", body, target.pids)
            await raw.setup(settings)
            worker = Worker([chain, single, parked], nats=url("worker"), settings=settings)
            await worker.start()
            client = await Client.connect(url("client"), settings=settings)
            # Watches the runs' event subjects: a client may; a worker-role user may not.
            observer = await Broker.connect(url("client"), name="bench-observer") if auth else None
            watcher = observer or raw_broker
            soj = SojournBench(worker, client, target.pids, tag)

            out: dict[str, Any] = {
                "sync_interval": sync_interval,
                "auth": auth,
                "replicas": cfg.replicas,
                "body_bytes": len(body),
                "reps": [],
                "load_before": loadavg(),
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
                bodies: list[bytes] = []
                if "park" in sec:  # what a parked run stores, for the raw floor to copy
                    bodies = (await park_fresh(cfg, sync_interval, "soj", [], 20))["bodies"]
                if target.cluster is not None:
                    log(f"[{label}] moving every leader to {target.node}")
                    out["placement"] = await place_leaders(
                        raw_broker, target, [settings.prefix, raw.names.prefix]
                    )
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
                        if cfg.short_runs:
                            step(f"raw concurrent, {cfg.short_runs} x {cfg.short_steps}")
                            r["raw_short"] = await raw.concurrent(cfg.short_runs, cfg.short_steps)
                            step(f"sojourn concurrent, {cfg.short_runs} x {cfg.short_steps}")
                            r["soj_short"] = await soj.concurrent(cfg.short_runs, cfg.short_steps)
                    if "lat" in sec:
                        step("1-step latency")
                        r["lat"] = await soj.latency(cfg.latency_runs, watcher, cfg.latency_gap)
                        step("raw 1-step floor")
                        r["floor"] = await raw.one_step_floor(
                            raw_client, settings, cfg.latency_runs, cfg.latency_gap, service
                        )
                    if "park" in sec:
                        # Each side on a fresh server: one that served the other sections has
                        # free heap to spare, and parked runs would fill it without growing.
                        # Alternate which side goes first (the machine's state drifts).
                        for side in ("raw", "soj") if rep % 2 == 0 else ("soj", "raw"):
                            step(f"{side} parked, {cfg.park_runs} runs, on a fresh server")
                            got = await park_fresh(cfg, sync_interval, side, bodies)
                            got.pop("bodies", None)
                            r[f"{side}_park"] = got
                    out["reps"].append(r)
                if cfg.trace and "seq" in cfg.sections and "lat" in cfg.sections:
                    log(f"[{label}] trace (untimed)")
                    out["trace"] = await trace_pass(
                        url("traceworker"),
                        url("traceclient"),
                        cfg,
                        f"trace{tag}",
                        lambda b, p: place_leaders(b, target, [p]),
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
    out["load_after"] = loadavg()
    out["summary"] = summarize_setting(out["reps"])
    return out


async def park_fresh(
    cfg: Config, sync_interval: str, side: str, bodies: list[bytes], n: int = 0
) -> dict[str, Any]:
    """Park ``n`` (default ``cfg.park_runs``) runs (``side`` "soj") or write their raw floor
    (``side`` "raw") on a server (or cluster) of their own, after a warm-up of 100: the RSS
    growth per run is then what parked runs cost, not how much free heap earlier sections
    left behind. Without authentication: what a run stores does not depend on it."""
    n = n or cfg.park_runs
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="sojourn-bench-park-", dir=cfg.store_dir) as tmp:
        settings = Settings(prefix=f"park{tag}", replicas=cfg.replicas)
        async with serve(cfg, sync_interval, False, tmp, tag, settings.prefix) as target:
            broker = await Broker.connect(target.url("admin"), name="bench-park")
            try:
                if side == "raw":
                    raw = RawBench(broker, f"raw{tag}", bodies[0], target.pids)
                    await raw.setup(settings)
                    await raw.park_floor(100, bodies)
                    await place_leaders(broker, target, [raw.names.prefix])
                    return await raw.park_floor(n, bodies)
                worker = Worker([parked], nats=target.url("worker"), settings=settings)
                await worker.start()
                client = await Client.connect(target.url("client"), settings=settings)
                try:
                    soj = SojournBench(worker, client, target.pids, tag)
                    stream_state = stream_reader(broker, client.names)
                    await soj.park(100, stream_state)
                    await place_leaders(broker, target, [settings.prefix])
                    return await soj.park(n, stream_state)
                finally:
                    await client.close()
                    await worker.stop()
            finally:
                await broker.close()


StreamStates = Callable[[], Awaitable[dict[str, dict[str, int]]]]


def stream_reader(b: Broker, names: Names) -> StreamStates:
    """Reads the stored messages and bytes of the streams a parked run may leave entries in."""
    watched = {
        "events": names.events_stream,
        "inbox": names.inbox_stream,
        "wake": names.wake_stream,
        "leases": names.leases_stream,
    }

    async def read() -> dict[str, dict[str, int]]:
        return {k: await _stream_state(b, v) for k, v in watched.items()}

    return read


async def _stream_state(b: Broker, stream: str) -> dict[str, int]:
    try:
        info = await b.api(f"$JS.API.STREAM.INFO.{stream}")
    except BROKER_ERRORS:
        return {"messages": 0, "bytes": 0}  # not created (yet) by this runtime
    st = info.get("state", {})
    return {"messages": int(st.get("messages", 0)), "bytes": int(st.get("bytes", 0))}


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
    if "soj_short" in have:
        for key in ("rate", "p50", "p99"):
            s[f"raw_short_{key}"] = _med(reps, "raw_short", key)
        for key in ("rate", "steady_rate", "last_started", "run_p50", "appends_per_step"):
            s[f"soj_short_{key}"] = _med(reps, "soj_short", key)
        _paired(s, "short_ratio", [r["soj_short"]["rate"] / r["raw_short"]["rate"] for r in reps])
    if "lat" in have:
        for view in ("e2e", "server", "observed"):
            for key in ("p50", "p90", "p99"):
                s[f"lat_{view}_{key}"] = _med(reps, "lat", view, key)
        for view in ("inbox", "direct"):
            for key in ("p50", "p90", "p99"):
                s[f"floor_{view}_{key}"] = _med(reps, "floor", view, key)
        s["phases"] = {p: _med(reps, "lat", "phases", p) for p in PHASES}
        _paired(
            s,
            "floor_ratio",
            [r["lat"]["observed"]["p50"] / r["floor"]["inbox"]["p50"] for r in reps],
        )
    if "soj_park" in have:
        for key in ("per_run", "rss_before", "rss_after"):
            s[f"raw_park_{key}"] = _med(reps, "raw_park", key)
        for key in ("per_run", "rss_before", "rss_after", "rate"):
            s[f"soj_park_{key}"] = _med(reps, "soj_park", key)
        s["soj_park_per_run_all"] = [r["soj_park"]["per_run"] for r in reps]
        s["raw_park_per_run_all"] = [r["raw_park"]["per_run"] for r in reps]
        for what in ("messages_per_run", "bytes_per_run"):
            s[f"soj_park_{what}"] = {
                k: _med(reps, "soj_park", what, k) for k in reps[0]["soj_park"][what]
            }
    return s


def _paired(s: dict[str, Any], key: str, ratios: list[float]) -> None:
    """A ratio taken per repeat (raw and sojourn measured back to back): median, min, max."""
    s[key] = median(ratios)
    s[f"{key}_min"], s[f"{key}_max"] = min(ratios), max(ratios)


# --- untimed diagnostics ----------------------------------------------------------------------


async def trace_pass(
    worker_url: str,
    client_url: str,
    cfg: Config,
    prefix: str | None = None,
    place: Callable[[Broker, str], Awaitable[dict[str, str]]] | None = None,
) -> dict[str, Any]:
    """Count and time the worker's broker operations for a sequential run and a 1-step run.

    ``place`` (on a cluster) moves this prefix's leaders where the timed measurements had
    theirs, after the warm-up created the streams."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(prefix=prefix or f"trace{tag}", replicas=cfg.replicas)
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
        if place is not None:
            await place(wb, settings.prefix)
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
        f"short shape {cfg.short_runs} runs x {cfg.short_steps} steps; {cfg.park_runs} parked "
        f"runs per repeat; {cfg.repeats} repeats, median of the per-repeat figures; replicas "
        f"{cfg.replicas}; sections: {', '.join(cfg.sections)}."
    )
    for res in results:
        s = res["summary"]
        si = res["sync_interval"]
        raw_p50, raw_mean = s["raw_seq_p50"], s["raw_seq_mean"]
        add("")
        if res.get("replicas", 1) > 1:
            add(f"## R{res['replicas']} on a loopback cluster, sync_interval: {si}")
            add("")
            add(
                "Every connection on node n1; every stream's and consumer's leader moved to n1 "
                "before the timed repeats (raw and sojourn alike)."
            )
        elif res.get("auth"):
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
            if "short_ratio" in s:
                add(
                    f"| {cfg.short_runs} concurrent runs x {cfg.short_steps} steps: aggregate "
                    f"| {cfg.short_runs} subjects x {cfg.short_steps} appends: "
                    f"{fmt_rate(s['raw_short_rate'], 'appends')} "
                    f"| {fmt_rate(s['soj_short_rate'], 'steps')} (trigger -> last completion) "
                    f"| {s['short_ratio']:.2f}x (paired per repeat; "
                    f"{s['short_ratio_min']:.2f}x - {s['short_ratio_max']:.2f}x) "
                    f"| >= {TARGET_SHORT_CONC_RATIO}x "
                    f"| {_verdict(s['short_ratio'] >= TARGET_SHORT_CONC_RATIO)} |"
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
            add(
                f"| 1-step run against its floor: publish -> RunCompleted seen, p50 / inbox floor "
                f"p50 | inbox floor p50 {fmt_ms(s['floor_inbox_p50'])} "
                f"| {fmt_ms(s['lat_observed_p50'])} "
                f"| {s['floor_ratio']:.2f}x (paired per repeat; {s['floor_ratio_min']:.2f}x - "
                f"{s['floor_ratio_max']:.2f}x) | <= {TARGET_ONE_STEP_FLOOR_RATIO}x "
                f"| {_verdict(s['floor_ratio'] <= TARGET_ONE_STEP_FLOOR_RATIO)} |"
            )
        if "park" in has:
            per = s["soj_park_per_run"]
            add(
                f"| nats-server RSS per parked run ({cfg.park_runs} runs waiting on a signal"
                f"{', mean of the nodes' if res.get('replicas', 1) > 1 else ''}) "
                f"| the same event messages on {cfg.park_runs} subjects, nothing else: "
                f"{s['raw_park_per_run']:,.0f} B "
                f"| {per:,.0f} B | {per / s['raw_park_per_run']:.2f}x "
                f"| <= {TARGET_PARKED_BYTES:,} B | {_verdict(per <= TARGET_PARKED_BYTES)} |"
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
        if "park" in has:
            add(
                "| parked: RSS per run, each repeat, sojourn; raw floor | "
                + ", ".join(f"{x:,.0f}" for x in s["soj_park_per_run_all"])
                + " B; "
                + ", ".join(f"{x:,.0f}" for x in s["raw_park_per_run_all"])
                + " B |"
            )
            add(
                f"| parked: nats-server RSS (node mean) before / after a burst, median: sojourn "
                f"| {s['soj_park_rss_before'] / 2**20:.1f} MiB -> "
                f"{s['soj_park_rss_after'] / 2**20:.1f} MiB ({fmt_rate(s['soj_park_rate'], 'runs')}"
                f" parked) |"
            )
            msgs = s["soj_park_messages_per_run"]
            byts = s["soj_park_bytes_per_run"]
            add(
                "| parked: stored messages (bytes) per run, by stream | "
                + "; ".join(f"{k} {msgs[k]:.2f} ({byts[k]:,.0f} B)" for k in msgs)
                + " |"
            )
        placement = res.get("placement")
        if placement:
            off = {k: v for k, v in placement.items() if v != "n1"}
            add(
                f"| leaders placed on n1 | {len(placement) - len(off)} of {len(placement)} "
                f"streams and consumers"
                + (
                    f"; elsewhere: {', '.join(f'{k} on {v}' for k, v in off.items())}"
                    if off
                    else ""
                )
                + " |"
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
    facts = run_facts(cfg.store_dir)
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
