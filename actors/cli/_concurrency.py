"""Concurrency keys on the command line (decision 0048): ``sojourn start``'s
``--concurrency-key`` and ``--concurrency-limit``, and ``sojourn queue`` (a key's slots and
queue)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import msgspec

from sojourn.schemas.concurrency import LIMIT_MAX, ConcurrencyBody, concurrency_fault
from sojourn.schemas.flow import key_fault
from sojourn.schemas.names import validate_token

from ._args import Command, add_json
from ._common import EXIT_OK, UsageError, connect_client
from ._render import out, stamp

__all__ = ["COMMANDS", "add_concurrency_arguments", "cmd_queue", "concurrency_options"]


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if not 1 <= n <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"a concurrency limit is from 1 to {LIMIT_MAX}")
    return n


def add_concurrency_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("concurrency keys (at most N live runs per key)")
    g.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="count the run against KEY's limit for this agent: beyond it, the run is queued "
        "(pending) until a run of the key ends",
    )
    g.add_argument(
        "--concurrency-limit",
        metavar="N",
        type=_limit,
        help=f"the most live runs of --concurrency-key at once (1 to {LIMIT_MAX})",
    )


def concurrency_options(args: argparse.Namespace) -> dict[str, Any]:
    """``{"concurrency": {...}}`` for ``Client.trigger`` (empty without the flags).

    Raises:
        UsageError: one flag without the other, a bad key, or with a keyed start.
    """
    key, limit = args.concurrency_key, args.concurrency_limit
    if key is None and limit is None:
        return {}
    if key is None or limit is None:
        raise UsageError("--concurrency-key and --concurrency-limit go together")
    why = concurrency_fault(ConcurrencyBody(key=key, limit=limit))
    if why is not None:
        raise UsageError(f"--concurrency-key: {why}")
    if getattr(args, "singleton_key", None) is not None or getattr(args, "debounce", None):
        raise UsageError("a singleton or debounced start takes no --concurrency-key")
    return {"concurrency": {"key": key, "limit": limit}}


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("key", metavar="KEY", help="the concurrency key")
    p.add_argument("--agent", required=True, help="the agent whose runs use the key")
    p.add_argument(
        "--first",
        type=int,
        default=20,
        metavar="N",
        help="list the N runs queued first (default 20, at most 1000)",
    )
    add_json(p, "the key's slots and queue")


async def cmd_queue(args: argparse.Namespace) -> int:
    validate_token(args.agent, "agent name")
    why = key_fault(args.key)
    if why is not None:
        raise UsageError(why)
    if not 0 <= args.first <= 1000:
        raise UsageError("--first is from 0 to 1000")
    async with await connect_client(args) as client:
        listing = await client.queue(args.agent, args.key, first=args.first)
    if args.json:
        out(msgspec.json.encode(listing).decode())
        return EXIT_OK
    limit = "-" if listing.limit is None else str(listing.limit)
    out(
        f"key {listing.key!r} of {listing.agent}: {len(listing.holders)} of {limit} slots held, "
        f"{listing.depth} queued"
    )
    now = time.time()
    for h in listing.holders:
        out(f"  holds   {h.run_id}  since {stamp(h.since)} ({now - h.since:.0f}s)")
    for q in listing.queued:
        waited = now - q.queued_at
        out(f"  {q.position:>5}   {q.run_id}  queued {stamp(q.queued_at)} ({waited:.0f}s)")
    if listing.depth > len(listing.queued):
        out(f"  ... and {listing.depth - len(listing.queued)} more")
    return EXIT_OK


COMMANDS = (
    Command(
        "queue",
        cmd_queue,
        "Show a concurrency key's slots and queue: who holds them, who waits, in order.",
        "sojourn queue tenant-42 --agent sync",
        detail="A start with a concurrency key (sojourn start --concurrency-key K "
        "--concurrency-limit N, or an agent's Concurrency) runs while fewer than N runs of the "
        "key are live, and is queued (pending) otherwise; the oldest queued run takes the next "
        "slot that frees (decision 0048).",
        arguments=_arguments,
    ),
)
