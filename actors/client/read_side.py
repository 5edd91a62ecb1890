"""The read side of runs, kept by a projector: a run's view (``view``), listings (``runs``),
following a run's views until it ends (``watch``); and a run's output stream (``stream``), read
from the output stream itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from datetime import timedelta
from typing import Any

import msgspec

from sojourn.schemas.codec import decode_run_steps
from sojourn.schemas.names import validate_token
from sojourn.schemas.steps import RunSteps
from sojourn.schemas.views import RunsPage, RunView

from ..history.chain import current_run
from .base import ClientBase
from .listing import list_runs
from .output import OutputReader, read_output
from .watching import read_view, watch_run

__all__ = ["ReadSide"]


class ReadSide(ClientBase):
    """``Client``'s read side: ``view``, ``steps``, ``runs``, ``watch``, ``stream``."""

    async def view(self, run_id: str) -> RunView | None:
        """The run's view in the runs bucket (``schemas.views.RunView``: status, liveness, what
        it waits for, its step, spend and budget...) as the projector last wrote it; ``None``
        when there is none (no projector runs, or the run is unknown to it)."""
        validate_token(run_id, "run_id")
        return await read_view(self.broker, self.names, run_id)

    async def steps(self, run_id: str) -> RunSteps | None:
        """The run's step list and spend (``schemas.steps.RunSteps``: the latest
        ``STEPS_KEPT`` steps with their timings, attempts, retries, last error, outcome and
        any in-doubt decision; ``steps_total`` counts them all; what it used of every budget
        kind and the limit) as the projector last wrote it; ``None`` when there is none (no
        projector runs, the run is unknown to it, or the stored bytes are not a record of
        this run)."""
        validate_token(run_id, "run_id")
        m = await self.broker.direct_get_last(
            self.names.runs_kv_stream, self.names.run_steps_key(run_id)
        )
        if m is None:
            return None
        try:
            record = decode_run_steps(m.data)
        except msgspec.MsgspecError:
            return None
        return record if record.run_id == run_id else None

    async def runs(
        self,
        *,
        agent: str | None = None,
        status: str | Iterable[str] = (),
        liveness: str | Iterable[str] = (),
        since: float | timedelta | None = None,
        parent_run_id: str | None = None,
        schedule: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int = 100,
        after: str | None = None,
        timeout: float = 5.0,
    ) -> RunsPage:
        """One page of runs matching every filter given, most recently updated first, from a
        projector's read model. ``status`` and ``liveness`` take one value or several (any of
        them); ``since`` is a unix time or a ``timedelta`` (updated within it); ``attributes``
        the search attributes every run listed has (``{"customer": 42}``). More pages:
        pass the answer's ``next`` as ``after``.

        Raises:
            InvalidName / ValueError: a filter is not valid.
            SojournError: no projector answers (start ``sojourn projector`` or ``sojourn
                dev``), or it refused the query.
        """
        if isinstance(since, timedelta):
            since = time.time() - since.total_seconds()
        return await list_runs(
            self.broker,
            self.names,
            agent=agent,
            status=_values(status),  # type: ignore[arg-type]  # validated by list_runs
            liveness=_values(liveness),  # type: ignore[arg-type]
            since=since,
            parent_run_id=parent_run_id,
            schedule=schedule,
            attributes=attributes,
            limit=limit,
            after=after,
            timeout=timeout,
        )

    def watch(self, run_id: str, *, timeout: float | None = None) -> AsyncGenerator[RunView, None]:
        """Every view of the run, in order, until it ends (the terminal view is the last): the
        views already stored first, then each new one as the projector writes it. Needs a
        running projector. Use ``contextlib.aclosing`` to stop early. A run that continued as
        new is followed: after its end come the views of its chain's next run (``run_id`` of
        each view says which), until the chain's last run ends.

        Raises (while iterating):
            RunNotFound: nothing is known of the run, or its start was refused.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        validate_token(run_id, "run_id")
        return self._watch_chain(run_id, timeout)

    async def _watch_chain(
        self, run_id: str, timeout: float | None
    ) -> AsyncGenerator[RunView, None]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(deadline - loop.time(), 0.001)
            last: RunView | None = None
            async with contextlib.aclosing(
                watch_run(self.broker, self.names, run_id, timeout=left)
            ) as views:
                async for view in views:
                    last = view
                    yield view
            if last is None or last.status != "completed":
                return
            nxt, _ = await current_run(self.broker, self.names, run_id)
            if nxt == run_id:
                return
            run_id = nxt

    def stream(
        self, run_id: str, *, after: int = 0, follow: bool = True, timeout: float | None = None
    ) -> OutputReader:
        """The run's output chunks (``ctx.stream``, ``ctx.progress``) after offset ``after``,
        then new ones until the run ends (``follow``). Each ``OutputChunk`` has its ``offset``:
        keep the last one to resume exactly there after a disconnect, hours later.

        Example:
            >>> async with client.stream(run_id, after=last) as chunks:  # doctest: +SKIP
            ...     async for c in chunks:
            ...         print(c.text, end="")
            ...         last = c.offset
        """
        validate_token(run_id, "run_id")
        return read_output(
            self.broker, self.names, run_id, after=after, follow=follow, timeout=timeout
        )


def _values(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)
