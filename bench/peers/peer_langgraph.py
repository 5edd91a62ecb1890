"""The LangGraph column: the graph of ``bench.peers.langgraph_app`` with the SQLite
checkpointer, in processes of its own.

LangGraph has no server and no recovery of its own: after a crash, the application invokes
the thread again and the graph continues from its last checkpoint. The kill figure is
therefore what a user's supervisor gets at best: a standby process (graph compiled,
checkpointer open) is told to resume the thread the moment the bench has killed the first
(crash detection costs nothing here), and the figure is kill -> the interrupted step starting
again in the standby.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import Config, KillRound, Marks, Proc, child_env, kill_rounds, py


def missing() -> str | None:
    try:
        import langgraph
        import langgraph.checkpoint.sqlite.aio  # noqa: F401
    except ImportError as e:
        return (
            f"Python package missing: {e.name} (pip install langgraph langgraph-checkpoint-sqlite)"
        )
    return None


async def measure(
    cfg: Config, marks: Marks, log: Callable[[str], None], throughput: bool, kills: bool
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-langgraph-"))
    procs: dict[int, Proc] = {}
    out: dict[str, Any] = {}
    try:
        if throughput:
            spec = {k: getattr(cfg, k) for k in ("steps", "runs", "run_steps", "latency_runs")}
            spec |= {"latency_gap": cfg.latency_gap, "repeats": cfg.repeats}
            log(f"langgraph: throughput ({cfg.repeats} repeats, in the LangGraph process)")
            args = py("bench.peers.langgraph_app", "bench", str(tmp / "bench.db"), json.dumps(spec))
            b = Proc(args, stdout=True)
            procs[b.pid] = b
            got = await b.line(lambda s: s.startswith("result "), "its result", timeout=1800)
            out["throughput"] = json.loads(got.split(" ", 1)[1])
        if kills:
            db = str(tmp / "kill.db")
            roles: dict[str, Proc] = {}

            async def spawn() -> Proc:
                args = py("bench.peers.langgraph_app", "serve", db)
                p = Proc(args, env=child_env(**marks.env()), stdin=True, stdout=True)
                procs[p.pid] = p
                await p.line(lambda s: s == "ready", "ready")
                return p

            async def start(run: str, steps: int, seconds: float) -> None:
                if "serving" not in roles:
                    roles["serving"] = await spawn()
                if "standby" not in roles:
                    roles["standby"] = await spawn()
                roles["serving"].send(f"slow {run} {steps} {seconds}")

            async def recover(run: str, pid: int) -> None:
                roles["standby"].send(f"resume {run}")
                roles["serving"] = roles.pop("standby")
                procs.pop(pid, None)

            async def result(run: str) -> Any:
                roles["serving"].send(f"result {run}")
                return await roles["serving"].line(lambda s: s == f"done {run}", "the result")

            rk = KillRound(start, recover, result, lambda pid: procs[pid])
            out["kills"] = await kill_rounds(cfg, rk, marks, "langgraph", log)
    finally:
        for p in procs.values():
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def facts() -> dict[str, str]:
    from importlib.metadata import version

    return {
        "langgraph": f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite "
        f"{version('langgraph-checkpoint-sqlite')} (AsyncSqliteSaver: aiosqlite, WAL, "
        'SQLite\'s default synchronous=FULL); durability="sync" (the default is "async": '
        "a step's checkpoint is written while the next step runs); recursion_limit raised "
        "from 25 so that a run may have N steps; in-process (no server); kills: a standby "
        "process resumes the thread at once (see the module docstring)",
    }
