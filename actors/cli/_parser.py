"""The ``sojourn`` argument parser, assembled from the commands each command family describes
(``COMMANDS`` in ``_serve``, ``_runs``, ...; ``_args.Command``)."""

from __future__ import annotations

import argparse
from importlib import metadata

from . import (
    _archive,
    _budget,
    _concurrency,
    _fork,
    _gateway,
    _limit,
    _projector,
    _read,
    _runs,
    _schedule,
    _serve,
    _stream,
    _topology,
    _update,
    _watch,
)
from ._args import Command, Formatter

__all__ = ["build_parser"]

_FAMILIES: tuple[tuple[Command, ...], ...] = (
    _serve.COMMANDS,
    _gateway.COMMANDS,
    _projector.COMMANDS,
    _read.COMMANDS,
    _watch.COMMANDS,
    _stream.COMMANDS,
    _runs.COMMANDS,
    _fork.COMMANDS,
    _update.COMMANDS,
    _budget.COMMANDS,
    _schedule.COMMANDS,
    _limit.COMMANDS,
    _topology.COMMANDS,
    _archive.COMMANDS,
    _concurrency.COMMANDS,
)

_ORDER = (
    "dev",
    "gateway",
    "console",
    "worker",
    "watchdog",
    "projector",
    "runs",
    "watch",
    "stream",
    "start",
    "status",
    "history",
    "cancel",
    "terminate",
    "signal",
    "update",
    "resume",
    "pause",
    "unpause",
    "fork",
    "budget",
    "schedule",
    "limit",
    "queue",
    "decide",
    "replay",
    "topology",
    "schemas",
    "archive",
    "demo",
)
"""The commands in the order ``sojourn --help`` lists them: serving, reading, acting on a run,
operating a deployment."""


def _version() -> str:
    try:
        return metadata.version("sojourn")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``sojourn`` argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="sojourn",
        formatter_class=Formatter,
        description="sojourn: durable, event-sourced AI agents on NATS JetStream.",
        epilog="examples:\n"
        "  sojourn demo                                  see a crash recovered\n"
        "  sojourn dev --app examples.greeter            server + worker, locally\n"
        '  sojourn start greeter --input \'{"name": "Ada", "email": "a@b.c"}\' --wait\n\n'
        "user errors print one line and exit 1 (2 for bad arguments).",
    )
    parser.add_argument("--version", action="version", version=f"sojourn {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands = {c.name: c for family in _FAMILIES for c in family}
    if set(commands) != set(_ORDER):  # pragma: no cover - a command added to one list only
        raise AssertionError(f"_ORDER and the families differ: {set(commands) ^ set(_ORDER)}")
    for name in _ORDER:
        commands[name].add_to(sub)
    return parser
