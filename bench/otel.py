"""What tracing costs a step: ``bench.foundation``'s sequential run and concurrent runs with
OpenTelemetry off (nothing imports it) and on (the SDK, a ``BatchSpanProcessor`` and the real
OTLP/HTTP exporter, sending every span to a local sink that answers 200).

Run from the repository root::

    python -m bench.otel               # ~1 min: 3 pairs, 2,000-step run, 100 runs x 10 steps
    python -m bench.otel --quick       # ~20 s

Each measurement runs in a fresh process of its own (a process cannot take its tracer provider
back), off and on alternating, each with its own embedded nats-server; the table shows the
medians and the ratio on/off per pair. Nothing here asserts: it prints (docs/benchmarks.md,
"Tracing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.foundation import SojournBench, chain
from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings


class _Sink(BaseHTTPRequestHandler):
    """Takes an OTLP/HTTP export and answers 200, counting spans' bytes."""

    received = 0

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(size)
        type(self).received += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def measure(mode: str, steps: int, runs: int, run_steps: int) -> dict[str, float]:
    if mode == "on":
        from sojourn.actors import telemetry

        assert telemetry.configure("bench"), "the otel extra is needed: pip install 'sojourn[otel]'"
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(store_dir=tmp, port=0)
        async with server:
            settings = Settings(prefix=f"b{uuid.uuid4().hex[:8]}")
            worker = Worker([chain], nats=server.url, settings=settings)
            await worker.start()
            client = await Client.connect(server.url, settings=settings)
            try:
                pids = lambda: [server.pid] if server.pid is not None else []  # noqa: E731
                bench = SojournBench(worker, client, pids, mode)
                await bench.sequential(50)  # warm up
                seq = await bench.sequential(steps)
                conc = await bench.concurrent(runs, run_steps)
            finally:
                await client.close()
                await worker.stop()
    loaded = any(m.split(".")[0] == "opentelemetry" for m in sys.modules)
    assert loaded == (mode == "on"), f"opentelemetry loaded: {loaded} (tracing {mode})"
    return {
        "per_step_ms": seq["per_step"] * 1e3,
        "py_cpu_ms": seq["py_cpu"] * 1e3,
        "conc_rate": conc["rate"],
        "conc_py_cpu_ms": conc["py_cpu"] * 1e3,
    }


def child(args: argparse.Namespace) -> None:
    out = asyncio.run(measure(args.child, args.steps, args.runs, args.run_steps))
    if args.child == "on":
        from opentelemetry import trace

        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.otel", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="~20 s: 2 pairs, a 500-step run")
    p.add_argument("--pairs", type=int, default=3, help="off/on pairs (default 3)")
    p.add_argument("--steps", type=int, default=2000, help="steps of the sequential run")
    p.add_argument("--runs", type=int, default=100, help="concurrent runs (default 100)")
    p.add_argument("--run-steps", type=int, default=10, help="steps per concurrent run")
    p.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    if args.quick:
        args.pairs, args.steps = 2, 500
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
        "OTEL_SERVICE_NAME": "bench",
    }
    figures: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for _ in range(args.pairs):
        for mode in ("off", "on"):
            cmd = [sys.executable, "-m", "bench.otel", "--child", mode]
            cmd += ["--steps", str(args.steps), "--runs", str(args.runs)]
            cmd += ["--run-steps", str(args.run_steps)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(done.stderr)
            figures[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    sink.shutdown()
    rows = [
        ("sequential run: per step (ms)", "per_step_ms"),
        ("sequential run: worker CPU per step (ms)", "py_cpu_ms"),
        (f"{args.runs} runs x {args.run_steps} steps: steps/s", "conc_rate"),
        (f"{args.runs} runs x {args.run_steps} steps: worker CPU per step (ms)", "conc_py_cpu_ms"),
    ]
    print(f"tracing off vs on (OTLP/HTTP to a local sink), {args.pairs} pairs, medians")
    print(f"{'':58} {'off':>9} {'on':>9} {'on/off':>7}")
    for label, key in rows:
        off = statistics.median(f[key] for f in figures["off"])
        on = statistics.median(f[key] for f in figures["on"])
        ratios = [b[key] / a[key] for a, b in zip(figures["off"], figures["on"], strict=True)]
        print(f"{label:58} {off:9.3f} {on:9.3f} {statistics.median(ratios):7.2f}")
    print(f"exported: {_Sink.received / 1e6:.1f} MB of OTLP protobuf")


if __name__ == "__main__":
    main()
