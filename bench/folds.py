"""Folding a run that buffers many signals: ``python -m bench.folds``.

Run from the repository root::

    python -m bench.folds                  # ~2 min on one core, most of it the "before" column
    python -m bench.folds --before-max 0   # after only: a few seconds

Pure CPU: no server, no I/O. For N buffered signals (``--sizes``, default 5,000 / 20,000 /
100,000) it times, best of ``--repeats`` (``gc.collect()`` before each, the collector on):

- **fold, buffered**: ``actors.core.state.fold`` of ``RunStarted`` + N ``SignalReceived`` (a
  run that received N signals no wait has taken yet);
- **fold, buffered + taken**: the same + N ``WaitCompleted``, each taking one signal by its
  ``signal_id``, oldest first (a run whose waits work through its backlog);
- **summarize_all**, the same two histories, one decision per event (as the intake writes
  signals): ``projections.summary.summarize_all``;
- **summarize, one event at a time** (buffered only): what ``RunModel`` does as it follows the
  events stream. Its code is unchanged (``summarize`` itself scans and copies the buffered
  signals per signal event), so it is timed after only, up to ``--per-event-max`` signals.

"before" is the same functions as they were at ``--before`` (default ``e3dfa51``, the commit
before issue 9's change), read with ``git show`` into throwaway modules, so both columns come
from the same process on the same inputs; "after" is the working tree. "before" is quadratic:
the fold of buffered signals (the case of issue 9) is timed up to ``--before-max`` signals
(default 100,000: ~20 s), the other cases up to ``--slow-before-max`` (default 20,000: at
100,000 each would take 3-8 minutes), best of ``--repeats`` up to 5,000 signals and once above.
Each pair of results is checked to agree (the same buffered signal ids).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench.util import git_state, machine_facts
from sojourn.actors.core import state as state_now
from sojourn.broker.server import find_nats_server
from sojourn.projections import summary as summary_now
from sojourn.schemas.events import RunEvent, RunStarted, SignalReceived, WaitCompleted

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "e3dfa51"
"""The last commit before buffered signals were folded in linear time (issue 9)."""


@dataclass
class Config:
    sizes: list[int]
    repeats: int
    before: str
    before_max: int
    slow_before_max: int
    per_event_max: int
    json_out: str | None


def parse_args(argv: Sequence[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="5000,20000,100000", help="buffered signals per run")
    p.add_argument("--repeats", type=int, default=3, help="best of this many (after)")
    p.add_argument("--before", default=BEFORE, help="git revision of the 'before' column")
    p.add_argument("--before-max", type=int, default=100_000, help="largest N timed before")
    p.add_argument("--slow-before-max", type=int, default=20_000, help="... for the rest")
    p.add_argument("--per-event-max", type=int, default=20_000)
    p.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    a = p.parse_args(argv)
    return Config(
        sizes=[int(x) for x in a.sizes.split(",") if x],
        repeats=a.repeats,
        before=a.before,
        before_max=a.before_max,
        slow_before_max=a.slow_before_max,
        per_event_max=a.per_event_max,
        json_out=a.json_out,
    )


def load_before(rev: str) -> tuple[types.ModuleType, types.ModuleType] | None:
    """``actors/core/state.py`` and ``projections/summary.py`` at ``rev``, as fresh modules."""
    mods = []
    for path in ("actors/core/state.py", "projections/summary.py"):
        try:
            src = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        mod = types.ModuleType(f"bench._before_{rev}_{Path(path).stem}")
        sys.modules[mod.__name__] = mod  # msgspec resolves annotations through it
        exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
        mods.append(mod)
    return mods[0], mods[1]


# --- inputs -------------------------------------------------------------------------------------

START = RunStarted(run_id="r1", agent="inbox", input=msgspec.Raw(b'{"q":1}'), at=1.0)
PAYLOAD = msgspec.Raw(b'{"from":"hr-portal","ok":true}')


def buffered(n: int) -> list[RunEvent]:
    return [
        START,
        *(
            SignalReceived(name="docs.signed", payload=PAYLOAD, signal_id=f"sig-{i}", at=2.0 + i)
            for i in range(n)
        ),
    ]


def taken(n: int) -> list[RunEvent]:
    return [
        *buffered(n),
        *(
            WaitCompleted(
                position=i,
                key="signal:docs.signed",
                outcome="signal",
                payload=PAYLOAD,
                signal="docs.signed",
                signal_id=f"sig-{i}",
                at=2.0 + n + i,
            )
            for i in range(n)
        ),
    ]


def as_decisions(events: list[RunEvent]) -> list[tuple[int, int, list[RunEvent]]]:
    return [(i + 1, 100, [e]) for i, e in enumerate(events)]


# --- timing -------------------------------------------------------------------------------------


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    out: Any = None
    times = []
    for _ in range(max(1, repeats)):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def ids(state: Any) -> list[str]:
    return [x.signal_id for x in state.signals]


def run(cfg: Config, log: Callable[[str], None]) -> dict[str, Any]:
    wanted = max(cfg.before_max, cfg.slow_before_max) > 0
    before = load_before(cfg.before) if wanted else None
    if before is None and wanted:
        log(f"(no 'before' column: cannot read {cfg.before} with git)")
    rows: list[dict[str, Any]] = []
    for n in cfg.sizes:
        reps = cfg.repeats if n <= 5_000 else 1
        for shape, events in (("buffered", buffered(n)), ("buffered + taken", taken(n))):
            decisions = as_decisions(events)
            cases: list[tuple[str, Callable[[Any, Any], Any], int]] = [
                (
                    "fold",
                    lambda st, _sm, ev=events: st.fold(ev),
                    cfg.before_max if shape == "buffered" else cfg.slow_before_max,
                ),
                (
                    "summarize_all",
                    lambda _st, sm, ds=decisions: sm.summarize_all(ds),
                    cfg.slow_before_max,
                ),
            ]
            if shape == "buffered" and n <= cfg.per_event_max:
                cases.append(("summarize, one event at a time", _one_by_one(events), 0))
            for what, fn, before_max in cases:
                slow = what.startswith("summarize,")
                after_s, got = best(
                    lambda fn=fn: fn(state_now, summary_now), reps if slow else cfg.repeats
                )
                row: dict[str, Any] = {"n": n, "shape": shape, "what": what, "after": after_s}
                if before is not None and n <= before_max:
                    before_s, old = best(lambda fn=fn: fn(*before), reps)
                    assert ids(old) == ids(got), (n, shape, what)
                    row["before"] = before_s
                assert len(got.signals) == (n if shape == "buffered" else 0)
                rows.append(row)
                log(_line(row))
    return {"rows": rows, "before": cfg.before}


def _one_by_one(events: list[RunEvent]) -> Callable[[Any, Any], Any]:
    def go(_st: Any, sm: Any) -> Any:
        s = sm.RunSummary()
        for e in events:
            s = sm.summarize(s, e)
        return s

    return go


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:,.1f} ms"


def _line(row: dict[str, Any]) -> str:
    b, a = row.get("before"), row["after"]
    ratio = f"{b / a:,.0f}x" if b is not None and a > 0 else ""
    return f"{row['n']:>7,}  {row['shape']:<17} {row['what']:<31} {_ms(b):>12} {_ms(a):>11} {ratio}"


def render(facts: dict[str, str], res: dict[str, Any]) -> str:
    out = [
        "| signals | history | function | before | after | before / after |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for r in res["rows"]:
        b, a = r.get("before"), r["after"]
        ratio = f"{b / a:,.0f}x" if b is not None and a > 0 else ""
        shown = "(same code)" if r["what"].startswith("summarize,") else _ms(b)
        out.append(f"| {r['n']:,} | {r['shape']} | {r['what']} | {shown} | {_ms(a)} | {ratio} |")
    out.append("")
    out.append(
        f"before: sojourn at `{res['before']}`; after: `{facts['sojourn']}`; "
        f"python {facts['python']}, {facts['cpu model']}"
    )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args(argv)
    try:
        facts = machine_facts(find_nats_server(), ROOT)
    except Exception:  # no server binary needed here: only the machine's facts
        facts = {"python": sys.version.split()[0], "cpu model": "?"}
    facts["sojourn"] = git_state(ROOT)
    t0 = time.perf_counter()
    res = run(cfg, lambda s: print(s, file=sys.stderr, flush=True))
    print(render(facts, res))
    print(f"\n(bench took {time.perf_counter() - t0:.0f} s)")
    if cfg.json_out:
        Path(cfg.json_out).write_text(
            json.dumps({"config": cfg.__dict__, "machine": facts, "results": res}, indent=2)
        )


if __name__ == "__main__":
    main()
