"""``sojourn fork RUN --from-step N | --from-failure``: a new run whose history up to position
N is RUN's (recorded results reused), re-executed from N with the code deployed now
(decision 0041). RUN itself is only read, never changed.
"""

from __future__ import annotations

import argparse

from sojourn.schemas.names import validate_token

from ..client.forks import KEEP_INPUT
from ._args import Command, add_run_id
from ._common import (
    EXIT_OK,
    UsageError,
    cli_sender,
    connect_client,
    parse_input,
    require_deployment,
)
from ._render import out

__all__ = ["COMMANDS", "cmd_fork"]

INTAKE_WAIT = 5.0
"""Seconds ``fork`` waits for the intake's answer."""


def _position(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a position (0 or more), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a position (0 or more), got {value}")
    return value


async def cmd_fork(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    if args.fork_id is not None:
        validate_token(args.fork_id, "--run-id")
    new_input = KEEP_INPUT if args.input is None else parse_input(args.input)
    signal = None
    if args.signal is not None:
        signal = (args.signal, parse_input(args.payload, "--payload"))
    elif args.payload != "null":
        raise UsageError("--payload goes with --signal NAME")
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        receipt = await client.trigger_fork(
            args.run_id,
            from_step=args.from_step,
            from_failure=args.from_failure,
            input=new_input,
            signal=signal,
            fork_id=args.fork_id,
            sender=cli_sender(client),
            wait=True,
            timeout=INTAKE_WAIT,
        )
    out(f"run_id: {receipt.run_id}")
    out(f"forked from: {args.run_id}")
    if receipt.queued:
        out(
            "queued: no worker answered yet; the fork is stored and is made when a worker "
            "serving the agent starts"
        )
    elif receipt.created:
        out("accepted: new run")
    else:
        out("exists: a run with this id was made before (nothing new)")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-step",
        metavar="N",
        type=_position,
        default=None,
        help="the position to re-execute from, as `sojourn history` shows it (pos=N, from "
        "0); every position before it is copied with its recorded result",
    )
    where.add_argument(
        "--from-failure",
        action="store_true",
        help="re-execute from the position the run failed at",
    )
    p.add_argument(
        "--input",
        metavar="JSON",
        default=None,
        help="the fork's input (JSON or @FILE; default: the old run's)",
    )
    p.add_argument(
        "--signal",
        metavar="NAME",
        default=None,
        help="a signal the fork finds buffered when it starts",
    )
    p.add_argument(
        "--payload",
        metavar="JSON",
        default="null",
        help="the --signal's payload (JSON or @FILE; default: null)",
    )
    p.add_argument(
        "--run-id",
        dest="fork_id",
        metavar="ID",
        default=None,
        help="the fork's run id (default: RUN-fork-<8 hex>); the same id asked for twice "
        "is one fork",
    )


COMMANDS = (
    Command(
        "fork",
        cmd_fork,
        "Fork a run: a new run that reuses its history up to a step and runs on from there.",
        "sojourn fork 5f0c9e2d --from-failure",
        detail="The new run (its view and `sojourn status` say forked from RUN at pos=N) holds "
        "RUN's recorded results of every position before N and executes from N with the "
        "code deployed now. RUN is not changed; a live RUN goes on running.",
        arguments=_arguments,
    ),
)
