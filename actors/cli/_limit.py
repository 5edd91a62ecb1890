"""``sojourn limit``: the shared rate limits (decision 0046). ``sojourn limit`` lists them,
``sojourn limit NAME`` shows one, ``--requests``/``--tokens``/``--burst`` set its rates,
``--block SECONDS`` and ``--unblock`` stop and restart its grants."""

from __future__ import annotations

import argparse
import json
import time

import msgspec

from sojourn.schemas.errors import UnknownLimit
from sojourn.schemas.limits import NS, Limit, LimitRecord, parse_rate

from ._args import Command, add_json
from ._common import EXIT_OK, UsageError, cli_sender, connect_client
from ._render import out, stamp

__all__ = ["COMMANDS", "cmd_limit"]


def _rate(text: str) -> str:
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 3600 seconds")
    return value


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?", help="the limit (none: list them all)")
    p.add_argument("--requests", metavar="RATE", type=_rate, help="e.g. 500/min, 10/s")
    p.add_argument("--tokens", metavar="RATE", type=_rate, help="e.g. 200k/min")
    p.add_argument(
        "--burst", metavar="N", type=int, default=1, help="requests that may start at once (1)"
    )
    change = p.add_mutually_exclusive_group()
    change.add_argument(
        "--block", metavar="SECONDS", type=_seconds, help="grant no slot for SECONDS"
    )
    change.add_argument("--unblock", action="store_true", help="lift a block")
    add_json(p, "the record(s) as JSON")


async def cmd_limit(args: argparse.Namespace) -> int:
    setting = args.requests is not None or args.tokens is not None
    if args.name is None and (setting or args.block is not None or args.unblock):
        raise UsageError("name the limit to change: `sojourn limit NAME --requests 500/min`")
    if setting and (args.block is not None or args.unblock):
        raise UsageError("set the rates, or block, or unblock: one at a time")
    if not setting and args.burst != 1:
        raise UsageError("--burst goes with --requests")
    async with await connect_client(args) as client:
        if args.name is None:
            records = await client.limits()
            if args.json:
                out(json.dumps([msgspec.to_builtins(r) for r in records]))
            elif not records:
                out("no shared limit is declared")
            for r in [] if args.json else records:
                out(_line(r))
            return EXIT_OK
        by = cli_sender(client)
        if setting:
            try:
                limit = Limit(requests=args.requests, tokens=args.tokens, burst=args.burst)
            except ValueError as e:
                raise UsageError(str(e)) from None
            record: LimitRecord | None = await client.set_limit(args.name, limit, by=by)
        elif args.block is not None:
            record = await client.block_limit(args.name, args.block, by=by)
        elif args.unblock:
            record = await client.unblock_limit(args.name, by=by)
        else:
            record = await client.limit(args.name)
            if record is None:
                raise UnknownLimit(f"no limit {args.name!r} is declared")
    assert record is not None
    out(json.dumps(msgspec.to_builtins(record)) if args.json else _line(record))
    return EXIT_OK


def _line(r: LimitRecord) -> str:
    rates = [f"{x} requests" for x in (r.limit.requests,) if x]
    rates += [f"{x} tokens" for x in (r.limit.tokens,) if x]
    burst = f", burst {r.limit.burst}" if r.limit.burst > 1 else ""
    blocked = r.blocked_until / NS
    block = f"; blocked until {stamp(blocked)}" if blocked > time.time() else ""
    who = "declared by" if r.declared else "set by"
    return (
        f"{r.name}  {', '.join(rates)}{burst}  granted {r.granted}, blocks {r.blocks}"
        f"{block}  ({who} {r.set_by or '-'}, {stamp(r.updated_at)})"
    )


COMMANDS = (
    Command(
        "limit",
        cmd_limit,
        "List, show, set or block the shared rate limits steps and model requests use.",
        "sojourn limit openai --requests 500/min --tokens 200k/min",
        detail="A limit is declared in code (Agent(limits=...), Worker(limits=...)) and used "
        "by steps and model requests that name it (@step(limit=...), ctx.llm(..., limit=...)): "
        "every worker of the deployment takes its slots from the one record the broker keeps. "
        "Setting the rates here overrules every declaration; --block stops all grants for a "
        "while, as a provider's 429 does. Changes need the admin role where the deployment "
        "authenticates.",
        arguments=_arguments,
    ),
)
