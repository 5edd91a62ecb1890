"""The LangGraph process of bench.peers (imported only in it): a graph of one node, ``step``,
that loops on itself N times (one superstep, hence one checkpoint, per step), compiled with
the SQLite checkpointer (``AsyncSqliteSaver``, one file), one thread per run, invoked with
``durability="sync"`` (each step's checkpoint is written before the next step starts).

``python -m bench.peers.langgraph_app bench DB JSON`` runs the throughput workloads here and
prints ``result {...}``. ``python -m bench.peers.langgraph_app serve DB`` obeys stdin lines:
``slow RUN STEPS SECONDS`` invokes the kill workload on thread RUN; ``resume RUN`` invokes the
graph on thread RUN with no input (it continues from the thread's last checkpoint, the
interrupted step again); ``result RUN`` prints ``done RUN`` once this process's invocation
of RUN returned.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, TypedDict

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from bench.util import pct

from .common import app_main, mark, repeated, slow_step

LIMIT = 100_000
"""recursion_limit: the default (25 supersteps) would stop a long run; nothing else changes."""


class State(TypedDict):
    x: int
    i: int
    n: int
    run: str
    seconds: float


async def step(s: State) -> dict[str, int]:
    if s["seconds"]:
        await slow_step(s["run"], s["i"], s["seconds"])
    return {"x": s["x"] + 1, "i": s["i"] + 1}


def graph(saver: AsyncSqliteSaver) -> Any:
    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["i"] < s["n"] else END)
    return g.compile(checkpointer=saver)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": LIMIT}


async def invoke(app: Any, thread: str, state: State | None) -> int:
    out = await app.ainvoke(state, config(thread), durability="sync")
    return int(out["x"])


def fresh(n: int, run: str = "", seconds: float = 0.0) -> State:
    return {"x": 0, "i": 0, "n": n, "run": run, "seconds": seconds}


async def bench(db: str, spec: dict[str, Any]) -> dict[str, float]:
    count = 0

    def tid() -> str:
        nonlocal count
        count += 1
        return f"t{count}"

    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        app = graph(saver)

        async def seq(n: int) -> float:
            t0 = time.perf_counter()
            assert await invoke(app, tid(), fresh(n)) == n
            return (time.perf_counter() - t0) / n

        async def conc(runs: int, m: int) -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(invoke(app, tid(), fresh(m)) for _ in range(runs)))
            return runs * m / (time.perf_counter() - t0)

        async def lat(k: int) -> float:
            xs = []
            for _ in range(k):
                await asyncio.sleep(spec["latency_gap"])
                t0 = time.perf_counter()
                await invoke(app, tid(), fresh(1))
                xs.append(time.perf_counter() - t0)
            return pct(xs, 50)

        return await repeated(seq, conc, lat, spec)


async def serve(db: str) -> None:
    tasks: dict[str, asyncio.Task[int]] = {}
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        app = graph(saver)
        await saver.setup()
        print("ready", flush=True)

        async def done(run: str) -> None:
            await tasks[run]
            print(f"done {run}", flush=True)

        waiting: set[asyncio.Task[None]] = set()
        while line := await asyncio.to_thread(sys.stdin.readline):
            cmd, run, *rest = line.split()
            if cmd == "slow":
                mark("enter", run, 0)
                state = fresh(int(rest[0]), run, float(rest[1]))
                tasks[run] = asyncio.create_task(invoke(app, run, state))
            elif cmd == "resume":
                tasks[run] = asyncio.create_task(invoke(app, run, None))
            elif cmd == "result":
                t = asyncio.create_task(done(run))
                waiting.add(t)
                t.add_done_callback(waiting.discard)


if __name__ == "__main__":
    app_main(bench, serve)
