"""``sojourn projector``: keep the read side (run views, change messages, SQLite model).

Also used by ``sojourn dev``, which runs a projector next to its worker (``--no-projector``
to not), its SQLite model in ``<data-dir>/runs.sqlite3``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from sojourn.broker.connection import ConnectOptions
from sojourn.broker.names import Names
from sojourn.projections.listing import ListingService
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.config import Settings

from ..ops.health import PROCESS_HEALTH, projector_check
from ..ops.metrics import track_projector
from ._args import Command, add_log_level, monitoring_options
from ._common import EXIT_OK, UsageError, configure_logging, probed_options, serve_settings, serving
from ._render import out

__all__ = ["COMMANDS", "cmd_projector", "default_sqlite_path", "running_projector"]


def default_sqlite_path(prefix: str) -> Path:
    return Path(".sojourn") / f"runs-{prefix}.sqlite3"


@contextlib.asynccontextmanager
async def running_projector(
    opts: ConnectOptions,
    settings: Settings,
    *,
    sqlite: Path | None,
    rebuild: bool = False,
) -> AsyncIterator[Projector]:
    """A started projector (with its SQLite model at ``sqlite``, if given, and the listing
    service answering from it), stopped and closed on the way out."""
    sink = None
    if sqlite is not None:
        sqlite.parent.mkdir(parents=True, exist_ok=True)
        sink = await SqliteModel.open(sqlite, events_stream=Names(settings.prefix).events_stream)
    try:
        projector = await Projector(
            nats=opts, settings=settings, sink=sink, rebuild=rebuild
        ).start()
        track_projector(projector)
        PROCESS_HEALTH.add("projector", projector_check(projector))
        # Every projector with a read model answers listings (one of them per request).
        listing = None if sink is None else ListingService(projector.broker, projector.names, sink)
        try:
            if listing is not None:
                await listing.start()
            yield projector
        finally:
            if listing is not None:
                await listing.stop()
            PROCESS_HEALTH.remove("projector")
            track_projector(projector, on=False)
            await projector.stop()
    finally:
        if sink is not None:
            await sink.close()


async def cmd_projector(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format, "sojourn-projector")
    if args.no_sqlite and args.sqlite is not None:
        raise UsageError("--sqlite and --no-sqlite contradict each other: choose one")
    settings = serve_settings(args)
    opts = await probed_options(args)
    sqlite = None
    if not args.no_sqlite:
        sqlite = Path(args.sqlite) if args.sqlite else default_sqlite_path(settings.prefix)
    async with (
        serving(args) as (stopper, phase),
        running_projector(opts, settings, sqlite=sqlite, rebuild=args.rebuild) as p,
    ):
        phase.serving()
        PROCESS_HEALTH.refresh()
        out(
            f"projecting prefix {settings.prefix} on {opts.display_url} (projector "
            f"{p.projector_id}"
            + (f", read model {sqlite}" if sqlite is not None else ", no read model")
            + (", rebuilding" if args.rebuild else "")
            + "); press Ctrl-C to stop"
        )
        await stopper.wait()
        out(f"{stopper.name} received: stopping the projector")
        phase.stopping()
        PROCESS_HEALTH.refresh()
    out("stopped")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sqlite",
        metavar="PATH",
        default=None,
        help="the SQLite read model (default: .sojourn/runs-<prefix>.sqlite3)",
    )
    p.add_argument(
        "--no-sqlite",
        action="store_true",
        help="keep only the KV views and change messages (no listings from this process)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the read models from the start of the events stream, then go on",
    )
    add_log_level(p, "info")


COMMANDS = (
    Command(
        "projector",
        cmd_projector,
        "Keep the read side: run views in KV, change messages, the SQLite model, listings.",
        "sojourn projector --nats nats://nats:4222 --sqlite /var/lib/sojourn/runs.sqlite3",
        parents=(monitoring_options,),
        detail="Follows the events stream and writes each run's view to the runs KV bucket "
        "and to <prefix>.runs.<agent>.<run_id>, and the runs and steps of every run into an "
        "SQLite file that answers `sojourn runs`. Several projectors may run: one writes the "
        "views, each keeps its own SQLite file and answers listings. Runs until Ctrl-C.",
        arguments=_arguments,
    ),
)
