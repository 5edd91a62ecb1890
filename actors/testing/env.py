"""``SojournEnv``: a whole deployment for one test, started and always torn down.

A test of an agent needs a JetStream server, a worker serving the agent and a client to start
runs and read them. ``SojournEnv`` starts all three as one async context manager and stops
them on every way out of the block, an exception, a cancellation and ``KeyboardInterrupt``
included::

    from sojourn.actors.testing import SojournEnv

    async def test_greeter() -> None:
        async with SojournEnv([greeter]) as env:
            run_id = await env.start(greeter, Greeting(name="Ada"))
            assert await env.result(run_id, type=str) == "Hello, Ada!"
            assert (await env.state(run_id)).status == "completed"

Without ``server`` the environment starts a nats-server of its own on a free port, with its
store in a fresh temporary directory, and removes both on exit. Given a running server (an
``EmbeddedServer`` or a URL), it uses that and leaves it running: the pytest plugin
(``sojourn.actors.testing.plugin``) shares one server per test process this way. Either way
the environment has a deployment prefix of its own (``Settings.prefix``), so environments
sharing a server never see each other's runs.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Self, TypeVar, overload

from sojourn.broker import EmbeddedServer
from sojourn.broker.tasks import cancel_and_wait
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import Carried, RunEvent, WaitStarted
from sojourn.schemas.vocabulary import BudgetLimit

from ..agents.agent import Agent
from ..client.client import Client
from ..core.limits import chain_spending, spent
from ..core.state import RunState, fold
from ..worker.worker import Worker
from .clock import VirtualClock
from .explorer import Exploration, Seam, explore
from .skipper import QUIET_WITHIN, TimeSkipper

__all__ = ["STOP_GRACE", "SojournEnv"]

T = TypeVar("T")

STOP_GRACE: Final = 2.0
"""Seconds the worker gives activations still running at the end of a test before it cancels
them (``Worker.stop``'s ``grace``): a test is over, nothing waits for them."""

LEASE_TTL: Final = 3.0
"""The default settings' ``lease_ttl`` (30 s in production): a message a crashed worker held
unacknowledged (a start it had not stored yet) is delivered again within seconds."""

TEMP_PREFIX: Final = "sojourn-env-"
"""The name prefix of an environment's temporary store directory."""


class SojournEnv:
    """A nats-server, a ``Worker`` serving ``agents`` and a connected ``Client``, for a test.

    Use it as ``async with SojournEnv(agents) as env:``; the attributes are set inside the
    block only.

    Args:
        agents: the agents the worker serves.
        settings: the deployment settings of the worker and the client; default: a fresh
            ``Settings`` with a prefix of its own (``t`` and ten hex digits) and a
            ``lease_ttl`` of ``LEASE_TTL`` seconds.
        server: a running server to use instead of starting one: an ``EmbeddedServer``, or the
            URL of any nats-server with JetStream. The environment does not stop it.
        virtual_time: the runs' clock is a ``VirtualClock`` (the default): ``result`` and
            ``skipping`` jump it to the next deadline whenever every run waits on time, and
            ``advance`` moves it by hand. ``False``: the real clock.
        start_time: where the virtual clock starts (default: now); it may only be ahead.

    Attributes:
        settings: the settings in use.
        clock: the runs' ``VirtualClock`` (``None`` with ``virtual_time=False``).
    """

    def __init__(
        self,
        agents: Sequence[Agent[Any, Any]],
        *,
        settings: Settings | None = None,
        server: EmbeddedServer | str | None = None,
        virtual_time: bool = True,
        start_time: datetime | None = None,
    ) -> None:
        self.clock: VirtualClock | None = None
        if virtual_time:
            self.clock = VirtualClock(None if start_time is None else start_time.timestamp())
        elif start_time is not None:
            raise ValueError("start_time needs virtual_time")
        self._skipper: TimeSkipper | None = None
        self._dead: list[Worker] = []
        """Workers the crash explorer killed."""
        self._pump: asyncio.Task[None] | None = None
        self.agents: tuple[Agent[Any, Any], ...] = tuple(agents)
        self.settings: Settings = settings or Settings(
            prefix=f"t{uuid.uuid4().hex[:10]}", lease_ttl=LEASE_TTL
        )
        self._shared = server
        self._own: EmbeddedServer | None = None
        self._tmp: Path | None = None
        self._url: str | None = None
        self._worker: Worker | None = None
        self._client: Client | None = None

    # -- what a test uses ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server's client URL."""
        if self._url is None:
            raise RuntimeError("SojournEnv is not entered: use `async with SojournEnv(...)`")
        return self._url

    @property
    def server(self) -> EmbeddedServer | None:
        """The server the environment started (``None`` when it uses a given one)."""
        return self._own

    @property
    def store_dir(self) -> Path | None:
        """The temporary directory of the environment's own server (``None`` when it uses a
        given server); removed on exit."""
        return self._tmp

    @property
    def worker(self) -> Worker:
        """The worker serving the agents."""
        if self._worker is None:
            raise RuntimeError("SojournEnv is not entered: use `async with SojournEnv(...)`")
        return self._worker

    @property
    def client(self) -> Client:
        """A client of the environment's deployment, for anything the shortcuts below lack."""
        if self._client is None:
            raise RuntimeError("SojournEnv is not entered: use `async with SojournEnv(...)`")
        return self._client

    async def start(
        self, agent: Agent[Any, Any] | str, input: Any = None, run_id: str | None = None
    ) -> str:
        """Start a run of ``agent`` (an agent or its name) and return its run id once the
        worker's intake has created it.

        Raises:
            TriggerRejected: the intake refused it (an agent no worker here serves, an input
                that does not decode, ...).
        """
        name = agent.name if isinstance(agent, Agent) else agent
        return await self.client.start(name, input, wait=True, run_id=run_id)

    @overload
    async def result(self, run_id: str, timeout: float = 30.0) -> Any: ...

    @overload
    async def result(self, run_id: str, timeout: float = 30.0, *, type: type[T]) -> T: ...

    async def result(self, run_id: str, timeout: float = 30.0, type: Any = None) -> Any:
        """Wait for the run to end and return its output, decoded as ``type`` if given. Under
        virtual time, time skips meanwhile (``skipping``); ``timeout`` is real seconds.

        Raises:
            RunFailedError / RunCancelledError: the run ended without output.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        if type is None:
            return await self.skipping(self.client.result(run_id, timeout=timeout))
        return await self.skipping(self.client.result(run_id, timeout=timeout, type=type))

    # -- time ------------------------------------------------------------------------------

    def now(self) -> datetime:
        """Now on the runs' clock (UTC): what ``ctx.now()`` would record."""
        t = self.clock.now() if self.clock is not None else datetime.now(UTC).timestamp()
        return datetime.fromtimestamp(t, UTC)

    async def advance(self, by: timedelta | float) -> None:
        """Move virtual time ``by`` ahead (a ``timedelta`` or seconds), one deadline at a
        time: each timer on the way fires, and what it starts runs until the deployment is
        quiet, before the next one; returns when all is quiet at the new time.

        Raises:
            TimeoutError: at a time on the way, not quiet within ``QUIET_WITHIN`` (60) real
                seconds (it names what is busy).
        """
        await self._skip().advance(by.total_seconds() if isinstance(by, timedelta) else by)

    async def skipping(self, work: Awaitable[T]) -> T:
        """Await ``work`` (a result, a condition of the test's), jumping virtual time to the
        next deadline whenever every run waits on time meanwhile. With real time, ``work``
        as it is."""
        if self.clock is None:
            return await work
        return await self._skip().until(work)

    async def settle(self, timeout: float = QUIET_WITHIN) -> None:
        """Wait until the deployment is quiet: no run executing but on time, no message
        waiting, nothing new stored (time does not skip). With real time: nothing to wait
        on, returns at once.

        Raises:
            TimeoutError: not quiet within ``timeout`` real seconds (it names what is busy).
        """
        if self.clock is not None:
            await self._skip().quiet(within=timeout)

    def _skip(self) -> TimeSkipper:
        if self._skipper is None:
            raise RuntimeError(
                "virtual time is off (SojournEnv(virtual_time=False)), or the "
                "environment is not entered"
            )
        return self._skipper

    # -- crashes ---------------------------------------------------------------------------

    async def explore_crashes(
        self,
        agent: Agent[Any, Any] | str,
        input: Any = None,
        *,
        signals: Mapping[str, Any] | None = None,
        effects: Callable[[], Mapping[str, int]] | None = None,
        seams: Callable[[Seam], bool] | None = None,
        timeout: float = 60.0,
    ) -> Exploration:
        """Run ``agent`` on ``input`` once cleanly, then once for each seam occurrence it
        passed, its worker killed exactly there (as a SIGKILL would) and the run resumed on
        a fresh worker; check that each ends like the clean run, runs each step's body at
        most once per idempotency key (twice for the one a crash hit between its effect and
        its record) and leaves the counts ``effects()`` returns as the clean run did.

        ``signals``: sent to a run (as ``name: payload``) whenever it waits on them, in every
        run alike (an approval is the signal ``approval.<name>``). ``seams``: which seam
        occurrences to crash at (default: all). ``timeout``: real seconds per run.

        Raises:
            CrashExplorationFailed: a crashed run ended otherwise, or repeated an effect; it
                names the seam, the step and its position, and shows the run's history.
            TimeoutError: a run did not end within ``timeout``.
        """
        return await explore(
            self, agent, input, signals=signals, effects=effects, seams=seams, timeout=timeout
        )

    async def _replace_worker(self, dead: Worker) -> None:
        """A fresh worker in the place of ``dead`` (killed by the crash explorer)."""
        if self._worker is not dead:
            return
        self._dead.append(dead)
        fresh = Worker(self.agents, nats=self.url, settings=self.settings, clock=self.clock)
        await fresh.start()
        self._worker = fresh

    async def history(self, run_id: str) -> list[RunEvent]:
        """The run's events, oldest first (the stored decisions flattened; empty if the run
        does not exist)."""
        return [e for d in await self.client.history(run_id) for e in d.events]

    async def state(self, run_id: str) -> RunState:
        """The run's current state: the fold of its history.

        Raises:
            RunNotFound: no such run.
        """
        events = await self.history(run_id)
        if not events:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        return fold(events)

    async def spend(self, run_id: str) -> dict[BudgetLimit, float]:
        """What the run (with its continue-as-new chain's earlier runs) has used of each budget
        kind: ``usd``, ``tokens``, ``input_tokens``, ``output_tokens``, ``steps``,
        ``tool_calls``, ``polls``, ``wall_seconds`` (on the runs' clock, to its end or now).

        Raises:
            RunNotFound: no such run.
        """
        events = await self.history(run_id)
        if not events:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
        polls = sum(isinstance(e, WaitStarted) and e.key == "poll" for e in events)
        state = fold(events)
        now = self.clock.now() if self.clock is not None else time.time()
        return spent(chain_spending(state, Carried(), polls), state.ended_at or now)

    async def signal(self, run_id: str, name: str, payload: Any = None, **options: Any) -> str:
        """Send the signal ``name`` to the run and return its signal id: ``Client.signal``,
        whose options (``signal_id``, ``wait``, ``timeout``) it passes on (buffered until the
        run waits for it; ``wait=True`` waits until the intake recorded it and raises
        ``TriggerRejected`` if it refused it)."""
        return await self.client.signal(run_id, name, payload, **options)

    # -- lifetime --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._url is not None:
            raise RuntimeError("SojournEnv is already entered; it is not reentrant")
        try:
            self._url = await self._server_url()
            self._worker = Worker(
                self.agents, nats=self._url, settings=self.settings, clock=self.clock
            )
            await self._worker.start()
            self._client = await Client.connect(self._url, settings=self.settings)
            if self.clock is not None:
                self._skipper = TimeSkipper(
                    self.clock, self._client.broker, self._client.names, lambda: self.worker
                )
                self._pump = asyncio.create_task(self._skipper.pump(), name="sojourn-env-time")
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client, stop the worker, stop the environment's own server and remove its
        directory. Each step runs even when one before it failed or was cancelled (the first
        such error is raised after the rest ran); safe to call twice."""
        client, worker, own, tmp = self._client, self._worker, self._own, self._tmp
        pump, self._pump, self._skipper = self._pump, None, None
        self._client = self._worker = self._own = None
        self._tmp = self._url = None
        await cancel_and_wait(pump, STOP_GRACE)
        try:
            try:
                if client is not None:
                    await client.close()
            finally:
                try:
                    if worker is not None:
                        await worker.stop(grace=STOP_GRACE)
                finally:
                    if own is not None:
                        try:
                            await own.stop()
                        finally:
                            # A no-op after a clean stop; a SIGKILL when a cancellation cut
                            # stop() short, so no server outlives the environment.
                            own.kill()
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    async def _server_url(self) -> str:
        shared = self._shared
        if isinstance(shared, str):
            return shared
        if shared is not None:
            if not shared.running:
                raise RuntimeError(f"the given server is not running: {shared!r}")
            return shared.url
        self._tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        own = EmbeddedServer(store_dir=self._tmp, port=0)
        self._own = own
        await own.start()  # a start that fails kills its half-started server itself
        return own.url
