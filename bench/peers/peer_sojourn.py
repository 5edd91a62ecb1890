"""The sojourn and raw NATS columns, through bench/foundation.py's own code.

Throughput (one ``EmbeddedServer``, ``sync_interval: always``, worker in this process, as in
foundation.py): ``SojournBench.sequential`` / ``.concurrent`` / ``.latency`` and
``RawBench.sequential`` / ``.concurrent`` / ``.one_step_floor``, with the agents of
``sojourn_agents`` (foundation's names, the peers' step). Kills: worker processes
(``tests.apps.run_worker``) on a second embedded server, two at a time (one is the standby).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import foundation as fd
from sojourn.actors import Client, Worker
from sojourn.broker import Broker, EmbeddedServer
from sojourn.schemas.config import Settings

from . import sojourn_agents as agents
from .common import Config, KillRound, Marks, Proc, child_env, kill_rounds, py

APP = "bench.peers.sojourn_agents"


async def throughput(
    cfg: Config, log: Callable[[str], None], want_soj: bool, want_raw: bool
) -> dict[str, dict[str, float]]:
    tag = uuid.uuid4().hex[:8]
    soj_reps: list[dict[str, float]] = []
    raw_reps: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-nats-") as tmp:
        settings = Settings(prefix=f"peers{tag}")
        async with EmbeddedServer(store_dir=tmp, port=0, sync_interval="always") as srv:
            pids = lambda: [srv.pid] if srv.pid is not None else []  # noqa: E731
            broker = await Broker.connect(srv.url, name="peers-raw")
            client_b = await Broker.connect(srv.url, name="peers-raw-client")
            raw = fd.RawBench(broker, f"raw{tag}", fd._sample_decision("1"), pids)
            await raw.setup(settings)
            worker = Worker([agents.chain, agents.single], nats=srv.url, settings=settings)
            await worker.start()
            client = await Client.connect(srv.url, settings=settings)
            soj = fd.SojournBench(worker, client, pids, tag)
            try:
                log("sojourn/raw: warm-up")
                await raw.sequential(200)
                await soj.sequential(200)
                await soj.concurrent(50, 5)
                await soj.latency(20, broker, cfg.latency_gap)
                for rep in range(cfg.repeats):
                    log(f"sojourn/raw: repeat {rep + 1}/{cfg.repeats}")
                    if want_raw:
                        seq = await raw.sequential(cfg.steps)
                        conc = await raw.concurrent(cfg.runs, cfg.run_steps)
                        floor = await raw.one_step_floor(
                            client_b, settings, cfg.latency_runs, cfg.latency_gap
                        )
                        raw_reps.append(
                            {
                                "seq": 1 / seq["rate"],
                                "seq_p50": seq["p50"],
                                "conc": conc["rate"],
                                "one_p50": floor["inbox"]["p50"],
                            }
                        )
                    if want_soj:
                        s = await soj.sequential(cfg.steps)
                        c = await soj.concurrent(cfg.runs, cfg.run_steps)
                        lat = await soj.latency(cfg.latency_runs, broker, cfg.latency_gap)
                        soj_reps.append(
                            {
                                "seq": s["wall_per_step"],
                                "seq_stamped": s["per_step"],
                                "conc": c["rate"],
                                "one_p50": lat["e2e"]["p50"],
                            }
                        )
            finally:
                await client.close()
                await worker.stop()
                await broker.close()
                await client_b.close()
    from .common import throughput_summary

    return {"sojourn": throughput_summary(soj_reps), "raw": throughput_summary(raw_reps)}


async def kills(cfg: Config, marks: Marks, log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-peers-nats-kill-") as tmp:
        prefix = f"pk{uuid.uuid4().hex[:6]}"
        settings = Settings(prefix=prefix)
        async with EmbeddedServer(store_dir=Path(tmp), port=0) as srv:
            workers: dict[int, Proc] = {}

            async def spawn() -> None:
                p = Proc(
                    py("tests.apps.run_worker", srv.url, prefix, APP, str(settings.lease_ttl)),
                    env=child_env(**marks.env()),
                    stdout=True,
                )
                workers[p.pid] = p
                await p.line(lambda s: s.startswith("ready"), "ready")

            async with await Client.connect(srv.url, settings=settings) as client:

                async def start(run: str, steps: int, seconds: float) -> None:
                    # Two workers (one is the standby); a lost one is replaced before a round.
                    while len(workers) < 2:
                        await spawn()
                    await client.start("peer_slow", [run, steps, seconds], run_id=run)

                async def recover(run: str, pid: int) -> None:
                    workers.pop(pid, None)

                async def result(run: str) -> Any:
                    return await client.result(run, timeout=120)

                try:
                    rk = KillRound(start, recover, result, lambda pid: workers[pid])
                    return await kill_rounds(cfg, rk, marks, "sojourn", log)
                finally:
                    for p in list(workers.values()):
                        p.kill()


def facts() -> dict[str, str]:
    return {
        "sojourn": "embedded nats-server, sync_interval always (foundation.py's default); "
        "default Settings (lease 30 s, beat 0.25 s, dead after 1.5 s); kills: two worker "
        "processes, the standby already up, the killed one replaced before the next round",
        "raw NATS floor": "foundation.py's RawBench: sequential CAS appends (ms per append = "
        "1 / rate), 100 subjects x 10 appends at once, the inbox floor of a 1-step run "
        "(trigger through an inbox stream + 2 CAS appends)",
    }
