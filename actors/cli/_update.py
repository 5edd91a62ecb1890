"""``sojourn update RUN NAME --payload JSON``: send an update to a run and print its answer
(``client.update``; decision 0042). The same ``--id`` sent again is applied once and answered
the same. Exit 0 with the answer; 1 with the refusal (rejected, failed, unknown update, run
ended, unknown run, refused by the intake, or no answer in ``--timeout``).
"""

from __future__ import annotations

import argparse
import json

from sojourn.schemas.codec import encode
from sojourn.schemas.names import validate_signal_name, validate_token
from sojourn.schemas.updates import UpdateAnswer, UpdateRejectedError

from ._args import Command, add_json, add_json_value, add_run_id, add_seconds
from ._common import EXIT_ERROR, EXIT_OK, cli_sender, connect_client, parse_input
from ._render import out

__all__ = ["COMMANDS", "cmd_update"]


async def cmd_update(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    validate_signal_name(args.name)
    payload = parse_input(args.payload, "--payload")
    async with await connect_client(args) as client:
        try:
            got = await client.update_answer(
                args.run_id,
                args.name,
                payload,
                update_id=args.update_id,
                timeout=args.timeout,
                sender=cli_sender(client),
            )
        except UpdateRejectedError as e:
            got = UpdateAnswer(
                run_id=e.run_id or args.run_id,
                update_id=e.update_id or "",
                name=args.name,
                ok=False,
                code=e.code,
                message=e.reason,
            )
    if args.json:
        out(encode(got).decode())
    elif got.ok:
        out(json.dumps(got.answer, indent=2, ensure_ascii=False))
    else:
        out(f"update {args.name} {got.code}: {got.message} (run {got.run_id})")
    return EXIT_OK if got.ok else EXIT_ERROR


def _arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    p.add_argument("name", metavar="NAME", help="the update's name (the run's ctx.on_update)")
    add_json_value(p, "--payload", "the handler's payload (JSON or @FILE; default: null)")
    p.add_argument(
        "--id",
        dest="update_id",
        metavar="ID",
        default=None,
        help="the update id (default: a fresh one): sent again, it is applied once and "
        "answered the same",
    )
    add_seconds(p, "--timeout", "how long to wait for the answer (default: 30)", default=30.0)
    add_json(p, "print the outcome as JSON (an UpdateAnswer)")


COMMANDS = (
    Command(
        "update",
        cmd_update,
        "Send an update to a run and print its answer.",
        "sojourn update 5f0c9e2d add --payload '\"milk\"' --id add-milk",
        detail="The run decides the update at its next wait: its validator may reject it "
        "(nothing changes), else its handler applies it and the answer is recorded in the "
        "run's history, where every retry with the same --id reads it back.",
        arguments=_arguments,
    ),
)
