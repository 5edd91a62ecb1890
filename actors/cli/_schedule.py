"""``sojourn schedule``: recurring runs kept by the broker (add, list, pause, resume, trigger,
delete). Every change goes through the intake like a start, so it is validated, answered and,
when refused, dead-lettered; ``list`` reads the broker directly and needs no worker."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.schedules import CATCH_UPS, OVERLAPS, ScheduleRecord

from ..client.client import Client
from ..client.schedules import schedule_spec
from ._args import Command, add_json, add_json_value, connection_options
from ._budget import add_budget_arguments, budget_from_args
from ._common import EXIT_ERROR, EXIT_OK, UsageError, cli_sender, connect_client, parse_input
from ._render import out, stamp

__all__ = ["COMMANDS", "cmd_schedule"]

_Formatter = argparse.RawDescriptionHelpFormatter


def _arguments(p: argparse.ArgumentParser) -> None:
    """The ``schedule`` command's subcommands, on its parser ``p``; each takes the connection
    options."""
    common = connection_options()
    sub = p.add_subparsers(dest="schedule_command", metavar="ACTION", required=True)

    add = sub.add_parser(
        "add",
        help="create a schedule (or --replace one)",
        description="Create a schedule: a run of AGENT at every fire time, kept by the broker.",
        epilog="examples:\n"
        "  sojourn schedule add hourly-report --agent report --cron '0 * * * *' "
        "--timezone Europe/Berlin\n"
        "  sojourn schedule add sync --agent crm_sync --every 10m --input '{\"full\": false}'\n\n"
        "--cron takes 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds "
        "first), matched against the wall clock of --timezone. --every is elapsed time (10s, "
        "15m, 1h30m, 2d), anchored on the Unix epoch. Each fire starts one run, named "
        "NAME-at<YYYYMMDDTHHMMSS>Z.",
        formatter_class=_Formatter,
        parents=[common],
    )
    add.add_argument("name", metavar="NAME", help="the schedule's name (A-Z a-z 0-9 _ -)")
    add.add_argument("--agent", required=True, help="the agent each fire starts")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a cron expression (5 or 6 fields)")
    when.add_argument("--every", metavar="DURATION", help="an interval: 10s, 15m, 1h30m, 2d")
    add_json_value(add, "--input", "each run's input as JSON, or @FILE")
    add.add_argument(
        "--timezone", metavar="TZ", default="UTC", help="IANA zone of --cron (default: UTC)"
    )
    add.add_argument(
        "--overlap",
        choices=OVERLAPS,
        default="skip",
        help="while the previous run is live: skip the fire (default), allow another run, or "
        "cancel-previous",
    )
    add.add_argument(
        "--catch-up",
        choices=CATCH_UPS,
        default="latest",
        help="fires missed while the broker or every worker was down: one run for the latest "
        "(default), none, or all (at most 100)",
    )
    add.add_argument(
        "--jitter",
        metavar="S",
        type=float,
        default=0.0,
        help="delay each fire by up to S seconds (the same for the same fire)",
    )
    add.add_argument(
        "--replace", action="store_true", help="replace an existing schedule of this name"
    )
    add_budget_arguments(add, "for each run, replacing the agent's own")
    add_json(add, "print the stored record as JSON")

    ls = sub.add_parser(
        "list",
        help="every schedule: next fire, last run and its status, paused or not",
        description="List the deployment's schedules (read from the broker; no worker needed).",
        parents=[common],
    )
    add_json(ls, "one JSON object per line")

    for action, text in (
        ("pause", "stop a schedule's fires; the schedule is kept"),
        ("resume", "fire a paused schedule again, from its next fire time"),
        ("trigger", "fire a schedule now (its overlap policy applies)"),
        ("delete", "remove a schedule and everything the broker keeps of it"),
    ):
        q = sub.add_parser(
            action, help=text, description=text[0].upper() + text[1:] + ".", parents=[common]
        )
        q.add_argument("name", metavar="NAME", help="the schedule's name")
        q.add_argument(
            "--timeout",
            metavar="S",
            type=float,
            default=10.0,
            help="seconds to wait for a worker's answer (default: 10)",
        )


def _when(record: ScheduleRecord) -> str:
    spec = record.spec
    if spec.cron is not None:
        return f"cron {spec.cron!r}" + (f" {spec.timezone}" if spec.timezone != "UTC" else "")
    return f"every {spec.every}s"


async def _last_status(client: Client, record: ScheduleRecord) -> str | None:
    if record.last_run_id is None:
        return None
    try:
        return await client.status(record.last_run_id)
    except RunNotFound:
        return "gone"


def _as_json(record: ScheduleRecord, last_status: str | None) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(msgspec.json.encode(record))
    body["last_run_status"] = last_status
    body["next_fire"] = None if record.next_fire_at is None else stamp(record.next_fire_at)
    return body


def _add_options(args: argparse.Namespace) -> dict[str, Any]:
    """``add``'s options as ``Client.add_schedule`` takes them."""
    return {
        "agent": args.agent,
        "cron": args.cron,
        "every": args.every,
        "input": parse_input(args.input),
        "timezone": args.timezone,
        "overlap": args.overlap,
        "catch_up": args.catch_up,
        "jitter": args.jitter,
        "budget": budget_from_args(args),
    }


async def cmd_schedule(args: argparse.Namespace) -> int:
    action = args.schedule_command
    if action == "add":
        schedule_spec(args.name, **_add_options(args))  # say what is wrong before connecting
    async with await connect_client(args) as client:
        by = cli_sender(client)
        if action == "list":
            return await _list(client, args)
        if action == "add":
            record = await client.add_schedule(
                args.name, **_add_options(args), replace=args.replace, by=by
            )
            if args.json:
                out(json.dumps(_as_json(record, None)))
            else:
                nxt = stamp(record.next_fire_at)
                out(f"schedule {record.name}: {_when(record)}, next fire {nxt}")
            return EXIT_OK
        name = args.name
        if action == "pause":
            record = await client.pause_schedule(name, timeout=args.timeout, by=by)
            out(f"schedule {name}: paused")
        elif action == "resume":
            record = await client.resume_schedule(name, timeout=args.timeout, by=by)
            out(f"schedule {name}: resumed, next fire {stamp(record.next_fire_at)}")
        elif action == "trigger":
            answer = await client.trigger_schedule(name, timeout=args.timeout, by=by)
            if answer.outcome == "started":
                out(f"schedule {name}: started run {answer.run_id}")
            else:
                out(f"schedule {name}: skipped (its previous run is still live; --overlap skip)")
        elif action == "delete":
            if not await client.delete_schedule(name, timeout=args.timeout, by=by):
                raise UsageError(f"there is no schedule named {name!r}")
            out(f"schedule {name}: deleted")
        else:  # pragma: no cover - argparse allows only the above
            return EXIT_ERROR
    return EXIT_OK


async def _list(client: Client, args: argparse.Namespace) -> int:
    records = await client.schedules()
    if args.json:
        for r in records:
            out(json.dumps(_as_json(r, await _last_status(client, r))))
        return EXIT_OK
    if not records:
        out("no schedules")
        return EXIT_OK
    rows = [("NAME", "AGENT", "WHEN", "NEXT FIRE", "LAST RUN", "STATUS", "STARTED/SKIPPED/MISSED")]
    for r in records:
        c = r.counts
        rows.append(
            (
                r.name,
                r.spec.agent,
                _when(r),
                "paused" if r.paused else stamp(r.next_fire_at),
                r.last_run_id or "-",
                await _last_status(client, r) or "-",
                f"{c.started}/{c.skipped}/{c.missed}" + (f" failed {c.failed}" if c.failed else ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return EXIT_OK


COMMANDS = (
    Command(
        "schedule",
        cmd_schedule,
        "Recurring runs kept by the broker: add, list, pause, resume, trigger, delete.",
        "sojourn schedule add hourly-report --agent report --cron '0 * * * *'",
        detail="A schedule starts a run of its agent at every fire time, exactly once per fire "
        "(the run id derives from the fire time), with no process needed for the fire itself. "
        "`sojourn schedule ACTION --help` for each action.",
        connects=False,  # each action takes the connection options
        arguments=_arguments,
    ),
)
