"""A rebuild (``sojourn projector --rebuild``): every KV view checked against the fold.

The projector folds the events stream from sequence 1 (its read model reset). As leader it
writes the views past where the last leader got as usual; for the decisions before, each run's
last view is compared with its KV entry once the fold has passed that point (an ended run's at
once), and only the entries that differ are rewritten. A live run's liveness is the liveness
pass's business, not compared.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import msgspec

from sojourn.schemas.views import RunView

from .sink import Applied
from .viewstore import ViewStore

__all__ = ["Rebuild"]

log = logging.getLogger("sojourn.projector")


class Rebuild:
    """One projector's rebuild, if it was asked for one.

    Attributes:
        wanted: whether this projector rebuilds.
        until: as leader, the position of the last leader: the decisions up to it are
            checked, not written (0: none left to check).
        seconds: how long the rebuild took, once it is over (``None`` until then).
    """

    def __init__(self, store: ViewStore, wanted: bool) -> None:
        self._store = store
        self.wanted = wanted
        self.until = 0
        self.seconds: float | None = None
        self._views: dict[str, RunView] = {}
        self._started = 0.0

    def begin(self) -> None:
        self._started = time.monotonic()

    def check_to(self, position: int) -> None:
        """Taking the leadership from one that wrote up to ``position``: check what lies
        below it instead of writing it (while this rebuild is not over)."""
        if self.wanted and self.seconds is None:
            self.until = position

    async def check(self, batch: Sequence[Applied]) -> None:
        """For decisions up to where the last leader got: keep each run's last view, check
        an ended run's at once and the others' once the fold has passed that point."""
        for a in batch:
            if a.seq <= self.until:
                self._views[a.view.run_id] = a.view
            else:
                self._views.pop(a.view.run_id, None)  # written anew
        await self._verify([v for v in self._views.values() if v.liveness == "ended"])
        if batch[-1].seq >= self.until:
            await self._verify(list(self._views.values()))
            self.until = 0
            self.done()

    def caught_up(self) -> None:
        """The fold has caught up: a rebuild is over (for a leader, once it has checked
        every KV view up to where the last leader got)."""
        if not self.until:
            self.done()

    def done(self) -> None:
        if self.wanted and self.seconds is None:
            self.seconds = time.monotonic() - self._started
            log.info("projector: rebuilt in %.1fs", self.seconds)

    async def _verify(self, views: list[RunView]) -> None:
        """Rewrite the KV entries that differ from the views recomputed from the history."""
        if not views:
            return
        for v in views:
            self._views.pop(v.run_id, None)
        store = self._store
        entries = await store.gather([store.read_entry(v.run_id) for v in views])
        fix = []
        for v, entry in zip(views, entries, strict=True):
            store.entries[v.run_id] = entry
            cur = entry.view
            if cur is not None and v.liveness != "ended":
                cur = msgspec.structs.replace(cur, liveness=v.liveness)
            if cur != v:
                fix.append(v)
        if fix:
            log.info("projector: rebuild rewrites %d views", len(fix))
        await store.gather([store.put(v, only_newer=False) for v in fix])
        for v in views:
            if v.liveness == "ended":
                store.entries.pop(v.run_id, None)
