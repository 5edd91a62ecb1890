"""sojourn.broker: everything that talks to NATS JetStream.

The embedded ``nats-server`` launcher, the connection façade, stream/consumer setup, the fenced
event store, run leases, wakes and the agent registry. Imports only ``sojourn.schemas``.

Example:
    >>> import asyncio, tempfile
    >>> from sojourn.broker import Broker, EmbeddedServer
    >>> async def main() -> str:                                    # doctest: +SKIP
    ...     async with EmbeddedServer(store_dir=tempfile.mkdtemp(), port=0) as server:
    ...         broker = await Broker.connect(server.url)
    ...         version = broker.server_version
    ...         await broker.close()
    ...         return version
"""

from .auth import AuthUser, permissions_for, render_accounts
from .connection import (
    DEFAULT_URL,
    Broker,
    ConnectOptions,
    CredentialsError,
    JetStreamError,
    resolve_url,
)
from .eventstore import Decision, EventStore
from .leases import Lease, LeaseStore
from .names import Names, validate_token
from .registry import AgentRecord, AgentRegistry
from .server import EmbeddedServer, find_nats_server
from .topology import ensure_topology
from .wake import publish_wake

__all__ = [
    "DEFAULT_URL",
    "AgentRecord",
    "AgentRegistry",
    "AuthUser",
    "Broker",
    "ConnectOptions",
    "CredentialsError",
    "Decision",
    "EmbeddedServer",
    "EventStore",
    "JetStreamError",
    "Lease",
    "LeaseStore",
    "Names",
    "ensure_topology",
    "find_nats_server",
    "permissions_for",
    "publish_wake",
    "render_accounts",
    "resolve_url",
    "validate_token",
]
