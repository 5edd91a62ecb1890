"""``python -m bench.cpu_bound``: how the concurrent raw floor falls as each append costs the
appending process more CPU, beside sojourn's own concurrent figure and CPU per step.

``bench.foundation``'s concurrent figure compares sojourn's 100 runs x 10 steps with 100 raw
writers of 10 compare-and-set appends each. Both sides wait on the same server (``sync_interval:
always``): the raw floor is the server's. This bench asks what sojourn's Python costs that
figure: the raw writers are run again with ``--burn`` microseconds of busy CPU after each
append's ack (what a step's bookkeeping costs sojourn), each round interleaved with sojourn's
100 x 10 in the same process on the same server, and every figure paired to the plain raw
floor of its round. Python CPU per append (or step) is the process's CPU over the round,
divided by the appends (steps) made.

Nothing here asserts: it prints one line per burn level and one for sojourn (medians over
``--rounds``), so the reader can place sojourn's CPU per step on the raw curve.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from typing import Any

from bench.foundation import RawBench, SojournBench, _sample_decision, chain, single
from bench.util import cpu_process, median, run_bench, run_facts
from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import Broker
from sojourn.broker.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, MSG_ID
from sojourn.schemas.config import Settings

BURNS_US = (0, 60, 120, 180, 240, 360)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class BurningRaw(RawBench):
    """``RawBench``'s writers, with ``burn`` seconds of busy CPU after each append's ack."""

    burn = 0.0

    async def _writer(self, subject: str, run: str, n: int, lat: list[float]) -> None:
        seq = 0
        for _ in range(n):
            headers = {EXPECTED_LAST_SUBJECT_SEQUENCE: str(seq), MSG_ID: f"{run}:{seq}:burn"}
            ack = await self.b.publish_raw(subject, self.body, headers)
            if "error" in ack:
                raise RuntimeError(f"raw append failed: {ack['error']}")
            if self.burn:
                _burn(self.burn)
            seq = int(ack["seq"])


async def measure(rounds: int, runs: int, steps: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    out: dict[str, Any] = {"facts": run_facts(None), "runs": runs, "steps": steps}
    with tempfile.TemporaryDirectory(prefix="sojourn-cpu-bound-") as tmp:
        settings = Settings(prefix=f"cpub{tag}")
        async with EmbeddedServer(store_dir=tmp, port=0, sync_interval="always") as srv:
            raw_broker = await Broker.connect(srv.url, name="cpu-bound-raw")
            raw = BurningRaw(raw_broker, f"rawb{tag}", _sample_decision("x"), lambda: [srv.pid])
            await raw.setup(settings)
            worker = await Worker([chain, single], nats=srv.url, settings=settings).start()
            client = await Client.connect(srv.url, settings=settings)
            soj = SojournBench(worker, client, lambda: [srv.pid], tag)
            rows: dict[str, list[tuple[float, float]]] = {}
            try:
                await raw.concurrent(50, 5)  # warm up
                await soj.concurrent(50, 5)
                for _ in range(rounds):
                    floor = 0.0
                    for burn in BURNS_US:
                        raw.burn = burn / 1e6
                        c0 = cpu_process()
                        r = await raw.concurrent(runs, steps)
                        cpu = (cpu_process() - c0) / (runs * steps)
                        floor = floor or r["rate"]
                        rows.setdefault(f"raw, burn {burn} µs", []).append((r["rate"] / floor, cpu))
                    s = await soj.concurrent(runs, steps)
                    rows.setdefault("sojourn", []).append((s["rate"] / floor, s["py_cpu"]))
            finally:
                await client.close()
                await worker.stop()
                await raw_broker.close()
    out["rows"] = {
        k: {"ratio": median([a for a, _ in v]), "py_cpu": median([b for _, b in v])}
        for k, v in rows.items()
    }
    return out


def render(out: dict[str, Any]) -> str:
    lines = [
        f"# {out['runs']} writers (runs) x {out['steps']} appends (steps), one server, "
        "sync_interval always",
        "",
        "| | Python CPU per append (step) | throughput / plain raw floor |",
        "|---|---|---|",
    ]
    for k, v in out["rows"].items():
        lines.append(f"| {k} | {v['py_cpu'] * 1e6:.0f} µs | {v['ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_bound", description=__doc__)
    p.add_argument("--rounds", type=int, default=20, help="rounds, each level once (default 20)")
    p.add_argument("--runs", type=int, default=100, help="writers and runs (default 100)")
    p.add_argument("--steps", type=int, default=10, help="appends and steps each (default 10)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)

    async def go() -> dict[str, Any]:
        out = await measure(a.rounds, a.runs, a.steps)
        print(render(out))
        return out

    run_bench(go(), a.json)


if __name__ == "__main__":
    main()
