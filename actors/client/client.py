"""The Python client: start runs, await results, read status and history, cancel.

``Client`` is put together from one part per concept, each a mixin in a module of its own on
``ClientBase`` (``base.py``: the connection, who it sends as, publishing to the inbox):
``runs.py`` (``start``, ``trigger``, ``signal``, ``cancel``, ``terminate``), ``admin.py``
(``resume``, ``set_budget``, ``decide``), ``holds.py`` (``pause_agent``, ``unpause_agent``,
``agent_holds``), ``reading.py`` (``history``, ``state``, ``status``,
``liveness``, ``pending``, ``current_run``, ``result``), ``schedules.py`` (``add_schedule`` and
the rest of a schedule's life) and ``read_side.py`` (``view``, ``runs``, ``watch``,
``stream``). This module adds connecting and closing.

Clients never write run events: see ``base.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sojourn.broker.connection import Broker, ConnectOptions
from sojourn.schemas.config import Settings

from ..history.pending import PendingRun
from .admin import AdminControls
from .concurrency import ConcurrencyReads
from .forks import Forks
from .holds import AgentHoldControls
from .limits import LimitControls
from .read_side import ReadSide
from .runs import RunControl
from .schedules import Schedules
from .updates import Updates

__all__ = ["Client", "PendingRun"]


class Client(
    RunControl,
    AdminControls,
    AgentHoldControls,
    LimitControls,
    Schedules,
    ReadSide,
    Forks,
    Updates,
    ConcurrencyReads,
):
    """Talks to a sojourn deployment over NATS.

    Example:
        >>> async def main():                                         # doctest: +SKIP
        ...     async with await Client.connect() as client:
        ...         run_id = await client.start("greeter", {"name": "Ada"})
        ...         print(await client.result(run_id, timeout=30))
    """

    @classmethod
    async def connect(
        cls,
        nats: str | ConnectOptions | None = None,
        *,
        settings: Settings | None = None,
        speaks_for: Iterable[str] = (),
    ) -> Client:
        """Connect to ``nats`` (default ``$SOJOURN_NATS_URL`` or ``nats://127.0.0.1:4222``): a
        URL, with ``user:password@`` if the server wants them, or ``ConnectOptions`` (a creds
        file, TLS files). ``speaks_for``: see the attribute.

        Raises:
            BrokerUnavailable: no server answered.
            CredentialsError: the server refused the credentials, or a creds or TLS file
                cannot be used.
        """
        broker = await Broker.connect(nats, name="sojourn-client")
        return cls(broker, settings, owns_broker=True, speaks_for=speaks_for)

    async def close(self) -> None:
        if self._owns:
            await self.broker.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
