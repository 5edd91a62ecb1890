"""The DBOS column: DBOS Transact (Python) on a throwaway PostgreSQL cluster.

The bench runs ``initdb`` into a temp dir and starts ``postgres`` on a free port (as ``nobody``
when it runs as root: postgres refuses root), with its defaults (fsync on,
synchronous_commit on). The workloads run inside a DBOS process (``bench.peers.dbos_app``), as
DBOS applications do; the kill workload's process is killed and a new one is started right
after (the relaunch): DBOS recovers the pending workflows of its executor at launch.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.util import median

from .common import Config, KillRound, Marks, Proc, child_env, free_port, kill_rounds, py

PG_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in PG_DIRS:
        if (Path(d) / name).is_file():
            return str(Path(d) / name)
    return None


def missing() -> str | None:
    try:
        import dbos  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError as e:
        return f"Python package missing: {e.name} (pip install dbos)"
    for tool in ("initdb", "postgres"):
        if pg_bin(tool) is None:
            return f"PostgreSQL's {tool} not found (apt-get install postgresql)"
    return None


async def postgres(tmp: Path, log: Callable[[str], None]) -> tuple[Proc, str]:
    """A throwaway cluster in ``tmp``: the postgres process (its group) and its URL base."""
    import psycopg

    user = "nobody" if os.geteuid() == 0 else None
    if user:
        shutil.chown(tmp, user)
    data = tmp / "data"
    log("dbos: initdb")
    init = Proc(
        [pg_bin("initdb") or "initdb", "-D", str(data), "-U", "postgres", "--auth=trust"],
        user=user,
        log=tmp / "initdb.log",
        cwd=tmp,
    )
    await asyncio.to_thread(init.proc.wait, 120)
    init.kill()
    if init.proc.returncode != 0:
        raise RuntimeError(f"initdb failed: {(tmp / 'initdb.log').read_text()[-500:]}")
    port = free_port()
    pg = Proc(
        [
            pg_bin("postgres") or "postgres",
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(tmp),
            "-c",
            "listen_addresses=127.0.0.1",
        ],
        user=user,
        log=tmp / "postgres.log",
        cwd=tmp,
    )
    base = f"postgresql://postgres@127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(f"{base}/postgres")
            await conn.close()
            return pg, base
        except psycopg.OperationalError:
            if time.monotonic() > deadline or pg.proc.poll() is not None:
                raise
            await asyncio.sleep(0.1)


async def measure(
    cfg: Config, marks: Marks, log: Callable[[str], None], throughput: bool, kills: bool
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-pg-"))
    procs: list[Proc] = []
    out: dict[str, Any] = {}
    try:
        pg, base = await postgres(tmp, log)
        procs.append(pg)
        if throughput:
            spec = {k: getattr(cfg, k) for k in ("steps", "runs", "run_steps", "latency_runs")}
            spec |= {"latency_gap": cfg.latency_gap, "repeats": cfg.repeats}
            log(f"dbos: throughput ({cfg.repeats} repeats, in the DBOS process)")
            args = py("bench.peers.dbos_app", "bench", f"{base}/peers_bench", json.dumps(spec))
            b = Proc(args, stdout=True)
            procs.append(b)
            got = await b.line(lambda s: s.startswith("result "), "its result", timeout=1800)
            out["throughput"] = json.loads(got.split(" ", 1)[1])
        if kills:
            out["kills"] = await _kills(cfg, marks, log, f"{base}/peers_kill", procs)
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


async def _kills(
    cfg: Config, marks: Marks, log: Callable[[str], None], url: str, procs: list[Proc]
) -> dict[str, Any]:
    relaunch: list[float] = []
    current: list[Proc] = []

    async def spawn() -> Proc:
        args = py("bench.peers.dbos_app", "serve", url)
        p = Proc(args, env=child_env(**marks.env()), stdin=True, stdout=True)
        procs.append(p)
        current[:] = [p]
        return p

    first = await spawn()
    await first.line(lambda s: s == "ready", "ready")

    async def start(run: str, steps: int, seconds: float) -> None:
        current[0].send(f"slow {run} {steps} {seconds}")

    async def recover(run: str, pid: int) -> None:
        t0 = time.time()
        p = await spawn()
        imported = await p.line(lambda s: s.startswith("imported "), "imported")
        relaunch.append(float(imported.split()[1]) - t0)
        await p.line(lambda s: s == "ready", "ready")

    async def result(run: str) -> Any:
        current[0].send(f"result {run}")
        return await current[0].line(lambda s: s == f"done {run}", "the result", timeout=120)

    def victim(pid: int) -> Proc:
        assert current[0].pid == pid, "the run is not in the serving DBOS process"
        return current[0]

    res = await kill_rounds(cfg, KillRound(start, recover, result, victim), marks, "dbos", log)
    res["relaunch_to_imported_p50"] = median(relaunch)
    return res


def facts() -> dict[str, str]:
    from importlib.metadata import version

    pgv = "?"
    exe = pg_bin("postgres")
    if exe:
        import subprocess

        pgv = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "dbos": f"dbos {version('dbos')}, {pgv} (system database; defaults: fsync on, "
        "synchronous_commit on); async workflows and steps, started with "
        "DBOS.start_workflow_async and awaited in the same process; kills: the DBOS process is "
        "relaunched (a new process, started right after the kill) and recovers the workflow "
        "at launch",
    }
