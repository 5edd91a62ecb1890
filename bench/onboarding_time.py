"""Virtual time: the onboarding example's days-long flows under ``SojournEnv``, in wall time.

Run from the repository root::

    python -m bench.onboarding_time              # ~30 s: 20 flows of each kind
    python -m bench.onboarding_time --flows 5    # a quick look

One embedded nats-server (free port, temp dir) is shared by every flow, as the pytest plugin
shares one per test process; each flow gets a ``SojournEnv`` of its own (its own worker,
client and prefix, virtual time on) serving ``examples.onboarding`` with its production
deadlines (HR paged after a day, three days to sign, two for the manager), the model scripted
(``mock_model``) and the effects in a temp outbox. Three flows, as the example's tests drive
them:

- **prompt** (the baseline: no deadline reached, no time skipped): the signature and the
  manager's approval are sent right after the start; the same stages, minus HR.
- **unsigned**: the hire never signs. ``env.result`` alone: the clock skips to day 1 (HR is
  paged), then to day 3 (the run ends ``unsigned``).
- **full**: HR paged on day 1, the signature on day 2.9 (``env.advance`` then ``env.signal``),
  the manager silent, so two days later the approval's policy orders the standard laptop
  through the ``it-provision`` child run; ends on day 4.9.

Figures: the wall time of each flow from ``env.start`` to its result (p50 and max; the
environment's start and stop are timed apart), and the virtual time it covered (its
``RunStarted`` to its ``RunCompleted``). The issue's target: the three-day flow, escalation
included, in well under a second of waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.util import git_state, machine_facts, median, pct, run_bench
from sojourn.actors.testing import SojournEnv, mock_model, turn
from sojourn.broker import EmbeddedServer, find_nats_server
from sojourn.schemas.events import RunCompleted, RunStarted

ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400.0
FLOWS = ("prompt", "unsigned", "full")
TARGET = 1.0
"""Wall seconds: a days-long flow in well under a second of waiting (issue 34)."""


@dataclass
class Config:
    flows: int
    json_out: str | None


def parse_args(argv: list[str] | None = None) -> Config:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="python -m bench.onboarding_time", description=doc.split("\n")[0]
    )
    p.add_argument("--flows", type=int, default=20, help="flows of each kind (default 20)")
    p.add_argument("--json", dest="json_out", help="also write the figures to this file")
    a = p.parse_args(argv)
    if a.flows < 1:
        p.error("--flows must be at least 1")
    return Config(flows=a.flows, json_out=a.json_out)


async def one_flow(server: EmbeddedServer, kind: str) -> dict[str, float]:
    """One flow in a fresh environment: its wall time, the environment's, and the virtual
    days it covered."""
    import examples.onboarding as onb

    hire = onb.Hire(name="Ada", email="ada@example.com", manager="grace")
    t_env = time.perf_counter()
    async with SojournEnv([onb.onboarding, onb.it_provision], server=server) as env:
        setup = time.perf_counter() - t_env
        with mock_model(onb.MODEL, lambda request: turn("Welcome aboard!", tokens=(60, 15))):
            t0 = time.perf_counter()
            run_id = await env.start(onb.onboarding, hire)
            if kind == "prompt":
                await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
                approval = {"approve": True, "by": "grace"}
                await env.signal(run_id, "approval.laptop", approval, wait=True)
            if kind == "full":
                await env.advance(timedelta(days=2, hours=21, minutes=36))  # day 2.9
                await env.signal(run_id, "docs.signed", {"by": "ada@example.com"}, wait=True)
            done = await env.result(run_id, type=onb.Onboarded)
            wall = time.perf_counter() - t0
        expected = "unsigned" if kind == "unsigned" else "onboarded"
        if done.outcome != expected or done.escalated != (kind != "prompt"):
            raise RuntimeError(f"{kind}: unexpected outcome {done}")
        events = await env.history(run_id)
        start = next(e.at for e in events if isinstance(e, RunStarted))
        end = next(e.at for e in events if isinstance(e, RunCompleted))
        t_stop = time.perf_counter()
    return {
        "wall": wall,
        "virtual_days": (end - start) / DAY,
        "env_start": setup,
        "env_stop": time.perf_counter() - t_stop,
    }


async def amain(cfg: Config) -> dict[str, Any]:
    def log(msg: str) -> None:
        print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    binary = find_nats_server()
    facts = machine_facts(binary, Path(tempfile.gettempdir()))
    facts["sojourn"] = git_state(ROOT)
    res: dict[str, Any] = {}
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-onboarding-") as tmp:
        os.environ["SOJOURN_ONBOARDING_OUTBOX"] = str(Path(tmp) / "outbox")
        async with EmbeddedServer(store_dir=Path(tmp) / "nats", port=0) as server:
            await one_flow(server, "full")  # warm-up (imports, first connections): not counted
            for kind in FLOWS:
                got = []
                for i in range(cfg.flows):
                    got.append(await one_flow(server, kind))
                    if (i + 1) % 10 == 0:
                        log(f"{kind}: {i + 1}/{cfg.flows}")
                walls = [g["wall"] for g in got]
                vdays = [g["virtual_days"] for g in got]
                res[kind] = {
                    "wall_p50": median(walls),
                    "wall_p90": pct(walls, 90),
                    "wall_max": max(walls),
                    "virtual_days": median(vdays),
                    "env_start_p50": median([g["env_start"] for g in got]),
                    "env_stop_p50": median([g["env_stop"] for g in got]),
                }
                r = res[kind]
                verdict = "met" if r["wall_max"] < TARGET else "MISSED"
                verdict = "(baseline)" if kind == "prompt" else f"< 1 s: {verdict}"
                lines.append(
                    f"| {kind} | {len(got)} | {r['virtual_days']:.2f} days | "
                    f"{r['wall_p50'] * 1000:.0f} ms | {r['wall_max'] * 1000:.0f} ms | "
                    f"{r['env_start_p50'] * 1000:.0f} ms / {r['env_stop_p50'] * 1000:.0f} ms | "
                    f"{verdict} |"
                )
    print(f"\nsojourn {facts['sojourn']}; {facts['cpus (nproc)']} CPUs, {facts['cpu model']}")
    print(
        "\n| flow | n | virtual time covered | wall p50 | wall max | env start / stop (p50) "
        "| target |\n|---|---|---|---|---|---|---|"
    )
    print("\n".join(lines))
    return {"config": cfg.__dict__, "machine": facts, "results": res}


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    run_bench(amain(cfg), cfg.json_out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
