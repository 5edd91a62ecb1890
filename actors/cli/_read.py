"""``sojourn runs``: list runs from a projector's read model."""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime
from typing import Final

from sojourn.schemas.attributes import InvalidAttributes, parse_attribute_filter
from sojourn.schemas.codec import encode
from sojourn.schemas.health import LIVENESS_STATES, LivenessState
from sojourn.schemas.names import validate_token
from sojourn.schemas.priority import PRIORITY_DEFAULT
from sojourn.schemas.views import QUERY_LIMIT_MAX, RunView
from sojourn.schemas.vocabulary import RUN_STATUSES, RunStatus

from ..client.listing import list_runs
from ._args import Command, _positive_int, add_json
from ._common import EXIT_OK, UsageError, connect_client
from ._render import one_line, out

__all__ = ["COMMANDS", "age_seconds", "cmd_runs", "run_lines"]

_AGE = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNIT: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_HEADER: Final = ("RUN_ID", "AGENT", "STATUS", "LIVENESS", "UPDATED", "STEP/ERROR")
_DETAIL_MAX: Final = 80


def age_seconds(text: str) -> int:
    """``90s``, ``30m``, ``1h``, ``2d`` in seconds; ``UsageError`` for anything else."""
    m = _AGE.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"--since {text!r}: a number and a unit s, m, h or d (90s, 30m, 1h, 2d)")
    return int(m.group(1)) * _UNIT[m.group(2)]


def _statuses(values: list[str]) -> tuple[RunStatus, ...]:
    bad = [v for v in values if v not in RUN_STATUSES]
    if bad:
        raise UsageError(f"--status {bad[0]!r}: one of {', '.join(RUN_STATUSES[1:])}")
    return tuple(v for v in RUN_STATUSES if v in values)


def _livenesses(values: list[str]) -> tuple[LivenessState, ...]:
    bad = [v for v in values if v not in LIVENESS_STATES]
    if bad:
        raise UsageError(f"--liveness {bad[0]!r}: one of {', '.join(LIVENESS_STATES)}")
    return tuple(v for v in LIVENESS_STATES if v in values)


def _updated(at: float, now: float) -> str:
    """``12s ago``, ``5m ago``, ``3h ago`` within a day, else the UTC date and time."""
    if not at:
        return "-"
    ago = max(now - at, 0.0)
    if ago < 60:
        return f"{ago:.0f}s ago"
    if ago < 3600:
        return f"{ago // 60:.0f}m ago"
    if ago < 86400:
        return f"{ago // 3600:.0f}h ago"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _status(v: RunView) -> str:
    """The status, and the priority of a run started at another than the default (``p1``
    most urgent to ``p5``), as the console tags it."""
    return v.status if v.priority == PRIORITY_DEFAULT else f"{v.status} p{v.priority}"


def _detail(v: RunView) -> str:
    """What a line says last: the error of a failed run (or a failing step), the step in
    progress, what a run waits on, why it is suspended."""
    if v.error is not None and (v.status == "failed" or v.step is not None):
        text = f"{v.error.type}: {one_line(v.error.message)}"
    elif v.step is not None:
        text = v.step if v.step_attempt <= 1 else f"{v.step} (attempt {v.step_attempt})"
    elif v.status == "waiting" and v.waiting_on:
        text = "on " + ", ".join(v.waiting_on)
    elif v.status == "suspended" and v.suspended_reason:
        text = v.suspended_reason
    else:
        text = "-"
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 1] + "…"


def run_lines(views: tuple[RunView, ...], now: float) -> list[str]:
    """The aligned table of ``views`` (a header line first)."""
    rows = [_HEADER] + [
        (v.run_id, v.agent, _status(v), v.liveness or "-", _updated(v.updated_at, now), _detail(v))
        for v in views
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
        for r in rows
    ]


async def cmd_runs(args: argparse.Namespace) -> int:
    if args.agent is not None:
        validate_token(args.agent, "agent name")
    status = _statuses(args.status)
    liveness = _livenesses(args.liveness)
    since = None if args.since is None else time.time() - age_seconds(args.since)
    if not 1 <= args.limit <= QUERY_LIMIT_MAX:
        raise UsageError(f"--limit {args.limit}: 1 to {QUERY_LIMIT_MAX}")
    try:
        attributes = parse_attribute_filter(args.attr)
    except InvalidAttributes as e:
        raise UsageError(f"--attr: {e.message}") from None
    async with await connect_client(args) as client:
        page = await list_runs(
            client.broker,
            client.names,
            agent=args.agent,
            status=status,
            liveness=liveness,
            since=since,
            limit=args.limit,
            schedule=args.schedule,
            attributes=attributes,
        )
    if args.json:
        out(encode(list(page.runs)).decode())
        return EXIT_OK
    if not page.runs:
        filtered = args.agent or status or liveness or since or args.schedule or attributes
        out("no runs match" if filtered else "no runs yet")
        return EXIT_OK
    for line in run_lines(page.runs, time.time()):
        out(line)
    if page.next is not None:
        out(f"(more: showing the {len(page.runs)} most recently updated; raise --limit)")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", metavar="AGENT", default=None, help="only runs of this agent")
    p.add_argument(
        "--schedule", metavar="NAME", default=None, help="only runs this schedule started"
    )
    p.add_argument(
        "--status",
        metavar="STATUS",
        action="append",
        default=[],
        help="only runs with this status (repeatable): pending, running, waiting, suspended, "
        "completed, failed, cancelled",
    )
    p.add_argument(
        "--liveness",
        metavar="STATE",
        action="append",
        default=[],
        help="only runs judged so (repeatable): stalled, orphaned, overdue, wedged, ...",
    )
    p.add_argument(
        "--attr",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="only runs with this search attribute (repeatable, all must match; a value is "
        "compared by its text: vip=true, customer=42)",
    )
    p.add_argument(
        "--since",
        metavar="AGE",
        default=None,
        help="only runs updated within this long: 90s, 30m, 1h, 2d",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=50,
        help="at most this many runs (default: 50)",
    )
    add_json(p, "print a JSON array of run views")


COMMANDS = (
    Command(
        "runs",
        cmd_runs,
        "List runs: by agent, status, liveness and time, most recently updated first.",
        "sojourn runs --agent greeter --status waiting --since 1h --attr customer=42",
        detail="Asks a projector's read model (`sojourn projector`, also run by `sojourn "
        "dev`). Prints one line per run: RUN_ID  AGENT  STATUS  LIVENESS  UPDATED  STEP.",
        arguments=_arguments,
    ),
)
