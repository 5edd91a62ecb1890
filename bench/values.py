"""Large values by reference: a 1 MB conversation state carried across 100 steps.

``python -m bench.values`` starts an embedded nats-server and runs the same agent twice, on
two deployments (prefixes) of it: with values by reference (``Settings.value_inline_max``, 16
KiB) and with every value inline (``value_inline_max`` above the state's size). Each step
returns the state with one more small message. It reports the bytes stored (the events
stream, holding the run's history, and the values stream, holding the pieces) and the time
per step (from one step's recorded completion to the next), and the time a new worker takes
to replay the run (its first activation after a signal, on an empty piece cache).

The issue's target: the 1 MB state over 100 steps stores <= 2 MB in all.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import JetStreamError
from sojourn.schemas.config import Settings

from .util import median, pct


class Spec(msgspec.Struct, frozen=True):
    messages: int = 1000
    size: int = 950
    steps: int = 100


def seed_state(messages: int, size: int) -> dict[str, Any]:
    rnd = random.Random(13)
    return {
        "title": "a long conversation",
        "messages": [
            {"role": "user" if i % 2 else "assistant", "n": i,
             "text": "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz ", k=size))}
            for i in range(messages)
        ],
    }  # fmt: skip


def add_message(state: dict[str, Any], i: int) -> dict[str, Any]:
    return {**state, "messages": [*state["messages"], {"role": "user", "n": i, "text": "ok"}]}


STEP_TIMES: list[float] = []
"""When each live step returned to the agent (this process's clock): the time per step."""


@agent("conversation")
async def conversation(ctx: Context, spec: Spec) -> str:
    state = await ctx.step(seed_state, spec.messages, spec.size)
    for i in range(spec.steps):
        state = await ctx.step(add_message, state, i)
        if not ctx.replaying:
            STEP_TIMES.append(time.perf_counter())
    await ctx.wait_for("go")  # a later activation replays every step
    return hashlib.sha256(msgspec.json.encode(state)).hexdigest()


async def _bytes(client: Client, stream: str) -> int:
    try:
        info = await client.broker.api(f"$JS.API.STREAM.INFO.{stream}", {})
    except JetStreamError:  # a stream not created: nothing stored
        return 0
    return int(info["state"]["bytes"])


async def one(url: str, spec: Spec, *, by_reference: bool) -> dict[str, Any]:
    prefix = f"bv{'r' if by_reference else 'i'}{random.randrange(10**6)}"
    inline_max = 16 * 1024 if by_reference else 64 * 1024 * 1024
    settings = Settings(prefix=prefix, value_inline_max=inline_max, max_value=4 * 1024 * 1024)
    STEP_TIMES.clear()
    async with await Client.connect(url, settings=settings) as client:
        async with Worker([conversation], nats=url, settings=settings):
            run_id = await client.start("conversation", spec, run_id="conv", wait=True)

            for _ in range(12_000):  # 10 minutes at most
                if (await client.state(run_id)).status == "waiting":
                    break
                await asyncio.sleep(0.05)
        per_step = [b - a for a, b in itertools.pairwise(STEP_TIMES)]
        events_b = await _bytes(client, client.names.events_stream)
        values_b = await _bytes(client, client.names.values_stream)
        final = seed_state(spec.messages, spec.size)
        for i in range(spec.steps):
            final = add_message(final, i)
        replay: float | None = None
        if by_reference:
            # A new worker (empty caches) replays the whole run to finish it. (Inline, the
            # worker would read a history of steps x state bytes: 100 MB at full size.)
            async with Worker([conversation], nats=url, settings=settings):
                t0 = time.perf_counter()
                await client.signal(run_id, "go")
                digest = await client.result(run_id, timeout=600)
                replay = time.perf_counter() - t0
            want = hashlib.sha256(msgspec.json.encode(final)).hexdigest()
            assert digest == want, "the replayed state differs"
    return {
        "mode": "by reference" if by_reference else "inline",
        "state_bytes": len(msgspec.json.encode(final)),
        "events_bytes": events_b,
        "values_bytes": values_b,
        "total_bytes": events_b + values_b,
        "step_ms_p50": 1000 * median(per_step),
        "step_ms_p90": 1000 * pct(per_step, 90),
        "replay_s": replay,
    }


async def run(spec: Spec) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedServer(store_dir=Path(tmp) / "nats", port=0) as server:
            return [
                await one(server.url, spec, by_reference=True),
                await one(server.url, spec, by_reference=False),
            ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.values", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a 200 KB state over 20 steps")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    spec = Spec(messages=200, steps=20) if args.quick else Spec()
    rows = asyncio.run(run(spec))
    for r in rows:
        print(
            f"{r['mode']:>12}: state {r['state_bytes'] / 1e6:.2f} MB, stored "
            f"{r['total_bytes'] / 1e6:.2f} MB (history {r['events_bytes'] / 1e6:.2f} MB, "
            f"pieces {r['values_bytes'] / 1e6:.2f} MB); per step p50 {r['step_ms_p50']:.1f} ms, "
            f"p90 {r['step_ms_p90']:.1f} ms"
            + ("" if r["replay_s"] is None else f"; replay on a new worker {r['replay_s']:.2f} s")
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
