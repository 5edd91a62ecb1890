"""sojourn.broker: everything that talks to NATS JetStream.

The embedded ``nats-server`` launcher, the connection façade, stream/consumer setup, the fenced
event store, run leases, wakes and the agent registry. Imports only ``sojourn.schemas``.

An opaque façade: no nats-py type crosses it. Consumers and subscriptions hand out
``Delivery``, publishes answer ``PublishAck``, a direct get reads a ``StoredMessage``, header
names are in ``sojourn.broker.headers``, and ``BROKER_ERRORS`` is what to catch for "the broker
is the trouble".

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

from . import headers
from .auth import AuthUser, permissions_for, render_accounts
from .connection import BROKER_ERRORS, Broker, JetStreamError, PullConsumer
from .delivery import Delivery, NotADelivery, PublishAck, StoredMessage, Subscription
from .eventstore import Decision, EventStore
from .names import Names, validate_token
from .options import DEFAULT_URL, ConnectOptions, CredentialsError, resolve_url
from .progress import Progress, ProgressStore
from .registry import AgentRecord, AgentRegistry
from .server import EmbeddedServer, find_nats_server
from .topology import ensure_topology
from .wake import publish_wake

__all__ = [
    "BROKER_ERRORS",
    "DEFAULT_URL",
    "AgentRecord",
    "AgentRegistry",
    "AuthUser",
    "Broker",
    "ConnectOptions",
    "CredentialsError",
    "Decision",
    "Delivery",
    "EmbeddedServer",
    "EventStore",
    "JetStreamError",
    "Names",
    "NotADelivery",
    "Progress",
    "ProgressStore",
    "PublishAck",
    "PullConsumer",
    "StoredMessage",
    "Subscription",
    "ensure_topology",
    "find_nats_server",
    "headers",
    "permissions_for",
    "publish_wake",
    "render_accounts",
    "resolve_url",
    "validate_token",
]
