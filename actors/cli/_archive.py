"""``sojourn archive``: one retention pass (ended runs older than an age leave the hot
streams), for cron or a systemd timer; the watchdog runs the same pass periodically when
``Settings.retain_ended`` is set."""

from __future__ import annotations

import argparse

from sojourn.schemas.codec import encode
from sojourn.schemas.config import ARCHIVE_POLICIES, ArchivePolicy

from ..ops.archive import Archiver, ArchiveReport
from ._args import Command, _positive_int, add_json
from ._common import EXIT_ERROR, EXIT_OK, UsageError, connect_client
from ._read import age_seconds
from ._render import out, stamp

__all__ = ["COMMANDS", "cmd_archive", "report_lines"]


def _older_than(text: str) -> int:
    try:
        return age_seconds(text)
    except UsageError:
        raise UsageError(
            f"--older-than {text!r}: a number and a unit s, m, h or d (3600s, 90m, 12h, 30d)"
        ) from None


def _policy(text: str) -> ArchivePolicy:
    for p in ARCHIVE_POLICIES:
        if text == p:
            return p
    raise UsageError(f"--policy {text!r}: one of {', '.join(ARCHIVE_POLICIES)}")


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover - the loop always returns


def report_lines(report: ArchiveReport) -> list[str]:
    """What ``sojourn archive`` prints for a pass (without ``--json``)."""
    verb = "would move" if report.dry_run else "moved"
    kept = ", ".join(f"{k} {v}" for k, v in sorted(report.skipped.items())) or "none"
    lines = [
        f"{verb} {len(report.moved)} run(s) that ended before {stamp(report.cutoff)} "
        f"(policy {report.policy}); kept {sum(report.skipped.values())} ({kept}); "
        f"{len(report.errors)} error(s)"
    ]
    if report.dry_run:
        lines += [f"  {run_id}" for run_id in sorted(report.moved)]
    else:
        lines.append(f"events stream: {_size(report.bytes_before)} -> {_size(report.bytes_after)}")
    lines += [f"  error: {run_id}: {why}" for run_id, why in sorted(report.errors.items())]
    keyed = sum(report.keyed.values())
    if keyed or report.keyed_errors:
        kinds = ", ".join(f"{k} {n}" for k, n in report.keyed.items() if n)
        lines.append(
            f"{'would remove' if report.dry_run else 'removed'} {keyed} keyed start record(s)"
            f"{f' ({kinds})' if kinds else ''}; {len(report.keyed_errors)} error(s)"
        )
        lines += [f"  error: {s}: {why}" for s, why in sorted(report.keyed_errors.items())]
    return lines


async def cmd_archive(args: argparse.Namespace) -> int:
    age = _older_than(args.older_than)
    policy = _policy(args.policy) if args.policy is not None else None
    async with await connect_client(args) as client:
        archiver = Archiver(client.broker, client.settings, retain_ended=age, policy=policy)
        report = await archiver.run_pass(limit=args.limit, dry_run=args.dry_run)
    if args.json:
        out(encode(report.to_json()).decode())
    else:
        for line in report_lines(report):
            out(line)
    return EXIT_ERROR if report.errors or report.keyed_errors else EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than",
        metavar="AGE",
        default="30d",
        help="move runs that ended at least this long ago: 3600s, 90m, 12h, 30d (default: 30d)",
    )
    p.add_argument(
        "--policy",
        metavar="POLICY",
        default=None,
        help="object_store (keep a verified copy: the default) or discard (keep nothing)",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=None,
        help="move at most this many runs, oldest end first (default: all that are due)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs that would move (and count the keyed records); change nothing",
    )
    add_json(p, "print the pass's report as JSON")


COMMANDS = (
    Command(
        "archive",
        cmd_archive,
        "Move ended runs older than an age out of the hot streams (one pass; cron-friendly).",
        "sojourn archive --older-than 30d --dry-run",
        detail="Finds ended runs in the read side's views (a projector must be running), "
        "checks each against its own history, copies the history to the object store "
        "bucket <PREFIX>_ARCHIVE, reads the copy back and compares it, then purges the run's "
        "events, wakes, timers, lease and output. `sojourn history` and `sojourn status` "
        "still read archived runs. Runs that have not ended are never touched, nor a child "
        "run whose parent has not ended. Then removes the keyed starts' records (singleton, "
        "debounce, concurrency keys) nothing needs any more and as old. Needs watchdog or "
        "admin credentials. Exits 1 if any run could not be moved (it stays hot; the next "
        "pass retries it) or a keyed record could not be judged or removed.",
        arguments=_arguments,
    ),
)
