"""A 1-step run's worker path: CPU from a start's arrival to its appends, against the floor.

Run from the repository root::

    python -m bench.worker_path                 # ~1 min: 3 repeats of each side, 400 runs each
    python -m bench.worker_path --repeats 6 --runs 600

Each side runs in a process of its own on a fresh embedded nats-server, its triggers sent by a
second process (so the sender's work is not on the measured event loop), one at a time,
``--gap`` seconds apart (untimed):

- ``sojourn``: a worker serving a 1-step agent whose step is async, as ``bench.foundation``'s
  (a sync step runs in a thread); the sender calls ``Client.start`` and ``Client.result``.
- ``raw``: what ``bench.foundation`` times as its inbox floor, with no sojourn code in between:
  a pull consumer on sojourn's inbox (``Broker.pull``, 64 at a time), two CAS appends through
  ``Broker.publish_raw``, the ack; the sender publishes the trigger and waits for the second
  append.

Hooks on the measuring process's connections stamp, for each run, the trigger's arrival, each
write of an append and each message received, with the wall clock and the thread's CPU time.
Figures, medians over the runs of a process: **trigger -> first write** (thread CPU and wall:
from the trigger's arrival to the first append's bytes handed to the socket), **ack -> second
write** (wall: from the last message received before the second append to its write) and
**trigger -> second write** (wall: the whole of it, the server's answer to the first append
included, which the other work on these two cores delays). The
sides alternate, ``--repeats`` times each; the table shows each process's figure and the median
of them. The hooks are nats-py's transport and message dispatch (hence this module's nats-py
import): the only places that see a write leave and a message arrive.

A probe of where a lone start's time goes (docs/benchmarks.md, "a 1-step run's worker CPU"), not a
test: it asserts nothing and prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.aio import client as nats_client
from nats.aio import transport as nats_transport

from sojourn.actors import Context, Worker, agent
from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, MSG_ID
from sojourn.schemas.config import Settings

from .util import ROOT, git_state, run_bench

PREFIX = "wpath"
WARMUP = 20
"""Runs left out of the figures at the start of each process."""

_PUB = re.compile(rb"(?:^|\r\n)H?PUB ([^ \r\n]*)")


class Stamps:
    """What the hooks saw: ``(wall, kind, subject, thread cpu)``, kind ``W`` (a publish
    written) or ``R`` (a message received)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, str, float]] = []

    def install(self) -> None:
        rows = self.rows
        writelines = nats_transport.TcpTransport.writelines
        process_msg = nats_client.Client._process_msg

        def hooked_writelines(transport: Any, payload: list[bytes]) -> Any:
            now, cpu = time.perf_counter(), time.thread_time()
            for subject in _PUB.findall(b"".join(payload)):
                rows.append((now, "W", subject.decode(), cpu))
            return writelines(transport, payload)

        async def hooked_process_msg(nc: Any, sid: int, subject: bytes, *rest: Any) -> Any:
            rows.append((time.perf_counter(), "R", subject.decode(), time.thread_time()))
            return await process_msg(nc, sid, subject, *rest)

        nats_transport.TcpTransport.writelines = hooked_writelines  # type: ignore[method-assign]
        nats_client.Client._process_msg = hooked_process_msg  # type: ignore[method-assign]

    def per_run(self, trigger_subject: str, events_subject: str) -> dict[str, float] | None:
        """The figures of one run, or ``None`` when its stamps are incomplete."""
        rows = self.rows
        arrived = next((r for r in rows if r[1] == "R" and r[2] == trigger_subject), None)
        writes = [r for r in rows if r[1] == "W" and r[2] == events_subject]
        if arrived is None or len(writes) < 2:
            return None
        between = [r for r in rows if r[1] == "R" and writes[0][0] < r[0] < writes[1][0]]
        if not between:
            return None
        return {
            "first_cpu": writes[0][3] - arrived[3],
            "first_wall": writes[0][0] - arrived[0],
            "second_wall": writes[1][0] - between[-1][0],
            "both_wall": writes[1][0] - arrived[0],
        }


async def _step() -> int:
    """The step, async like ``bench.foundation``'s (a sync step runs in a thread)."""
    return 1


@agent("single")
async def single(ctx: Context) -> int:
    return await ctx.step(_step)


_SENDER = r"""
import asyncio, sys, time
from sojourn.actors import Client
from sojourn.broker import Broker
from sojourn.broker.headers import MSG_ID
from sojourn.schemas.config import Settings

async def main(side, url, runs, gap):
    if side == "sojourn":
        client = await Client.connect(url, settings=Settings(prefix=sys.argv[5]))
        for i in range(runs):
            await asyncio.sleep(gap)
            await client.start("single", run_id=f"r{i}")
            await client.result(f"r{i}", timeout=30)
        await client.close()
        return
    b = await Broker.connect(url, name="sender")
    seen = {}
    async def on(msg):
        count = seen.get(msg.subject, 0) + 1
        seen[msg.subject] = count
        waiter = waiting.get(msg.subject)
        if count == 2 and waiter is not None and not waiter.done():
            waiter.set_result(None)
    waiting = {}
    await b.subscribe(sys.argv[6], cb=on)
    await b.flush()
    loop = asyncio.get_running_loop()
    for i in range(runs):
        await asyncio.sleep(gap)
        run = f"r{i}"
        waiting[sys.argv[7] + run] = loop.create_future()
        await b.publish_raw(sys.argv[8] + run, run.encode(), {MSG_ID: f"start:floor:{run}"})
        await asyncio.wait_for(waiting[sys.argv[7] + run], 30)
    await b.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


async def measure(side: str, runs: int, gap: float) -> dict[str, Any]:
    """One side's figures, in this process (the child of ``main``)."""
    stamps = Stamps()
    stamps.install()
    settings = Settings(prefix=PREFIX)
    with tempfile.TemporaryDirectory() as store:
        server = EmbeddedServer(store_dir=store)
        await server.start()
        worker = Worker([single], nats=server.url, settings=settings)
        names = worker.names
        floor: asyncio.Task[None] | None = None
        broker: Broker | None = None
        try:
            await worker.start()
            if side == "raw":  # the streams and consumers made, nothing of sojourn's running
                await worker.stop()
                broker = await Broker.connect(server.url, name="raw-worker")
                floor = asyncio.create_task(_raw_intake(broker, names))
            start_of = names.start("single" if side == "sojourn" else "floor", None, "")
            sender = [
                sys.executable,
                "-c",
                _SENDER,
                side,
                server.url,
                str(runs),
                str(gap),
                PREFIX,
                names.events_all,
                names.events(""),
                start_of,
            ]
            proc = await asyncio.create_subprocess_exec(*sender, cwd=ROOT)
            if await proc.wait() != 0:
                raise RuntimeError(f"the {side} sender failed")
        finally:
            if floor is not None:
                floor.cancel()
            if broker is not None:
                await broker.close()
            if side == "sojourn":
                await worker.stop()
            await server.stop()
    figures = [
        f
        for i in range(WARMUP, runs)
        if (f := stamps.per_run(f"{start_of}r{i}", names.events(f"r{i}"))) is not None
    ]
    return {
        key: statistics.median(f[key] for f in figures)
        for key in ("first_cpu", "first_wall", "second_wall", "both_wall")
    } | {"runs": len(figures)}


async def _raw_intake(b: Broker, names: Any) -> None:
    """The raw floor's worker: fetch, two CAS appends, ack."""
    pull = await b.pull(names.inbox_stream, names.intake_consumer)
    body = b'{"seq":1,"events":[{"type":"x"}]}' * 8
    while True:
        for m in await pull.fetch(batch=64, timeout=1.0):
            run = m.data.decode()
            subject = names.events(run)
            first = await b.publish_raw(
                subject, body, {EXPECTED_LAST_SUBJECT_SEQUENCE: "0", MSG_ID: f"{run}:0:w"}
            )
            seq = str(first["seq"])
            await b.publish_raw(
                subject, body, {EXPECTED_LAST_SUBJECT_SEQUENCE: seq, MSG_ID: f"{run}:{seq}:w"}
            )
            await m.ack()


async def _child(args: argparse.Namespace) -> None:
    print(json.dumps(await measure(args.side, args.runs, args.gap)))


def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {"sojourn": [], "raw": []}
    for rep in range(args.repeats):
        for side in ("sojourn", "raw"):
            print(f"# {time.strftime('%H:%M:%S')} repeat {rep + 1}/{args.repeats}: {side}")
            out = subprocess.run(
                [
                    *(sys.executable, "-m", "bench.worker_path", "--side", side),
                    *("--runs", str(args.runs), "--gap", str(args.gap)),
                ],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nsojourn {git_state(ROOT)}: {args.runs} runs a process, {args.gap * 1e3:g} ms apart\n")
    print("| side | trigger -> first write, thread CPU | trigger -> first write, wall "
          "| ack -> second write, wall | trigger -> second write, wall |")  # fmt: skip
    print("|---|---|---|---|---|")
    for side, reps in results.items():
        cells = []
        for key in ("first_cpu", "first_wall", "second_wall", "both_wall"):
            each = ", ".join(f"{r[key] * 1e3:.3f}" for r in reps)
            cells.append(f"{statistics.median(r[key] for r in reps) * 1e3:.3f} ms ({each})")
        print(f"| {side} | " + " | ".join(cells) + " |")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs a process (default 400)")
    parser.add_argument("--gap", type=float, default=0.005, help="untimed pause between runs (s)")
    parser.add_argument("--repeats", type=int, default=3, help="processes of each side")
    parser.add_argument("--side", choices=("sojourn", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None)
    ns = parser.parse_args()
    if ns.side is None:
        out = main(ns)
        if ns.json:
            Path(ns.json).write_text(json.dumps(out, indent=1))
    else:
        run_bench(_child(ns), None)
