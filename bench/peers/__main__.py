"""Entry point of ``python -m bench.peers`` (see the package docstring)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.util import fmt_ms, git_state, machine_facts, run_bench

from . import __doc__ as DOC
from .common import ROOT, Config, Marks, kill_all

COLUMNS = ("sojourn", "restate", "dbos", "langgraph", "raw")
TITLES = {
    "sojourn": "sojourn",
    "restate": "Restate",
    "dbos": "DBOS",
    "langgraph": "LangGraph (SQLite)",
    "raw": "raw NATS floor",
}


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers", description=(DOC or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="1 repeat, N=300, K=50, 2 kill rounds")
    p.add_argument("--only", default=",".join(COLUMNS), help="columns, comma separated")
    p.add_argument("--steps", type=int, help="steps of the sequential run (default 1000)")
    p.add_argument("--latency-runs", type=int, help="1-step runs per repeat (default 200)")
    p.add_argument("--repeats", type=int, help="repeats of the throughput rows (default 3)")
    p.add_argument("--kill-rounds", type=int, help="rounds per kill row (default 5)")
    p.add_argument("--json", dest="json_out", help="also write every figure to this file")
    a = p.parse_args(argv)
    cols = tuple(c for c in a.only.split(",") if c)
    bad = [c for c in cols if c not in COLUMNS]
    if bad:
        p.error(f"unknown column {bad[0]!r}: choose from {', '.join(COLUMNS)}")
    cfg = Config(columns=cols, json_out=a.json_out, quick=a.quick)
    if a.quick:
        cfg.steps, cfg.latency_runs, cfg.repeats, cfg.kill_rounds = 300, 50, 1, 2
    cfg.steps = a.steps or cfg.steps
    cfg.latency_runs = a.latency_runs or cfg.latency_runs
    cfg.repeats = a.repeats or cfg.repeats
    cfg.kill_rounds = a.kill_rounds or cfg.kill_rounds
    return cfg


def _missing(col: str) -> str | None:
    if col == "restate":
        from . import peer_restate

        return peer_restate.missing()
    if col == "dbos":
        from . import peer_dbos

        return peer_dbos.missing()
    if col == "langgraph":
        from . import peer_langgraph

        return peer_langgraph.missing()
    return None


async def _column(
    col: str, cfg: Config, marks: Marks, log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Figures and facts of one peer column (sojourn's and raw's are measured together)."""
    if col == "restate":
        from . import peer_restate as mod
    elif col == "dbos":
        from . import peer_dbos as mod  # type: ignore[no-redef]
    else:
        from . import peer_langgraph as mod  # type: ignore[no-redef]
    return await mod.measure(cfg, marks, log, True, True), mod.facts()


async def amain(cfg: Config) -> dict[str, Any]:
    logging.basicConfig(level=logging.ERROR)

    def log(msg: str) -> None:
        print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    from sojourn.broker import find_nats_server

    facts = machine_facts(find_nats_server(), Path(tempfile.gettempdir()))
    facts["sojourn"] = git_state(ROOT)
    res: dict[str, dict[str, Any]] = {c: {} for c in cfg.columns}
    notes: dict[str, str] = {}
    marks = await Marks().open()
    t0 = time.perf_counter()
    load0 = _loadavg()
    try:
        if "sojourn" in cfg.columns or "raw" in cfg.columns:
            from . import peer_sojourn

            got = await peer_sojourn.throughput(
                cfg, log, "sojourn" in cfg.columns, "raw" in cfg.columns
            )
            for c in ("sojourn", "raw"):
                if c in cfg.columns:
                    res[c]["throughput"] = got[c]
            if "sojourn" in cfg.columns:
                res["sojourn"]["kills"] = await peer_sojourn.kills(cfg, marks, log)
            notes |= peer_sojourn.facts()
        for col in ("restate", "dbos", "langgraph"):
            if col not in cfg.columns:
                continue
            why = _missing(col)
            if why:
                res[col]["missing"] = why
                log(f"{col}: not installed: {why}")
                continue
            try:
                figures, fact = await _column(col, cfg, marks, log)
            except Exception as e:  # one peer failing must not lose the others' figures
                log(f"{col}: failed: {e!r}")
                res[col]["failed"] = repr(e)
                continue
            res[col] |= figures
            notes |= fact
    finally:
        marks.close()
        kill_all()
    elapsed = time.perf_counter() - t0
    print(render(cfg, facts, res, notes, load0, _loadavg()))
    print(f"\n(bench took {elapsed:.0f} s)")
    return {"config": cfg.__dict__, "machine": facts, "notes": notes, "results": res}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _cell(res: dict[str, Any], row: str) -> str:
    if "missing" in res:
        return "not installed"
    if "failed" in res:
        return "failed"
    if row in ("early", "mid"):
        k = (res.get("kills") or {}).get(row)
        if not k:
            return "—"
        return f"{k['next_step_p50']:.2f} s (max {k['next_step_max']:.2f} s)"
    t = res.get("throughput") or {}
    if row not in t:
        return "—"
    if row == "seq":
        return f"{t['seq'] * 1e3:.3f} ms"
    if row == "conc":
        return f"{t['conc']:,.0f}"
    return fmt_ms(t["one_p50"])


ROWS = {
    "early": "SIGKILL ~0–20 ms into a run → next step (p50, max)",  # noqa: RUF001
    "mid": "SIGKILL 0.5 s into a step → next step (p50, max)",
    "seq": "sequential step (ms per step, one run of N trivial steps)",
    "conc": "concurrent steps/s (100 runs × 10 steps started at once)",  # noqa: RUF001
    "one": "1-step run, start → result p50 (ms)",
}


def render(
    cfg: Config,
    facts: dict[str, str],
    res: dict[str, dict[str, Any]],
    notes: dict[str, str],
    load0: str,
    load1: str,
) -> str:
    cols = [c for c in COLUMNS if c in cfg.columns]
    lines = [
        f"## sojourn against its peers ({'quick' if cfg.quick else 'full'}: N={cfg.steps}, "
        f"{cfg.runs} runs x {cfg.run_steps} steps, K={cfg.latency_runs} 1-step runs, "
        f"median of {cfg.repeats} repeats; {cfg.kill_rounds} kill rounds per row)",
        "",
        "| fact | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in facts.items()),
        f"| load average before / after (other processes share this machine) | {load0} / {load1} |",
        "",
        "| | " + " | ".join(TITLES[c] for c in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for row, title in ROWS.items():
        key = "one_p50" if row == "one" else row
        lines.append(f"| {title} | " + " | ".join(_cell(res[c], key) for c in cols) + " |")
    lines += ["", "Details:", ""]
    for c in cols:
        r = res[c]
        if "missing" in r:
            lines.append(f"- {TITLES[c]}: not installed: {r['missing']}")
        elif "failed" in r:
            lines.append(f"- {TITLES[c]}: failed: {r['failed']}")
    for c in cols:
        k = res[c].get("kills") or {}
        for point in ("early", "mid"):
            if point in k:
                lines.append(
                    f"- {TITLES[c]}, {point} kill: kill → next step "
                    + ", ".join(f"{x:.3f}" for x in k[point]["next_step_each"])
                    + f" s; kill → run's result p50 {k[point]['done_p50']:.2f} s"
                )
        if "relaunch_to_imported_p50" in k:
            lines.append(
                f"- {TITLES[c]}: of which the relaunched process's interpreter start and "
                f"imports (kill → its first line), p50 {k['relaunch_to_imported_p50']:.2f} s"
            )
    soj = (res.get("sojourn") or {}).get("throughput") or {}
    if "seq_stamped" in soj:
        lines.append(
            f"- sojourn sequential per step from the event stamps (foundation.py's figure: "
            f"(RunCompleted.at - first StepStarted.at) / N): {soj['seq_stamped'] * 1e3:.3f} ms"
        )
    raw = (res.get("raw") or {}).get("throughput") or {}
    if "seq_p50" in raw:
        lines.append(f"- raw sequential CAS append p50: {raw['seq_p50'] * 1e3:.3f} ms")
    lines += ["", "Setups:", ""]
    lines += [f"- {k}: {v}" for k, v in notes.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    try:
        run_bench(amain(cfg), cfg.json_out)
    finally:
        kill_all()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
