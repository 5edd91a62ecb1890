"""``sojourn stream``: print a run's output stream, resumable by offset.

Text chunks go to stdout as they come, exactly as the step streamed them (no newline is
added, so the output can be piped or saved as is); progress values and "step restarted"
notices go to stderr. With ``--json`` every chunk is one JSON line on stdout with its
``offset``. Either way the command ends when the run has ended and its output is all printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TextIO

from sojourn.schemas.codec import encode
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.names import validate_token

from ..client.output import OutputChunk, read_output
from ._args import Command, add_json, add_run_id
from ._common import EXIT_OK, UsageError, connect_client, require_deployment

__all__ = ["COMMANDS", "cmd_stream"]


class _Printer:
    """Writes chunks as text: tokens on stdout, notices on stderr, each notice on its own
    line on a terminal even while stdout is in the middle of one."""

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self.stdout, self.stderr = stdout, stderr
        self.mid_line = False  # stdout's last text did not end with a newline
        self.shared = stdout.isatty() and stderr.isatty()

    def text(self, text: str) -> None:
        if text:
            self.stdout.write(text)
            self.stdout.flush()
            self.mid_line = not text.endswith("\n")

    def notice(self, line: str) -> None:
        lead = "\n" if self.shared and self.mid_line else ""
        self.stderr.write(f"{lead}{line}\n")
        self.stderr.flush()
        if lead:
            self.mid_line = False

    def chunk(self, c: OutputChunk) -> None:
        if c.restarted:
            self.notice(
                f"[step {c.chunk.position} restarted (attempt {c.chunk.attempt}): "
                "its output starts again]"
            )
        if c.kind == "text":
            self.text(c.text)
        else:
            self.notice(f"[progress {bytes(c.chunk.value).decode()}]")

    def end(self) -> None:
        if self.mid_line and self.stdout.isatty():
            self.stdout.write("\n")  # a terminal's prompt on its own line; pipes get the text
            self.stdout.flush()


def _json_line(c: OutputChunk) -> str:
    return encode(c.as_json()).decode()


async def cmd_stream(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    if args.after < 0:
        raise UsageError("--after is an offset: 0 or more")
    printer = _Printer(sys.stdout, sys.stderr)
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        if await client.store.last_seq(args.run_id) == 0:
            raise RunNotFound(f"no run with id '{args.run_id}'", run_id=args.run_id)
        reader = read_output(client.broker, client.names, args.run_id, after=args.after)
        try:
            async for c in reader:
                if args.json:
                    sys.stdout.write(_json_line(c) + "\n")
                    sys.stdout.flush()
                else:
                    printer.chunk(c)
        except asyncio.CancelledError:  # Ctrl-C: say where to pick up
            if reader.offset > args.after:
                printer.notice(
                    f"stopped after offset {reader.offset}: resume with --after {reader.offset}"
                )
            raise
        finally:
            await reader.aclose()
        if not args.json:
            printer.end()
        if reader.skipped:
            printer.notice(f"warning: {reader.skipped} undecodable chunk message(s) skipped")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    p.add_argument(
        "--after",
        metavar="OFFSET",
        type=int,
        default=0,
        help="resume after this offset (default: 0, from the start)",
    )
    add_json(p, "print each chunk as one JSON line")


COMMANDS = (
    Command(
        "stream",
        cmd_stream,
        "Print a run's output stream (ctx.stream tokens, ctx.progress), resumable by offset.",
        "sojourn stream 5f0c9e2d --after 120",
        detail="Prints the chunks after OFFSET, then new ones as they come, until the run "
        "ends. With --json each chunk is one JSON line with its offset: pass the last one "
        "to --after to resume exactly where a reader stopped.",
        arguments=_arguments,
    ),
)
