"""The ``sojourn`` command line.

Serve agents (``dev``, ``worker``, ``watchdog``), start and inspect runs (``start``,
``status``, ``history``, ``cancel``, ``signal``, ``resume``, ``decide``), check stored
histories against the code (``replay``), export the wire schemas (``schemas``) and watch a
worker die mid-step without anything happening twice (``demo``). Run ``sojourn COMMAND --help``
for each command's options.

User errors print one line on stderr (``error: ...``) and exit non-zero, never a traceback:
1 for errors, 2 for bad arguments, 130 when interrupted.

The package: one module per command family, each describing its commands and their arguments
(``COMMANDS``): ``_serve`` (dev, worker, watchdog, demo), ``_runs`` (the commands on runs),
``_gateway``, ``_projector``, ``_schedule``... ``_parser`` assembles them into the argument
parser, ``_args`` holds what their arguments share, ``_render`` what gets printed, ``_common``
the plumbing (connecting, exit codes); ``main`` below maps exceptions to exit codes.

Example:
    $ sojourn dev --app examples.greeter
    $ sojourn start greeter --input '{"name": "Ada", "email": "ada@example.com"}' --wait
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from sojourn.broker import BROKER_ERRORS
from sojourn.schemas.errors import SojournError

from ..client.base import TriggerRejected
from ._common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Handler, UsageError
from ._parser import build_parser
from ._render import describe_event, one_line

__all__ = ["build_parser", "describe_event", "main"]


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Linux dependency
        return None
    return uvloop.new_event_loop


def _error(message: str) -> None:
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(handler(args))
    except UsageError as e:
        _error(str(e))
        return EXIT_USAGE
    except TriggerRejected as e:
        _error(f"{e.code}: {e.message.split(': ', 1)[-1]}")
        return EXIT_ERROR
    except SojournError as e:
        _error(e.message)
        return EXIT_ERROR
    except BROKER_ERRORS as e:  # what nats-py raises, behind the broker façade
        _error(f"NATS: {type(e).__name__}: {e}")
        return EXIT_ERROR
    except ValueError as e:  # a value given on the command line that the library refused
        _error(str(e))
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`sojourn ... | head -1`): like any Unix tool, stop quietly.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # keeps the interpreter's exit quiet
        return EXIT_OK
    except OSError as e:
        _error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
