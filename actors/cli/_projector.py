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

from ..ops.health import PROCESS_HEALTH, Phase, projector_check
from ..ops.metrics import stop_metrics, track_projector
from ._common import (
    EXIT_OK,
    StopSignal,
    UsageError,
    configure_logging,
    options_from,
    probe,
    settings_from,
    start_metrics,
)
from ._render import out

__all__ = ["cmd_projector", "default_sqlite_path", "running_projector"]


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
    configure_logging(args.log_level)
    if args.no_sqlite and args.sqlite is not None:
        raise UsageError("--sqlite and --no-sqlite contradict each other: choose one")
    try:
        settings = settings_from(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    opts = options_from(args)
    await probe(opts)
    sqlite = None
    if not args.no_sqlite:
        sqlite = Path(args.sqlite) if args.sqlite else default_sqlite_path(settings.prefix)
    stopper = StopSignal()
    metrics_server = None
    phase = Phase()
    PROCESS_HEALTH.add("process", phase)
    try:
        metrics_server = start_metrics(args)
        async with running_projector(opts, settings, sqlite=sqlite, rebuild=args.rebuild) as p:
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
    finally:
        stopper.remove()
        PROCESS_HEALTH.remove("process")
        if metrics_server is not None:
            stop_metrics(metrics_server)
    out("stopped")
    return EXIT_OK
