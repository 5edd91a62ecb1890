"""sojourn.actors: write durable agents and run them.

Everything public is exported here (``__all__``); the modules behind it live in rooms by role
(``core``, ``agents``, ``history``, ``worker``, ``client``, ``ops``, ``integrations``;
docs/architecture.md) and may change. ``sojourn.actors.cli`` is the ``sojourn`` command.

Example:
    >>> import msgspec
    >>> from sojourn.actors import agent
    >>> class Greeting(msgspec.Struct):
    ...     name: str
    >>> def compose(name: str) -> str:
    ...     return f"Hello, {name}!"
    >>> @agent("greeter")
    ... async def greeter(ctx, req: Greeting) -> str:
    ...     return await ctx.step(compose, req.name)
    >>> greeter.name
    'greeter'
"""

from sojourn.schemas.concurrency import Concurrency
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import (
    BrokerUnavailable,
    CallbackKeysMissing,
    CallbackTokenExpired,
    CallbackTokenInvalid,
    ChildRunError,
    InvalidName,
    NondeterminismError,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    RetryableError,
    RunNotFound,
    SojournError,
    StepError,
    StepTimeout,
    TerminalError,
    UnknownAgent,
    UnknownLimit,
)
from sojourn.schemas.events import Budget, Usage
from sojourn.schemas.limits import Limit, LimitRecord
from sojourn.schemas.schedules import ScheduleAnswer, ScheduleRecord
from sojourn.schemas.updates import UpdateAnswer, UpdateRejectedError

from .agents.agent import Agent, agent
from .agents.callbacks import CallbackClaims, CallbackKeys
from .agents.children import ChildHandle
from .agents.context import (
    Context,
    GatherError,
    StepInfo,
    current_step,
    heartbeat,
    idempotency_headers,
)
from .agents.patterns import ApprovalDecision, ApprovalRefused, ApprovalTimeout, PollTimeout
from .agents.waits import Selected
from .client.base import TriggerRejected
from .client.client import Client, PendingRun
from .client.output import OutputChunk, OutputReader, read_output
from .client.reading import RunCancelledError, RunFailedError
from .client.runs import StartReceipt
from .core.cron import ScheduleError
from .core.retry import NOT_DONE, RetryPolicy, step
from .core.state import RunState, evolve, fold
from .ops.exposition import serve_metrics, stop_metrics
from .ops.watchdog import Watchdog
from .worker.app import load_app
from .worker.worker import Worker

__all__ = [
    "NOT_DONE",
    "Agent",
    "ApprovalDecision",
    "ApprovalRefused",
    "ApprovalTimeout",
    "BrokerUnavailable",
    "Budget",
    "CallbackClaims",
    "CallbackKeys",
    "CallbackKeysMissing",
    "CallbackTokenExpired",
    "CallbackTokenInvalid",
    "ChildHandle",
    "ChildRunError",
    "Client",
    "Concurrency",
    "Context",
    "GatherError",
    "InvalidName",
    "Limit",
    "LimitRecord",
    "NondeterminismError",
    "OutputChunk",
    "OutputReader",
    "PayloadTooLarge",
    "PendingRun",
    "PermissionDenied",
    "PollTimeout",
    "RateLimited",
    "RetryPolicy",
    "RetryableError",
    "RunCancelledError",
    "RunFailedError",
    "RunNotFound",
    "RunState",
    "ScheduleAnswer",
    "ScheduleError",
    "ScheduleRecord",
    "Selected",
    "Settings",
    "SojournError",
    "StartReceipt",
    "StepError",
    "StepInfo",
    "StepTimeout",
    "TerminalError",
    "TriggerRejected",
    "UnknownAgent",
    "UnknownLimit",
    "UpdateAnswer",
    "UpdateRejectedError",
    "Usage",
    "Watchdog",
    "Worker",
    "agent",
    "current_step",
    "evolve",
    "fold",
    "heartbeat",
    "idempotency_headers",
    "load_app",
    "read_output",
    "serve_metrics",
    "step",
    "stop_metrics",
]
