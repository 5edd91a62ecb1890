"""The Restate column: restate-server (from npm) and the Python SDK served by hypercorn.

The bench starts ``restate-server`` (default configuration; ports and base dir of its own),
opens one listening socket for the service and starts the service processes on it
(``python -m bench.peers.peer_restate serve FD``: hypercorn on the inherited socket, h2c), and
registers the deployment ``http://127.0.0.1:PORT`` over the admin API. Every workload goes
through the ingress over HTTP/1.1 (httpx, one client, kept-alive connections), as a Restate
client does: ``POST /peers/chain`` (an N-step run, waits for its result), ``POST /peers/one``,
``POST /peers/slow/send`` + ``GET /restate/invocation/ID/attach`` for the kill workload.

Kills: two service processes accept on the same socket, so the deployment's URI stays served
when one dies: the standby is already up, as sojourn's is. restate-server's own retry policy
(default) re-invokes the interrupted invocation, replaying its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import (
    Config,
    KillRound,
    Marks,
    Proc,
    child_env,
    free_port,
    kill_rounds,
    py,
    run_loop,
    throughput_summary,
    wait_http,
)

NPM_BIN = "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"


def find_server() -> str | None:
    """``$RESTATE_SERVER``, ``restate-server`` on PATH, or ``/tmp/restate``'s npm install."""
    for cand in (
        os.environ.get("RESTATE_SERVER"),
        shutil.which("restate-server"),
        str(Path(os.environ.get("RESTATE_NPM_PREFIX", "/tmp/restate")) / NPM_BIN),
    ):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def missing() -> str | None:
    """Why this column cannot run, or None."""
    try:
        import hypercorn  # noqa: F401
        import restate  # noqa: F401
    except ImportError as e:
        return f"Python package missing: {e.name} (pip install restate-sdk hypercorn)"
    if find_server() is None:
        return "restate-server not found (npm install --prefix /tmp/restate "
        "@restatedev/restate-server, or set RESTATE_SERVER)"
    return None


# --- the service (child process) ---------------------------------------------------------------


async def serve(fd: int) -> None:
    from hypercorn.asyncio import serve as hserve
    from hypercorn.config import Config as HConfig

    hc = HConfig()
    hc.bind = [f"fd://{fd}"]
    hc.accesslog = None
    from .restate_service import app

    print("ready", flush=True)
    await hserve(app, hc)


# --- the bench side ----------------------------------------------------------------------------


async def measure(
    cfg: Config, marks: Marks, log: Callable[[str], None], throughput: bool, kills: bool
) -> dict[str, Any]:
    import httpx

    server = find_server()
    assert server is not None
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-restate-"))
    ingress, admin, node = free_port(), free_port(), free_port()
    env = child_env(
        RESTATE_INGRESS__BIND_ADDRESS=f"127.0.0.1:{ingress}",
        RESTATE_ADMIN__BIND_ADDRESS=f"127.0.0.1:{admin}",
        RESTATE_BIND_ADDRESS=f"127.0.0.1:{node}",
        RESTATE_ADVERTISED_ADDRESS=f"http://127.0.0.1:{node}/",
        RESTATE_LISTEN_MODE="tcp",
    )
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(512)
    lsock.set_inheritable(True)
    port = lsock.getsockname()[1]
    services: dict[int, Proc] = {}
    procs: list[Proc] = []

    async def spawn() -> None:
        p = Proc(
            py("bench.peers.peer_restate", "serve", str(lsock.fileno())),
            env=child_env(**marks.env()),
            stdout=True,
            pass_fds=(lsock.fileno(),),
            log=tmp / "service.log",
        )
        services[p.pid] = p
        await p.line(lambda s: s == "ready", "ready")

    out: dict[str, Any] = {}
    try:
        srv = Proc(
            [server, "--no-logo", "--base-dir", str(tmp / "data"), "--node-name", "bench"],
            env=env,
            cwd=tmp,
            log=tmp / "server.log",
        )
        procs.append(srv)
        await wait_http(f"http://127.0.0.1:{admin}/health")
        await spawn()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{ingress}",
            timeout=120,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
        ) as http:
            reg = await http.post(
                f"http://127.0.0.1:{admin}/deployments", json={"uri": f"http://127.0.0.1:{port}"}
            )
            reg.raise_for_status()

            async def call(path: str, body: Any = None) -> Any:
                r = await http.post(path, json=body)
                r.raise_for_status()
                return r.json()

            await wait_ingress(call)
            if throughput:
                out["throughput"] = await _throughput(cfg, call, log)
            if kills:
                invocations: dict[str, str] = {}

                async def start(run: str, steps: int, seconds: float) -> None:
                    while len(services) < 2:
                        await spawn()
                    got = await call("/peers/slow/send", [run, steps, seconds])
                    invocations[run] = got["invocationId"]

                async def recover(run: str, pid: int) -> None:
                    services.pop(pid, None)

                async def result(run: str) -> Any:
                    r = await http.get(f"/restate/invocation/{invocations[run]}/attach")
                    r.raise_for_status()
                    return r.json()

                rk = KillRound(start, recover, result, lambda pid: services[pid])
                out["kills"] = await kill_rounds(cfg, rk, marks, "restate", log)
    finally:
        for p in [*services.values(), *procs]:
            p.kill()
        lsock.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


async def wait_ingress(call: Callable[..., Any], timeout: float = 60) -> None:
    """The deployment is registered: until the ingress knows the service."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            await call("/peers/one")
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _throughput(
    cfg: Config, call: Callable[..., Any], log: Callable[[str], None]
) -> dict[str, float]:
    async def seq(n: int) -> float:
        t0 = time.perf_counter()
        assert await call("/peers/chain", n) == n
        return (time.perf_counter() - t0) / n

    async def conc(runs: int, m: int) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(call("/peers/chain", m) for _ in range(runs)))
        return runs * m / (time.perf_counter() - t0)

    async def lat(k: int) -> float:
        from bench.util import pct

        xs = []
        for _ in range(k):
            await asyncio.sleep(cfg.latency_gap)
            t0 = time.perf_counter()
            await call("/peers/one")
            xs.append(time.perf_counter() - t0)
        return pct(xs, 50)

    log("restate: warm-up")
    await seq(200)
    await conc(50, 5)
    await lat(20)
    reps = []
    for rep in range(cfg.repeats):
        log(f"restate: repeat {rep + 1}/{cfg.repeats}")
        reps.append(
            {
                "seq": await seq(cfg.steps),
                "conc": await conc(cfg.runs, cfg.run_steps),
                "one_p50": await lat(cfg.latency_runs),
            }
        )
    return throughput_summary(reps)


def facts() -> dict[str, str]:
    from importlib.metadata import version

    server = find_server()
    ver = "?"
    if server:
        import subprocess

        with contextlib.suppress(Exception):
            ver = subprocess.run(
                [server, "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
    return {
        "restate": f"{ver}, restate-sdk {version('restate-sdk')}, hypercorn "
        f"{version('hypercorn')}; default server configuration (dev profile, single node, local "
        "loglet; default-retry-policy: initial interval 500 ms, exponential); ctx.run_typed per "
        "step; client: httpx over HTTP/1.1 to the ingress; kills: two service processes on one "
        "listening socket (a standby), the killed one replaced before the next round",
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        with contextlib.suppress(KeyboardInterrupt):
            run_loop(serve(int(sys.argv[2])))
